"""Every built-in env runs on its own preset: ``jaxrl-eval policies=[scripted:oracle] env=E``
solves (almost) every held-out task with the limits the preset sets, through the real entry
point, and an env whose limits are cut too far stops training at start-up in one line."""

from __future__ import annotations

import json
import sys

import pytest

ENVS = ["calculator", "sql", "research", "travel", "mcp"]
TASKS = {"mcp": 8}  # each mcp episode starts and stops its server (about a second)


@pytest.mark.parametrize("env", ENVS)
def test_scripted_oracle_solves_heldout_on_env_defaults(env, tmp_path, monkeypatch):
    from jaxrl_agents.cli import eval as cli

    out = tmp_path / "eval"
    argv = [
        "jaxrl-eval",
        "policies=[scripted:oracle]",
        f"env={env}",
        f"tasks={TASKS.get(env, 40)}",
        f"out={out}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    data = json.loads((out / "report.json").read_text())
    stats = data["policies"]["scripted:oracle"]
    assert stats["success"] >= 0.95, (env, stats["success"], stats.get("end_reasons"))
    assert set(stats["end_reasons"]) == {"answered"}, stats["end_reasons"]


def test_limits_too_small_for_the_env_stop_training_in_one_line(tmp_path, capsys, monkeypatch):
    from jaxrl_agents.cli import train as cli

    argv = ["jaxrl-train", "env=sql", "rollout.max_total_tokens=512", "mesh=single",
            "trainer=smoke", f"run_dir={tmp_path}/run"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        cli.main()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    assert "rollout.max_total_tokens=512 cannot hold SqlEnv's oracle episodes" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_timed_out_tool_does_not_size_the_limits(monkeypatch):
    """The oracle retries a call that timed out (one more turn); the limits the env needs are
    measured on the episodes without a timeout."""
    import asyncio

    from jaxrl_agents.envs.tools import ToolBox
    from jaxrl_agents.jobs.build import build_chat, check_oracle_limits, resolve_env
    from jaxrl_agents.jobs.config import ChatSpec, EnvSpec
    from jaxrl_agents.rollout import RolloutConfig
    from jaxrl_agents.types import ToolErrorKind, ToolResult

    real, boxes = ToolBox.execute, []

    async def execute(self, call, **kw):
        if id(self) not in boxes:
            boxes.append(id(self))
        if boxes.index(id(self)) == 0 and call.name == "book_hotel":  # the first episode only
            return ToolResult(call, "Error: book_hotel timed out after 10 s", ToolErrorKind.TIMEOUT)
        return await real(self, call, **kw)

    monkeypatch.setattr(ToolBox, "execute", execute)
    chat, env = build_chat(ChatSpec(template="qwen2.5")), resolve_env(EnvSpec(name="travel"))
    rollout = RolloutConfig(
        group_size=1, max_turns=4, max_new_tokens=1 << 12, max_total_tokens=1 << 14
    )
    need = asyncio.run(check_oracle_limits(chat, env, {}, rollout, n=3))
    assert need["turns"] == 4 and len(boxes) == 3
