"""The training job with packed rows (the default) and with one episode per row
(``trainer.batching.pack_rows=false``): same episodes, same SFT and RL losses and gradient norms
(one minibatch per step, so both updates see the same episodes), fewer computed positions packed."""

from __future__ import annotations

import json
import sys

import pytest

SMOKE = ["trainer=smoke", "trainer.sft.steps=2", "trainer.rl.steps=2",
         "trainer.eval.heldout_tasks=2", "trainer.eval.every=0", "trainer.checkpoint.export=false",
         "rollout.group_size=4", "mesh=single", "advantage=reinforce_pp", "advantage.gamma=0.95",
         "loss=gspo", "trainer.rl.tasks_per_step=6", "sampler.max_slots=24",
         "trainer.batching.seq_buckets=[128,192,256,384,512]"]  # fmt: skip


def _train(argv, run, monkeypatch):
    from jaxrl_agents.cli import train as cli

    monkeypatch.setattr(sys, "argv", ["jaxrl-train", *SMOKE, f"run_dir={run}", *argv])
    cli.main()
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_packed_and_unpacked_jobs_train_alike(tmp_path, monkeypatch):
    packed = _train([], tmp_path / "packed", monkeypatch)
    flat = _train(["trainer.batching.pack_rows=false"], tmp_path / "flat", monkeypatch)
    stage = lambda rows, s: [r for r in rows if r["stage"] == s]
    for a, b in zip(stage(packed, "sft"), stage(flat, "sft"), strict=True):
        assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    rl_p, rl_f = stage(packed, "rl"), stage(flat, "rl")
    assert len(rl_p) == len(rl_f) == 2
    for a, b in zip(rl_p, rl_f, strict=True):
        assert a["adv_abs"] > 0
        for key in ("reward", "adv_abs", "loss", "pg_loss", "grad_norm", "ratio_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["real_frac"] > b["real_frac"]
