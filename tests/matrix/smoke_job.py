"""Shared smoke job of the path-matrix tests (test_smoke_*.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SMOKE = ["trainer=smoke", "trainer.sft.steps=2", "trainer.sft.batch_size=4", "trainer.rl.steps=2",
         "trainer.eval.heldout_tasks=2", "trainer.eval.every=0", "trainer.checkpoint.export=false",
         "sampler.max_slots=8", "rollout.group_size=2", "mesh=single"]  # fmt: skip


def files(*groups: str) -> list[tuple[str, str]]:
    """Every config file of ``groups``, as (group, option name)."""
    return [(g, p.stem) for g in groups for p in sorted((CONFIGS / g).glob("*.yaml"))]


def paired_jobs(first: str, second: str, needs: dict[str, str] | None = None) -> list[list[str]]:
    """Jobs covering every file of two groups: one file of ``first`` with one of ``second`` (pairs
    in folder order; ``needs[a] = b`` pairs them first, for a file that needs a particular one),
    the files left over with the other group's default. A job's compile time is most of its
    cost, so pairs halve the matrix's time and still run every file."""
    a = [n for _, n in files(first)]
    b = [n for _, n in files(second)]
    jobs = []
    for x, y in (needs or {}).items():
        if x in a and y in b:
            a.remove(x), b.remove(y)
            jobs.append([f"{first}={x}", f"{second}={y}"])
    for k in range(max(len(a), len(b))):
        job = [f"{first}={a[k]}"] if k < len(a) else []
        jobs.append(job + ([f"{second}={b[k]}"] if k < len(b) else []))
    return jobs


def smoke_job(overrides: list[str], tmp_path, monkeypatch) -> None:
    """The smoke job with ``overrides`` (e.g. ``["env=sql", "reward=dense"]``), checked."""
    from flax import nnx

    from jaxrl_agents.cli import train as cli
    from jaxrl_agents.jobs.build import build_model, build_tokenizer
    from jaxrl_agents.jobs.restore import load_policy, load_run_config
    from jaxrl_agents.types import EndReason, read_jsonl

    run = tmp_path / "run"
    if "reward=judged" in overrides:  # its judge term needs the model judge built
        overrides = [*overrides, "judge.enabled=true", "judge.max_new_tokens=8"]
    monkeypatch.setattr(sys, "argv", ["jaxrl-train", *SMOKE, *overrides, f"run_dir={run}"])
    try:
        cli.main()
    except SystemExit as e:
        pytest.fail(f"{' '.join(overrides)}: exit {e.code}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        for key in ("loss", "grad_norm", "reward"):
            assert math.isfinite(r[key]), (key, r)
    cfg = load_run_config(run)
    fresh = build_model(
        cfg.model, vocab_size=len(build_tokenizer(cfg.chat, cfg.model.path)), seed=cfg.seed
    )
    trained, _, _ = load_policy(run)
    a = nnx.to_flat_state(nnx.state(fresh, nnx.Param))
    b = dict(nnx.to_flat_state(nnx.state(trained, nnx.Param)))
    diffs = [float(np.max(np.abs(np.asarray(b[k].get_value()) - np.asarray(v.get_value()))))
             for k, v in a]  # fmt: skip
    assert max(diffs) > 0, "parameters did not change"
    assert all(np.isfinite(np.asarray(v.get_value())).all() for _, v in b.items())
    trajs = [t for f in sorted((run / "trajectories").glob("*.jsonl")) for t in read_jsonl(f)]
    assert trajs and all(isinstance(t.end_reason, EndReason) for t in trajs)
