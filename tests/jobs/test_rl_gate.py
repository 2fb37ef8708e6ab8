"""``trainer.rl.start_min_success``: a policy that solves too few validation tasks after SFT does
not go on to RL. The job saves its SFT snapshot, records the numbers and stops in one line naming
both; rerunning the folder with a lower bar continues into RL from that snapshot. Through
``jaxrl-train``'s ``main()`` in-process, as in ``train_cli``."""

from __future__ import annotations

import json

from train_cli import FAST
from train_cli import main_in_process as _main

from jaxrl_agents.jobs.restore import kept_steps


def _rows(run, stage):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r.get("stage") == stage]


def test_gate_stops_before_rl_and_a_lower_bar_resumes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "gated"
    code = _main([*FAST, f"run_dir={run}", "trainer.rl.start_min_success=1.0"], monkeypatch)
    err = capsys.readouterr().err
    gate = json.loads((run / "stages.json").read_text())["rl_gate"]
    # 4 SFT steps of a fresh tiny model solve none of the validation tasks
    assert gate == {"min_success": 1.0, "validation_success": 0.0, "passed": False}
    assert code == 1, err[-600:]
    assert "solves 0 of the 2 validation tasks (0.000, greedy)" in err
    assert "below trainer.rl.start_min_success=1.0: RL not run" in err
    assert not (run / "summary.json").exists()
    assert _rows(run, "rl") == []  # no RL step ran
    assert kept_steps(run, ("sft",)) == ([4],)  # the SFT result is kept for a rerun or jaxrl-eval

    # The same folder with the gate off: no config complaint, RL starts from the snapshot (no
    # SFT step again) and warns that the start solves nothing.
    assert _main([*FAST, f"run_dir={run}", "trainer.rl.start_min_success=0"], monkeypatch) == 0
    out, err = capsys.readouterr()
    assert "resuming from checkpoint: stage=rl step=0" in out
    assert "WARNING: the policy RL would start from solves 0 of the 2" in err
    assert _rows(run, "sft").count(4) == 1 and _rows(run, "rl") == [1, 2]
    stages = json.loads((run / "stages.json").read_text())
    assert stages["rl_gate"] == {"min_success": 0.0, "validation_success": 0.0, "passed": True}
    assert (run / "summary.json").exists()


def test_gate_value_is_checked(tmp_path, monkeypatch, capsys):
    code = _main([*FAST, f"run_dir={tmp_path / 'x'}", "trainer.rl.start_min_success=1.5"],
                 monkeypatch)  # fmt: skip
    assert code not in (0, None)
    err = capsys.readouterr().err
    assert "trainer.rl.start_min_success: start_min_success=1.5 must lie in [0, 1]" in err
    assert not (tmp_path / "x" / "checkpoints").exists()  # stopped before anything was built


def test_no_gate_without_rl(tmp_path, monkeypatch):
    run = tmp_path / "sft_only"  # trainer.rl.steps=0: nothing to gate, the job finishes
    argv = [*FAST, f"run_dir={run}", "trainer.rl.steps=0", "trainer.rl.start_min_success=1.0"]
    assert _main(argv, monkeypatch) == 0
    assert (run / "summary.json").exists()
    assert "rl_gate" not in json.loads((run / "stages.json").read_text())
