"""Multi-host start-up: ``jax.distributed`` from config, the environment, or SLURM.

One process per host; every process builds the same global mesh over all devices, runs its share
of episodes and feeds its local rows of each global batch; only process 0 writes logs, checkpoints'
metadata and exports (orbax coordinates the array writes itself).

Sources, first match wins: explicit ``mesh.coordinator_address`` / ``num_processes`` /
``process_id``; ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``; a SLURM
allocation of more than one task (``jax.distributed.initialize()`` auto-detects SLURM).
On CPU the collectives need gloo: ``jax_cpu_collectives_implementation='gloo'`` is set here.
"""

from __future__ import annotations

import os

import jax

_initialized = False


def maybe_initialize(mesh_spec) -> bool:
    """Initialise ``jax.distributed`` if this is a multi-process run; returns whether it did."""
    global _initialized
    if _initialized:
        return True
    addr = mesh_spec.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    nproc = mesh_spec.num_processes or _int_env("JAX_NUM_PROCESSES")
    pid = mesh_spec.process_id if mesh_spec.process_id is not None else _int_env("JAX_PROCESS_ID")
    slurm = _int_env("SLURM_NTASKS") or 0
    if addr is None and slurm <= 1:
        return False
    if jax.default_backend() == "cpu" or os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if addr is not None:
        if nproc is None or pid is None:
            raise ValueError(
                f"coordinator_address={addr!r} needs num_processes and process_id "
                f"(got {nproc!r}, {pid!r}); set mesh.num_processes / mesh.process_id or "
                "JAX_NUM_PROCESSES / JAX_PROCESS_ID"
            )
        jax.distributed.initialize(addr, num_processes=nproc, process_id=pid)
    else:
        jax.distributed.initialize()  # SLURM auto-detection
    _initialized = True
    return True


def _int_env(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None
