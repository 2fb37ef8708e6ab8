"""The ``chat`` group through the user's commands: ``jaxrl-eval`` with a Qwen3- and a
Llama-3.1-templated tokenizer folder solves the oracle's tasks, and a template / tool-parser
mismatch stops ``jaxrl-train`` at start-up in one line naming both, with nothing written."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.mark.parametrize("family", ["qwen3", "llama3.1"])
def test_eval_scripted_oracle_with_a_real_template(family, family_tokenizer, tmp_path,
                                                   monkeypatch):  # fmt: skip
    from jaxrl_agents.cli import eval as cli

    folder, out = family_tokenizer(family), tmp_path / "eval"
    # Llama 3.1's template puts a longer tool preamble in the prompt than the calculator
    # preset's 384-token budget holds (the eval says so in one line: see the next test)
    argv = ["jaxrl-eval", "policies=[scripted:oracle]", "env=calculator", "tasks=20",
            f"chat.tokenizer={folder}", f"out={out}", "rollout.max_total_tokens=640",
            "sampler.max_seq_len=640"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    stats = json.loads((out / "report.json").read_text())["policies"]["scripted:oracle"]
    assert stats["success"] == 1.0, stats
    assert set(stats["end_reasons"]) == {"answered"}, stats["end_reasons"]
    assert stats["mean_tool_calls"] >= 1.0, stats
    trajs = [json.loads(x) for x in (out / "trajectories_scripted_oracle.jsonl").open()]
    first_turns = [t["turns"][0]["text"] for t in trajs]
    if family == "llama3.1":  # a bare JSON call, parsed as one
        assert all(x.startswith('{"name": "calculator", "parameters": ') for x in first_turns)
    else:  # Qwen3 thinks (an empty block) before its <tool_call>
        assert all(x.startswith("<think>\n\n</think>\n\n<tool_call>") for x in first_turns)


def test_eval_limits_too_small_for_the_template_fail_in_one_line(family_tokenizer, tmp_path,
                                                                 capsys, monkeypatch):  # fmt: skip
    from jaxrl_agents.cli import eval as cli

    argv = [
        "jaxrl-eval",
        "policies=[scripted:oracle]",
        "env=calculator",
        "tasks=4",
        f"chat.tokenizer={family_tokenizer('llama3.1')}",
        f"out={tmp_path / 'eval'}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1, err
    assert "rollout.max_total_tokens=384 cannot hold CalculatorEnv's oracle episodes" in err[0]


def test_template_parser_mismatch_stops_training_in_one_line(family_tokenizer, tmp_path, capsys,
                                                             monkeypatch):  # fmt: skip
    from jaxrl_agents.cli import train as cli

    folder, run = family_tokenizer("llama3.1"), tmp_path / "run"
    argv = ["jaxrl-train", f"chat.tokenizer={folder}", "chat.tool_parser=hermes", "mesh=single",
            "trainer=smoke", f"run_dir={run}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    assert f"chat.template=(the tokenizer's own, {folder})" in lines[0], lines[0]
    assert "chat.tool_parser=hermes do not match" in lines[0]
    assert "set chat.tool_parser=llama3_json" in lines[0]
    # only Hydra's own job log: no config record, checkpoint or metrics
    assert {p.name for p in run.iterdir()} <= {"train.log", ".hydra"}, list(run.iterdir())
