"""Sweeps and multi-process jobs through a real one-node SLURM cluster (``conftest.py`` starts it).

* a two-job sweep (``jaxrl-train -m hydra/launcher=slurm_local seed=0,1``): each job trains in
  its own folder; one of them is requeued mid-run (``scontrol requeue``, what SLURM does to a
  preempted job) and resumes from its checkpoint, the other runs undisturbed;
* a job cancelled mid-run (``scancel``) and submitted again resumes from its checkpoint;
* ``srun --ntasks=2 jaxrl-train``: the two processes initialise ``jax.distributed`` from SLURM's
  environment alone and train like one process with all the devices; process 0 alone writes the
  run folder;
* an sbatch script of two tasks that starts the job without ``srun`` stops in one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs .[slurm]")

TESTS = Path(__file__).resolve().parents[1]
JAXRL_TRAIN = str(Path(sys.executable).with_name("jaxrl-train"))


def _load(path: Path) -> ModuleType:
    """A module of the suite by path (the test folders are not packages)."""
    spec = importlib.util.spec_from_file_location(f"_slurm_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The smoke job, cut down: 2 SFT steps, 20 short RL steps, a checkpoint after SFT and after every RL
# step, no mid-RL evals. The RL steps leave time to interrupt it after its first checkpoint: a
# job SLURM stops runs on for KillWait (2 s here) seconds, submitit ignoring the SIGTERM.
JOB = [
    *_load(TESTS / "jobs" / "train_cli.py").FAST,
    "trainer.sft.steps=2",
    "trainer.rl.steps=20",
    "trainer.eval.every=0",
    "trainer.batching.seq_buckets=[256]",
    "sampler.max_slots=8",
]
# Every row an uninterrupted run of JOB logs, in order.
ROWS = [("sft", 2), ("eval", 0), *[("rl", i) for i in range(1, 21)]]
# The two-process test's job (tests/training/test_multihost.py) and what it asserts.
MULTIHOST = _load(TESTS / "training" / "test_multihost.py")


def _job_env(slurm_env: dict[str, str], devices: int = 1) -> dict[str, str]:
    flags = os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"].replace(
        "device_count=1", f"device_count={devices}"
    )
    return {**slurm_env, "XLA_FLAGS": flags, "PYTHONUNBUFFERED": "1"}


def _sweep(sweep_dir: Path, seeds: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``jaxrl-train -m`` through the SLURM launcher: one array task per seed (not waited for)."""
    cmd = [JAXRL_TRAIN, "-m", "hydra/launcher=slurm_local", f"seed={seeds}", *JOB,
           f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)


def _wait(what: str, ready: Callable[[], bool], timeout: float = 240) -> None:
    end = time.time() + timeout
    while not ready():
        if time.time() > end:
            raise TimeoutError(f"{what}: not after {timeout}s")
        time.sleep(0.25)


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    try:
        proc.wait(timeout=timeout)
    finally:
        proc.kill()
    assert proc.returncode == 0, log.read_text()[-4000:]


def _runs(sweep_dir: Path, seed: int) -> list[Path]:
    """The run folder of the sweep's job of ``seed`` (none before the job has started)."""
    return [p for p in sweep_dir.glob("*") if f",seed={seed}," in f",{p.name},"]


def _run_dir(sweep_dir: Path, seed: int) -> Path:
    (run,) = _runs(sweep_dir, seed)
    return run


def _job_ids(sweep_dir: Path) -> list[str]:
    """The sweep's SLURM job ids, in the sweep's order: ``<array>_<task>``, or ``<id>`` for a
    sweep of one job."""
    folder = sweep_dir / ".submitit"
    if not folder.is_dir():
        return []
    ids = [p.name for p in folder.iterdir() if (p / f"{p.name}_submitted.pkl").exists()]
    return sorted(ids, key=lambda j: tuple(map(int, j.split("_"))))


def _started(sweep_dir: Path, seed: int) -> bool:
    """The job of ``seed`` has written its first checkpoint."""
    runs = _runs(sweep_dir, seed)
    return bool(runs) and _checkpointed(runs[0])


def _checkpointed(run: Path) -> bool:
    latest = run / "checkpoints" / "latest"
    return latest.is_dir() and any(p.name.isdigit() for p in latest.iterdir())


