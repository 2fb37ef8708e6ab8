"""Multi-host start-up, batch placement and the few cross-process helpers the jobs need.

One process per host, all running the same program (SPMD over a global mesh):

* **Training** runs on the global mesh: every jitted step sees global arrays whose leading (batch)
  axis is split over the processes; each process feeds its own rows
  (``jax.make_array_from_process_local_data``), XLA inserts the collectives.
* **Sampling** runs on a process-local mesh (:func:`local_mesh`): each process's engine serves only
  its own share of the episodes with Python-driven continuous batching, which a mesh spanning
  processes could not do (the processes would dispatch different programs). Its weights are the
  trainer's parameters copied onto that mesh (:func:`replicate_locally`) at every weight push.
* Episodes, held-out results and small scalars are all-gathered (:func:`gather_objects`,
  :func:`gather_rows`) so every process computes the same summaries; only process 0 writes logs,
  checkpoints' metadata and exports (orbax coordinates the array writes itself).

Start-up sources, first match wins: explicit ``mesh.coordinator_address`` / ``num_processes`` /
``process_id``; ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID``; a SLURM
job step of more than one task (``srun``: ``jax.distributed.initialize()`` auto-detects SLURM;
the coordinator is the step's first node, its port derived from the job id). An sbatch script of
several tasks that starts the job without ``srun`` stops with a one-line error.
On CPU the collectives need gloo: ``jax_cpu_collectives_implementation='gloo'`` is set here.

With one process every helper is the identity (or a trivial local computation), so the
single-host job takes the same code path without collectives.
"""

from __future__ import annotations

import functools
import os
import pickle
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_agents.sharding import LOGICAL_AXIS_RULES

_initialized = False


def batch_axes() -> tuple[str, ...]:
    """The mesh axes the leading (batch) axis of every batch is split over: the ``batch`` entry of
    the one logical-axis table (``sharding.LOGICAL_AXIS_RULES``)."""
    axes = LOGICAL_AXIS_RULES["batch"]
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def batch_sharding(mesh: Mesh | None) -> NamedSharding | None:
    """Rows of a batch over the data-parallel mesh axes (``batch_axes``); None without a mesh."""
    if mesh is None:
        return None
    return NamedSharding(mesh, PartitionSpec(batch_axes()))


def place(tree: Any, sharding: NamedSharding | None) -> Any:
    """Host rows -> device arrays. Under ``jax.distributed`` ``tree`` holds this process's rows and
    the result is the global batch: every process's rows, concatenated in process order (the
    mesh's device order). With one process, the whole batch on ``sharding``."""
    if sharding is None:
        return jax.device_put(tree)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), tree)


