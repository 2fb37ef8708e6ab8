"""Two local CPU processes under ``jax.distributed`` (gloo): the whole job (SFT, RL, held-out
evaluation) runs with each process doing its share of the episodes, identical weights everywhere,
and the one-process result (the same SFT loss and token count, the same RL metrics, the same final
weights: so the train step over the global mesh matches one process with the whole batch)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shares_of_work(monkeypatch):
    import jax

    from jaxrl_agents import distributed as D

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert D.even_share(4, "trainer.rl.tasks_per_step") == slice(2, 4)
    assert [D.uneven_share(n) for n in (3, 1)] == [slice(2, 3), slice(1, 1)]
    with pytest.raises(ValueError, match=r"trainer.rl.tasks_per_step=3 .* processes \(2\)"):
        D.even_share(3, "trainer.rl.tasks_per_step")


# -- the whole job -------------------------------------------------------------------------------

RUN_WORKER = Path(__file__).with_name("multihost_run_worker.py")
# The smoke trainer cut to 1 SFT step + 2 RL steps. reinforce_pp with gamma < 1 whitens over every
# sampled token of the global batch, and token-mean divides by the global token count, so a
# process that computed either from its own rows alone would not match the one-process run.
JOB = [
    "trainer=smoke",
    "trainer.sft.steps=1",
    "trainer.sft.batch_size=4",
    "trainer.sft.examples=8",
    "trainer.rl.steps=2",
    "trainer.rl.tasks_per_step=2",
    "trainer.eval.heldout_tasks=3",
    "trainer.eval.every=0",
    "trainer.checkpoint.every=2",
    "trainer.checkpoint.export=false",
    "trainer.batching.seq_buckets=[256]",
    "rollout.group_size=2",
    "sampler.max_slots=8",
    "advantage=reinforce_pp",
    "advantage.gamma=0.95",
    "loss.agg_mode=token-mean",
]


def _launch(nproc: int, out: Path, port: str) -> list[tuple[subprocess.Popen, Path]]:
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    for i in range(nproc):
        log = out / f"proc{i}.log"  # a file, not a pipe: a full pipe would stall the collectives
        with open(log, "w") as f:
            cmd = [sys.executable, str(RUN_WORKER), str(i), str(nproc), port, str(out), *JOB]
            procs.append((subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), log))
    return procs


@pytest.fixture(scope="module")
def job_runs(tmp_path_factory):
    """The same job with two processes and with one, run side by side."""
    root = tmp_path_factory.mktemp("job")
    t0 = time.time()
    procs = _launch(2, root / "two", str(_free_port())) + _launch(1, root / "one", "0")
    try:
        for p, log in procs:
            p.wait(timeout=300)
            assert p.returncode == 0, log.read_text()[-4000:]
    finally:
        for p, _ in procs:
            p.kill()
    print(f"three job processes: {time.time() - t0:.1f}s")

    def load(out: Path, i: int):
        return json.loads((out / f"proc{i}.json").read_text()), np.load(out / f"proc{i}.npz")

    return root, [load(root / "two", i) for i in range(2)], load(root / "one", 0)


def _rl_calls(rec):
    return [c for c in rec["calls"] if c["engine"] != "ScriptedEngine" and c["group_size"] == 2]


def _eval_calls(rec):
    return [c for c in rec["calls"] if c["engine"] != "ScriptedEngine" and c["group_size"] == 1]


def test_each_process_runs_its_share_of_episodes(job_runs):
    _, two, (one, _) = job_runs
    (p0, _), (p1, _) = two
    # RL: each process ran 1 of the step's 2 tasks (a whole group of 2 episodes), the first
    # process the first task; together exactly the one-process run's tasks.
    ref = _rl_calls(one)
    assert [len(c["tasks"]) for c in ref] == [2, 2]
    for step, (a, b, r) in enumerate(zip(_rl_calls(p0), _rl_calls(p1), ref, strict=True)):
        assert (a["episodes"], b["episodes"]) == (2, 2), step
        assert a["tasks"] + b["tasks"] == r["tasks"], step
    # Held-out (3 tasks, after SFT and at the end): split 2 + 1, every task run once.
    for a, b, r in zip(_eval_calls(p0), _eval_calls(p1), _eval_calls(one), strict=True):
        assert (len(a["tasks"]), len(b["tasks"])) == (2, 1)
        assert a["tasks"] + b["tasks"] == r["tasks"]


def test_processes_end_with_identical_weights_and_one_summary(job_runs):
    root, two, _ = job_runs
    (p0, w0), (p1, w1) = two
    assert p0["pushes"] == p1["pushes"] and sorted(w0.files) == sorted(w1.files)
    for k in w0.files:  # every push to the sampler, bit for bit
        np.testing.assert_array_equal(w0[k], w1[k], err_msg=k)
    # Same summary on both processes (held-out episodes all-gathered); only process 0 writes it.
    same = lambda s: {k: v for k, v in s.items() if k not in ("wall_s", "learning_curve")}
    assert same(p0["summary"]) == same(p1["summary"])
    assert p0["summary"]["heldout_tasks"] == 3
    run = root / "two" / "run"
    assert same(json.loads((run / "summary.json").read_text())) == same(p0["summary"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows] == [
        ("sft", 1),
        ("eval", 0),
        ("rl", 1),
        ("rl", 2),
    ]


def test_two_processes_train_like_one(job_runs):
    """Same global tasks and per-episode seeds: the same episodes, hence (within fp) the same
    updates, as long as no sampled token flips between the runs' slightly different floats."""
    root, two, (_, w_one) = job_runs
    (_, w_two), _ = two
    assert sorted(w_two.files) == sorted(w_one.files)
    for k in w_one.files:
        np.testing.assert_allclose(w_two[k], w_one[k], rtol=1e-4, atol=1e-5, err_msg=k)
    rows = lambda run, stage: [
        r
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["stage"] == stage
    ]
    two_run, one_run = root / "two" / "run", root / "one" / "run"
    # SFT: the processes' rows make up the one global batch (same token count, not twice it).
    ((a,), (b,)) = rows(two_run, "sft"), rows(one_run, "sft")
    assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for a, b in zip(rows(two_run, "rl"), rows(one_run, "rl"), strict=True):
        assert a["adv_abs"] > 0  # the update is not trivially zero
        for key in ("reward", "success", "adv_abs", "loss", "grad_norm", "truncated"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
