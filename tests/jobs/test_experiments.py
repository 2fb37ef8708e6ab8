"""Every ``experiment=<name>`` preset stays valid: a fast variant (a few steps of SFT and RL)
runs through ``jaxrl-train`` in process, on the preset's env, annotator defect and reward.

``travel``'s episodes need 2048-token rows (a minute of compiling and stepping on 2 cores), so in
the suite its preset is checked up to the first compile: composed, built, and its oracle run
through the start-up checks (limits, chat round trip); ``python scripts/run_experiment.py travel
--quick`` runs its fast variant."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from run_experiment import QUICK  # noqa: E402

PRESETS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


def test_presets_exist():
    assert {"research", "travel", "sql"} <= set(PRESETS)


@pytest.mark.parametrize("name", [p for p in PRESETS if p != "travel"])
def test_experiment_preset_runs_a_fast_variant(name, tmp_path, monkeypatch):
    from jaxrl_agents.cli import train as cli

    run = tmp_path / "run"
    argv = ["jaxrl-train", f"experiment={name}", f"run_dir={run}", "mesh=single", *QUICK]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    cfg = json.loads((run / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert cfg["name"] == f"exp_{name}" and cfg["env"]["name"] == name
    assert any(v > 0 for v in cfg["env"]["oracle"].values())  # the annotator defect is on
    assert summary["rl_heldout_success"] is not None
    rl = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rl if r["stage"] == "rl"] == [1, 2]


def test_travel_preset_passes_the_start_up_checks():
    import asyncio

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.build import build_train, check_oracle_fits

    cfg = to_run_config(compose("config", ["experiment=travel", "mesh=single", *QUICK]))
    assert cfg.env.name == "travel" and cfg.env.oracle == {"slip_prob": 0.4}
    need = asyncio.run(check_oracle_fits(build_train(cfg)))
    assert need["turns"] <= cfg.rollout.max_turns
