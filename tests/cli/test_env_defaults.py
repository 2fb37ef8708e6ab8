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
