"""Mesh construction and THE table from logical axis names to mesh axes.

Model code names logical axes only (``('layers', 'embed', 'q_heads', 'head_dim')``); this module is
the one place that decides how they map onto the ``(data, fsdp, tensor)`` mesh:

- ``data``: pure data parallelism (parameters replicated).
- ``fsdp``: data parallelism with parameters sharded on their ``embed`` dimension (ZeRO-3 style;
  XLA all-gathers each layer's weights inside the layer scan).
- ``tensor``: Megatron-style tensor parallelism over heads, MLP width and vocabulary.

A dimension whose size is not divisible by its mesh axes is replicated instead (e.g. 2 KV heads on
a 4-way ``tensor`` axis): GQA models commonly have fewer KV heads than tensor shards.

Meshes use ``AxisType.Auto`` so GSPMD propagates shardings through un-annotated activations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    # activations / batches
    "batch": ("data", "fsdp"),
    "seq": None,
    "cache_seq": None,
    # parameters
    "layers": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "lora": None,  # a LoRA adapter's rank
}


class MeshError(ValueError):
    """A mesh shape that does not fit the available devices."""


def make_mesh(
    shape: Sequence[int] | Mapping[str, int], devices: Sequence[Any] | None = None
) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh. One entry may be -1: it takes the remaining devices.

    ``shape`` is a 3-sequence in ``MESH_AXES`` order or a dict over those names (missing axes = 1).
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise MeshError(f"unknown mesh axes {sorted(unknown)}; valid: {list(MESH_AXES)}")
        sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != len(MESH_AXES):
            raise MeshError(f"mesh shape {tuple(sizes)} must have 3 entries {MESH_AXES}")
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise MeshError(f"mesh shape {tuple(sizes)}: entries must be positive, with at most one -1")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if n % known:
            raise MeshError(
                f"mesh shape {tuple(sizes)} does not fit {n} devices ({n} is not a multiple of "
                f"{known})"
            )
        sizes[sizes.index(-1)] = n // known
    if math.prod(sizes) != n:
        raise MeshError(
            f"mesh shape {tuple(sizes)} needs {math.prod(sizes)} devices but {n} are available"
        )
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_to_spec(
    names: Sequence[str | None],
    *,
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    rules: Mapping[str, str | tuple[str, ...] | None] = LOGICAL_AXIS_RULES,
) -> PartitionSpec:
    """Logical names -> PartitionSpec. With ``shape`` and ``mesh``, indivisible dims replicate."""
    out: list[Any] = []
    used: set[str] = set()
    for i, name in enumerate(names):
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        axes = rules[name]
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        if mesh is not None:
            # Axes of size 1 shard nothing; dropping them keeps specs readable.
            axes = tuple(a for a in axes if mesh.shape[a] > 1)
            if shape is not None and shape[i] % math.prod(mesh.shape[a] for a in axes):
                axes = ()
        if used & set(axes):
            raise ValueError(f"mesh axes {axes} used twice in logical spec {tuple(names)}")
        used |= set(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    while out and out[-1] is None:
        out.pop()
    return PartitionSpec(*out)


def logical_sharding(
    names: Sequence[str | None], mesh: Mesh, *, shape: Sequence[int] | None = None
) -> NamedSharding:
    """NamedSharding for an array with the given logical axis names."""
    return NamedSharding(mesh, logical_to_spec(names, shape=shape, mesh=mesh))


def _var_names(var: nnx.Variable) -> tuple[str, ...] | None:
    return var.get_metadata().get("out_sharding")


def param_shardings(state: Any, mesh: Mesh) -> Any:
    """NamedSharding tree for an NNX state (or module); variables without names replicate."""
    if isinstance(state, nnx.Module):
        state = nnx.state(state)

    def one(var):
        names = _var_names(var) if isinstance(var, nnx.Variable) else None
        if names is None:
            return NamedSharding(mesh, PartitionSpec())
        return logical_sharding(names, mesh, shape=np.shape(var.get_value()))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def partition_specs(model: nnx.Module, mesh: Mesh) -> dict[str, str]:
    """``'layers.q' -> "P(None, 'fsdp', 'tensor')"``: the resolved table, for snapshots."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    out = {}
    for path, var in flat:
        spec = logical_to_spec(_var_names(var), shape=var.get_value().shape, mesh=mesh)
        out[".".join(map(str, path))] = str(spec)
    return dict(sorted(out.items()))


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Place every variable of ``model`` on its NamedSharding under ``mesh`` (in place)."""
    state = nnx.state(model)
    shardings = param_shardings(state, mesh)
    if any(d.process_index != jax.process_index() for d in mesh.devices.flat):
        # Onto a mesh spanning processes, place from host values: device_put of a device array
        # there can yield arrays whose shards cannot be read back (jax 0.10, replicated specs).
        state = jax.tree.map(np.asarray, state)
    nnx.update(model, jax.device_put(state, shardings))
    return model
