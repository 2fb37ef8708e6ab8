"""``rollout.agent``: an agent function written against the OpenAI API trains and evaluates
through the real entry points, in place of the built-in episode loop."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from train_cli import FAST, main_in_process  # noqa: E402

AGENT = "rollout.agent=jaxrl_agents.serve.examples:calculator_agent"


def test_eval_through_an_agent_function_with_the_scripted_oracle(tmp_path, monkeypatch):
    """The scripted oracle answers the agent's requests through the server: the agent runs the
    calculator itself and the env judges its final answer, so every task is solved."""
    from jaxrl_agents.cli import eval as cli

    out = tmp_path / "eval"
    argv = ["jaxrl-eval", AGENT, "policies=[scripted:oracle]", "env=calculator", "tasks=6"]
    monkeypatch.setattr(sys, "argv", [*argv, f"out={out}"])
    cli.main()
    stats = json.loads((out / "report.json").read_text())["policies"]["scripted:oracle"]
    assert stats["success"] == 1.0, stats
    assert set(stats["end_reasons"]) == {"answered"}, stats["end_reasons"]
    lines = (out / "trajectories_scripted_oracle.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    calls = [c for t in first["turns"] for c in t.get("tool_calls") or []]
    assert calls and calls[0]["name"] == "calculator", first["turns"]


def test_train_through_an_agent_function(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert main_in_process([*FAST, AGENT, f"run_dir={run}"], monkeypatch) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "loss" in r]
    assert [r["step"] for r in rl] == [1, 2], rows
    # The update recomputes the captured ids' log-probs: they are what the sampler drew.
    assert all(abs(r["logprob_diff"]) < 1e-3 and abs(r["ratio_mean"] - 1) < 1e-3 for r in rl), rl
    samples = (run / "trajectories" / "samples_step000001.jsonl").read_text().splitlines()
    assert len(samples) == 4  # tasks_per_step 2 x group_size 2
    for line in samples:
        t = json.loads(line)
        assert len(t["token_ids"]) == len(t["loss_mask"]) == len(t["logprobs"])
        assert sum(t["loss_mask"][: t["prompt_len"]]) == 0 and sum(t["loss_mask"]) >= 1
    assert json.loads((run / "summary.json").read_text())["rl_heldout_success"] is not None


@pytest.mark.parametrize(
    "agent, needle",
    [
        ("jaxrl_agents.serve.examples:nope", "cannot import it"),
        ("jaxrl_agents.serve.examples:run_tool", "is not an async function"),
    ],
)
def test_a_bad_agent_path_stops_in_one_line(agent, needle, tmp_path, capsys, monkeypatch):
    code = main_in_process([*FAST, f"rollout.agent={agent}", f"run_dir={tmp_path}"], monkeypatch)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1, err
    assert f"rollout.agent={agent!r}" in err[0] and needle in err[0], err[0]