def _rows(run: Path) -> list[tuple[str, int]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(r["stage"], r["step"]) for r in map(json.loads, lines)]


def _job_log(sweep_dir: Path, job_id: str) -> str:
    return (sweep_dir / ".submitit" / job_id / f"{job_id}_0_log.out").read_text()


def _state(job_id: str, env: dict[str, str]) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env,
                         capture_output=True, text=True).stdout  # fmt: skip
    return out.strip()


def _release(job_id: str, env: dict[str, str]) -> None:
    """Start a requeued job now: SLURM holds a requeued batch job back for about two minutes
    (reason BeginTime) before it is eligible again."""
    _wait(f"{job_id} back in the queue", lambda: _state(job_id, env) == "PENDING", 60)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                   check=True)  # fmt: skip


def _restarts(job_id: str, env: dict[str, str]) -> int:
    show = subprocess.run(["scontrol", "show", "job", job_id], env=env, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    return int(re.search(r"Restarts=(\d+)", show).group(1))


def test_sweep_jobs_train_in_their_folders_and_resume_when_requeued(slurm_env, tmp_path):
    """seed=0 is requeued by SLURM (``scontrol requeue``: what a preemption with
    PreemptMode=REQUEUE does); seed=1 gets SIGUSR2 (submitit's preemption / time-limit signal),
    on which submitit requeues the job itself. Both come back and resume from their checkpoints;
    the sweep command returns once both have finished."""
    env, sweep_dir, log = _job_env(slurm_env), tmp_path / "sweep", tmp_path / "sweep.log"
    t0 = time.time()
    proc = _sweep(sweep_dir, "0,1", env, log)
    try:
        _wait("two array tasks", lambda: len(_job_ids(sweep_dir)) == 2)
        jobs = _job_ids(sweep_dir)
        for seed, job in enumerate(jobs):
            _wait(f"seed={seed}'s first checkpoint", lambda s=seed: _started(sweep_dir, s))
            if seed == 0:
                subprocess.run(["scontrol", "requeue", job], env=env, check=True)
            else:
                subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
        for job in jobs:
            _release(job, env)
        _finish(proc, log)
    finally:
        proc.kill()
    print(f"sweep of 2 jobs, both requeued: {time.time() - t0:.1f}s")

    for seed, job in enumerate(jobs):  # each job in its own folder, finished once
        run = _run_dir(sweep_dir, seed)
        assert json.loads((run / "summary.json").read_text())["heldout_tasks"] == 2
        assert _rows(run) == ROWS, run  # the rows continue after the requeue, none twice
        assert _restarts(job, env) == 1
        assert "resuming from checkpoint" in _job_log(sweep_dir, job)
    submitit_requeue = _job_log(sweep_dir, jobs[1])
    assert "this job is preempted" in submitit_requeue and "Requeued job" in submitit_requeue


def test_cancelled_job_resumes_when_submitted_again(slurm_env, tmp_path):
    """A one-job sweep cancelled after its first checkpoint (its waiting command stopped, as
    with Ctrl-C), then the same command again: the job resumes and completes the rows."""
    env, sweep_dir = _job_env(slurm_env), tmp_path / "sweep"
    t0 = time.time()
    first = _sweep(sweep_dir, "2", env, tmp_path / "first.log")
    try:
        _wait("the job's id", lambda: len(_job_ids(sweep_dir)) == 1)
        (job,) = _job_ids(sweep_dir)
        _wait("the job's first checkpoint", lambda: _started(sweep_dir, 2))
        subprocess.run(["scancel", job], env=env, check=True)
        _wait("the cancelled job to leave the queue", lambda: not _state(job, env), 60)
    finally:
        first.kill()  # it would wait on the cancelled job (no sacct here to say it ended)
        first.wait()
    run = _run_dir(sweep_dir, 2)
    assert not (run / "summary.json").exists()
    cut = _rows(run)
    assert cut and cut == ROWS[: len(cut)] and len(cut) < len(ROWS), cut

    log = tmp_path / "again.log"
    _finish(_sweep(sweep_dir, "2", env, log), log)
    print(f"cancelled and submitted again: {time.time() - t0:.1f}s")
    again = [j for j in _job_ids(sweep_dir) if j != job]
    assert len(again) == 1, _job_ids(sweep_dir)
    assert "resuming from checkpoint" in _job_log(sweep_dir, again[0])
    assert _rows(run) == ROWS
    assert json.loads((run / "summary.json").read_text())["heldout_tasks"] == 2


def test_srun_two_tasks_train_like_one_process(slurm_env, tmp_path):
    """Two processes of two (simulated) devices each, started by ``srun`` with no coordinator
    flags, against one process with the four devices: the same global mesh."""
    t0 = time.time()
    two, one = tmp_path / "two", tmp_path / "one"
    srun = ["srun", "--ntasks=2", "--cpus-per-task=1", "--label", "--kill-on-bad-exit=1"]
    with open(tmp_path / "two.log", "w") as f2, open(tmp_path / "one.log", "w") as f1:
        procs = [
            subprocess.Popen([*srun, JAXRL_TRAIN, *MULTIHOST.JOB, f"run_dir={two}"],
                             env=_job_env(slurm_env, 2), stdout=f2, stderr=subprocess.STDOUT),
            subprocess.Popen([JAXRL_TRAIN, *MULTIHOST.JOB, f"run_dir={one}"],
                             env=_job_env(slurm_env, 4), stdout=f1, stderr=subprocess.STDOUT),
        ]  # fmt: skip
        try:
            for p, name in zip(procs, ("two", "one"), strict=True):
                p.wait(timeout=300)
                assert p.returncode == 0, (tmp_path / f"{name}.log").read_text()[-4000:]
        finally:
            for p in procs:
                p.kill()
    print(f"srun --ntasks=2 and the one-process run: {time.time() - t0:.1f}s")

    out = (tmp_path / "two.log").read_text()
    for task in (0, 1):  # both processes ran the job, over the 4 devices of both
        assert re.search(rf"^{task}: run folder: ", out, re.M), out[-3000:]
    rows = lambda run, stage: [r for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                               .splitlines()) if r["stage"] == stage]  # fmt: skip
    # Written once (by process 0): one row per step, the two-process test's rows.
    assert _rows(two) == [("sft", 1), ("eval", 0), ("rl", 1), ("rl", 2)]
    ckpts = sorted(p.name for p in (two / "checkpoints" / "latest").iterdir() if p.name.isdigit())
    assert ckpts == sorted(p.name for p in (one / "checkpoints" / "latest").iterdir()
                           if p.name.isdigit())  # fmt: skip
    same = lambda s: {k: v for k, v in s.items() if k not in ("wall_s", "learning_curve")}
    summary = lambda run: same(json.loads((run / "summary.json").read_text()))
    s_two, s_one = summary(two), summary(one)
    env_two, env_one = s_two.pop("environment"), s_one.pop("environment")
    assert (env_two["processes"], env_one["processes"]) == (2, 1)
    assert env_two["devices"] == env_one["devices"] == "4 x cpu"
    assert s_two == s_one
    # The global batch, not a process's share: same SFT tokens and loss, same RL updates.
    ((a,), (b,)) = rows(two, "sft"), rows(one, "sft")
    assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    for a, b in zip(rows(two, "rl"), rows(one, "rl"), strict=True):
        assert a["adv_abs"] > 0
        for key in ("reward", "success", "adv_abs", "loss", "grad_norm", "truncated"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_sbatch_of_two_tasks_without_srun_stops_in_one_line(slurm_env, tmp_path):
    """The job started by an sbatch script of two tasks itself (not through ``srun``) would wait
    for a second process that never comes: it stops at once, saying to use ``srun``."""
    out = tmp_path / "job.out"
    cmd = shlex.join([JAXRL_TRAIN, *MULTIHOST.JOB, f"run_dir={tmp_path / 'run'}"])
    proc = subprocess.run(
        ["sbatch", "--wait", "--ntasks=2", "--cpus-per-task=1", f"--output={out}", f"--wrap={cmd}"],
        env=_job_env(slurm_env), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stderr, out.read_text()[-3000:])
    errors = [ln for ln in out.read_text().splitlines() if ln.startswith("config error:")]
    assert len(errors) == 1 and "not one task of a SLURM job step" in errors[0], errors
    assert "srun jaxrl-train" in errors[0]