def replicated_on(tree: Any, mesh: Mesh) -> Any:
    """Every leaf a global array replicated on ``mesh`` (orbax and multi-process jit need global
    arrays). Leaves already on ``mesh`` are kept; others are placed from host values: device_put
    of a device array onto a mesh spanning processes can yield arrays whose shards cannot be read
    back (jax 0.10)."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def put(x):
        if isinstance(x, jax.Array) and getattr(x.sharding, "mesh", None) == mesh:
            return x
        return jax.device_put(np.asarray(x), replicated)

    return jax.tree.map(put, tree)


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
    if addr is None and (missing := [v for v in _SLURM_STEP_ENV if v not in os.environ]):
        from jaxrl_agents.sharding import MeshError

        raise MeshError(
            f"SLURM_NTASKS={slurm}, but this process is not one task of a SLURM job step "
            f"(no {', '.join(missing)}): start one process per task with `srun jaxrl-train ...` "
            "(e.g. in the sbatch script), or run a single process with `srun --ntasks=1`"
        )
    # Not ``jax.default_backend()``: that starts the backend, after which initialize() refuses.
    # gloo only serves CPU collectives, so it is harmless on accelerator hosts.
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


# What jax.distributed's SLURM detection reads: set in every task that srun starts, but not in
# an sbatch script itself (whose SLURM_NTASKS is still the allocation's task count).
_SLURM_STEP_ENV = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")


def _int_env(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


# -- shares of work ----------------------------------------------------------------------------


def even_share(n: int, what: str) -> slice:
    """This process's contiguous ``n / process_count`` items (process ``p`` takes block ``p``).

    Raises a ValueError naming ``what`` when ``n`` does not divide (equal shares keep every
    process's rows of the global batch the same shape)."""
    nproc, p = jax.process_count(), jax.process_index()
    if n % nproc:
        raise ValueError(
            f"{what}={n} is not divisible by the number of processes ({nproc}); "
            f"use a multiple of {nproc}"
        )
    k = n // nproc
    return slice(p * k, (p + 1) * k)


def uneven_share(n: int) -> slice:
    """This process's contiguous block of ``n`` items, sizes differing by at most one."""
    nproc, p = jax.process_count(), jax.process_index()
    base, extra = divmod(n, nproc)
    lo = p * base + min(p, extra)
    return slice(lo, lo + base + (p < extra))


# -- meshes and weights ------------------------------------------------------------------------


def local_mesh(mesh: Mesh) -> Mesh:
    """This process's block of ``mesh`` (same axis names): where its sampler engine runs.

    Falls back to all local devices on the first axis when the process's devices do not form a
    block. Raises if two processes would hold the same batch rows (``batch_axes`` coordinates),
    e.g. a ``tensor`` axis spanning hosts: every process must own a distinct share of the batch.
    """
    if jax.process_count() == 1:
        return mesh
    axes_names = batch_axes()
    devs = mesh.devices
    owners: dict[tuple[int, ...], set[int]] = {}
    axes = [mesh.axis_names.index(a) for a in axes_names]
    for idx in np.ndindex(devs.shape):
        owners.setdefault(tuple(idx[a] for a in axes), set()).add(devs[idx].process_index)
    shared = sorted(k for k, v in owners.items() if len(v) > 1)
    if shared:
        from jaxrl_agents.sharding import MeshError

        raise MeshError(
            f"mesh {dict(mesh.shape)} puts the same batch rows on several processes (at "
            f"{axes_names} coordinates {shared[:4]}); make the processes split the "
            f"{'*'.join(axes_names)} axes (keep 'tensor' within a host)"
        )
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(devs)
    keep = [
        np.flatnonzero(mine.any(axis=tuple(j for j in range(mine.ndim) if j != i)))
        for i in range(mine.ndim)
    ]
    block = devs[np.ix_(*keep)]
    if block.size != mine.sum():
        block = np.array(jax.local_devices()).reshape((-1,) + (1,) * (devs.ndim - 1))
    return Mesh(block, mesh.axis_names, axis_types=mesh.axis_types)


def _identity(x):
    return x


@functools.cache
def _replicator(mesh: Mesh):
    return jax.jit(_identity, out_shardings=NamedSharding(mesh, PartitionSpec()))


def replicate_locally(tree: Any, mesh: Mesh, local: Mesh) -> Any:
    """Global arrays on ``mesh`` -> the same values, replicated on this process's ``local`` mesh.

    One jitted all-gather makes every device hold a full copy; those copies are then wrapped as
    arrays of the local mesh (no host round trip). Cost per call: an all-gather of the sharded
    bytes over the interconnect and, transiently, a full copy of ``tree`` on every device (the
    caller, e.g. ``Engine.update_weights``, then re-shards it within the host).
    """
    if jax.process_count() == 1:
        return tree
    full = _replicator(mesh)(tree)
    sharding = NamedSharding(local, PartitionSpec())
    return jax.tree.map(
        lambda x: jax.make_array_from_single_device_arrays(
            x.shape, sharding, [s.data for s in x.addressable_shards]
        ),
        full,
    )


def host_value(tree: Any) -> Any:
    """Replicated results of a global computation (metrics, counters) as host numpy values."""

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return multihost_utils.process_allgather(x, tiled=True)

    return jax.tree.map(one, tree)


# -- gathering host data -----------------------------------------------------------------------


def gather_rows(x: np.ndarray) -> np.ndarray:
    """``[...]`` per process -> ``[P, ...]`` on every process, in process order."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x[None]
    return np.asarray(multihost_utils.process_allgather(x))


def gather_objects(obj: Any) -> list[Any]:
    """One picklable object per process -> the list of all of them on every process.

    Sizes are gathered first, then the padded pickles in one all-gather; with one process the
    object itself comes back (no copy)."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = gather_rows(np.array(data.size, np.int32))
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: data.size] = data
    blobs = gather_rows(buf)
    return [pickle.loads(blobs[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]
