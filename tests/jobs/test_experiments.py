"""Every ``experiment=<name>`` preset stays valid up to the first compile: composed through the
CLI's config, built, and its oracle (with the annotator defect on) run through the start-up checks
(limits, chat round trip). The fast variants that train a few steps (research 23 s, sql 15 s,
travel 66 s on 2 cores) would put the suite over its time budget; ``python
scripts/run_experiment.py <name> --quick --seeds 0`` runs them."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from run_experiment import QUICK  # noqa: E402

PRESETS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))


def test_presets_exist():
    assert {"research", "travel", "sql"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_passes_the_start_up_checks(name):
    import asyncio

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.build import build_train, check_oracle_fits

    cfg = to_run_config(compose("config", [f"experiment={name}", "mesh=single", *QUICK]))
    assert cfg.name == f"exp_{name}" and cfg.env.name == name
    assert any(v > 0 for v in cfg.env.oracle.values())  # the annotator defect is on
    need = asyncio.run(check_oracle_fits(build_train(cfg)))
    assert need["turns"] <= cfg.rollout.max_turns
