"""``distributed.maybe_initialize`` under SLURM's environment, without a cluster: a task of an
``srun`` step of several tasks initialises ``jax.distributed`` with no arguments (JAX reads the
step's environment), a single task does not, and an sbatch script of several tasks that starts
the job without ``srun`` stops in one line."""

from __future__ import annotations

import pytest

from jaxrl_agents import distributed as D
from jaxrl_agents.jobs.config import MeshSpec
from jaxrl_agents.sharding import MeshError

STEP = {"SLURM_JOB_ID": "41", "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}  # fmt: skip


@pytest.fixture
def calls(monkeypatch) -> list[tuple[tuple, dict]]:
    """``jax.distributed.initialize``'s calls (recorded, not made) and a clean environment."""
    import jax

    for name in [*STEP, "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(D, "_initialized", False)
    made: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: made.append((a, k)))
    monkeypatch.setattr(jax.config, "update", lambda *a, **k: None)
    return made


def test_a_task_of_an_srun_step_initialises_from_slurm(calls, monkeypatch):
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    assert D.maybe_initialize(MeshSpec()) is True
    assert calls == [((), {})]  # no coordinator, count or index: JAX's SLURM detection


def test_a_single_task_runs_alone(calls, monkeypatch):
    for name, value in {**STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}.items():
        monkeypatch.setenv(name, value)
    assert D.maybe_initialize(MeshSpec()) is False
    assert calls == []


def test_an_sbatch_script_of_several_tasks_without_srun_stops(calls, monkeypatch):
    for name, value in STEP.items():
        if name != "SLURM_STEP_NODELIST":  # what an sbatch script's own environment lacks
            monkeypatch.setenv(name, value)
    with pytest.raises(MeshError, match=r"SLURM_NTASKS=2, .*no SLURM_STEP_NODELIST.*srun"):
        D.maybe_initialize(MeshSpec())
    assert calls == []


def test_an_explicit_coordinator_wins_over_slurm(calls, monkeypatch):
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)
    spec = MeshSpec(coordinator_address="h:1", num_processes=2, process_id=0)
    assert D.maybe_initialize(spec) is True
    assert calls == [(("h:1",), {"num_processes": 2, "process_id": 0})]
