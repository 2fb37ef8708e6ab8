"""The engine's device side: its KV cache, the weights as the programs take them, and the programs.

Compiled programs: one prefill program per (length bucket, row bucket) and one decode program per
attention window (``EngineConfig.decode_windows`` + the full cache) that gets used, and with
``share_prefixes`` the fork program (compiled when the engine is built); ``compile_count`` counts
traces of all three kinds (each trace is one XLA compilation); the program that lays the weights
out for unrolled layers is not counted. Under a mesh the slots are sharded over
(``data``, ``fsdp``), KV heads over ``tensor`` when they divide, and the weights as
``jaxrl_agents.sharding`` says; the fork then runs under ``shard_map`` (a copied block moves
between shards by one ``psum``), so it never gathers the cache.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_agents import sharding as shd
from jaxrl_agents.generation.config import EngineConfig
from jaxrl_agents.generation.steps import make_decode, make_fork, make_prefill, stacked_forward
from jaxrl_agents.models import ModelConfig, decoder
from jaxrl_agents.models.lora import merge_lora


def sampler_config(mcfg: ModelConfig, cfg: EngineConfig, *, unrolled: bool) -> ModelConfig:
    """The model config the sampler computes with: the model's, at ``cfg.dtype`` when set
    (``ValueError`` when that needs the unrolled layers and they are off)."""
    if cfg.dtype is None or jnp.dtype(cfg.dtype) == jnp.dtype(mcfg.dtype):
        return mcfg
    if not unrolled:
        raise ValueError(
            f"sampler dtype={cfg.dtype!r} differs from the model's compute dtype "
            f"{mcfg.dtype!r}: that needs the unrolled layers (unroll_layers=true); the layer "
            "scan samples in the model's dtype"
        )
    return dataclasses.replace(mcfg, dtype=cfg.dtype)


def default_unrolled() -> bool:
    """Unrolled layers unless ``EngineConfig.unroll_layers`` says otherwise: on CPU and GPU."""
    return jax.default_backend() in ("cpu", "gpu")  # measured faster on both


def _slot_axes() -> tuple[str, ...]:
    """The mesh axes the cache's slots (its ``batch`` axis) are sharded over."""
    axes = shd.LOGICAL_AXIS_RULES["batch"]
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def slot_shards(mesh: Mesh | None) -> int:
    """How many shards the cache's slots are split into on ``mesh`` (1 without one)."""
    return 1 if mesh is None else int(np.prod([mesh.shape[a] for a in _slot_axes()]))


def new_cache(
    mcfg: ModelConfig, cfg: EngineConfig, *, unrolled: bool, mesh: Mesh | None
) -> tuple[decoder.KVCache, decoder.KVCache | None]:
    """An empty KV cache of ``cfg.max_slots`` rows (per-layer buffers when ``unrolled``), placed
    on ``mesh`` when there is one, and its shardings (None without a mesh)."""
    B = cfg.max_slots
    init = decoder.init_layer_cache if unrolled else decoder.init_cache
    cache = init(mcfg, batch=B, max_len=cfg.max_seq_len, dtype=cfg.cache_dtype)
    if mesh is None:
        return cache, None
    n_slot_shards = slot_shards(mesh)
    if B % n_slot_shards:
        raise ValueError(
            f"max_slots={B} must be a multiple of {'*'.join(_slot_axes())}={n_slot_shards} "
            f"of mesh {dict(mesh.shape)}"
        )

    def place(buffers, axes):  # a stacked buffer or a tuple of per-layer ones
        return jax.tree.map(lambda a: shd.logical_sharding(axes, mesh, shape=a.shape), buffers)

    k_axes, v_axes = decoder.cache_axes(cache)
    ks, vs = place(cache.k, k_axes), place(cache.v, v_axes)
    lengths = shd.logical_sharding(("batch",), mesh, shape=(B,))
    cache_sharding = type(cache)(k=ks, v=vs, lengths=lengths)
    return jax.device_put(cache, cache_sharding), cache_sharding


def place_weights(state: Any, mesh: Mesh | None) -> Any:
    """The model state on ``mesh`` as ``jaxrl_agents.sharding`` says (as it is without one)."""
    if mesh is None:
        return state
    # Parameters already placed (load_pretrained(mesh=...)) are not moved.
    return jax.device_put(state, shd.param_shardings(state, mesh))


def weight_layout(
    model: nnx.Module,
    graphdef: nnx.GraphDef,
    cfg: EngineConfig,
    mcfg: ModelConfig,
    *,
    unrolled: bool,
) -> tuple[Callable | None, Callable, Callable]:
    """``(relayout, hidden, logits)``: the jitted program that turns the state of ``model``
    (``graphdef``: its ``nnx.split`` graph) into what ``hidden`` and ``logits`` take (None: the
    state as it is), and those two forward functions; ``mcfg``: the config the sampler computes
    with (:func:`sampler_config`)."""
    if unrolled:
        # One program re-lays the weights out (per-layer, compute dtype) on every update.
        merge, dt = cfg.merge_lora, mcfg.dtype
        relayout = jax.jit(
            lambda st: decoder.decode_weights(nnx.merge(graphdef, st), merge_lora=merge, dtype=dt)
        )
        hidden = functools.partial(decoder.forward_unrolled, mcfg)
        return relayout, hidden, decoder.logits_unrolled
    if mcfg.lora is not None and cfg.merge_lora:
        # The model's own layer scan over the base weights with the adapters folded in.
        relayout = jax.jit(lambda st: nnx.state(merge_lora(nnx.merge(graphdef, st))))
        return relayout, *stacked_forward(nnx.graphdef(merge_lora(model)))
    return None, *stacked_forward(graphdef)


def compile_programs(
    hidden: Callable,
    logits: Callable,
    cfg: EngineConfig,
    *,
    cache_sharding: decoder.KVCache | None,
    on_trace: Callable[[], None],
) -> tuple[Callable, dict[int, Callable], Callable | None]:
    """``(prefill, decoders, fork)``, jitted with the cache donated: the prefill program, one
    decode program per attention window (each compiled on first use) and, with
    ``share_prefixes``, the fork program (else None)."""
    prefill = jax.jit(
        make_prefill(hidden, on_trace=on_trace, cache_constraint=cache_sharding),
        donate_argnums=1,
    )
    decoders = {
        w: jax.jit(
            make_decode(
                hidden,
                logits,
                chunk=cfg.decode_chunk,
                max_seq_len=cfg.max_seq_len,
                window=w,
                on_trace=on_trace,
                cache_constraint=cache_sharding,
            ),
            donate_argnums=1,
        )
        for w in (*cfg.decode_windows, cfg.max_seq_len)
    }
    fork = None
    if cfg.share_prefixes:
        fork = jax.jit(
            make_fork(on_trace=on_trace, cache_constraint=cache_sharding), donate_argnums=0
        )
    return prefill, decoders, fork


def fork_args(pairs: list[tuple[int, int, int]], max_slots: int) -> tuple[np.ndarray, ...]:
    """(src, dst, n, count) of the fork program, padded to ``max_slots`` pairs."""
    src, dst, n = np.zeros((3, max_slots), np.int32)
    for i, (a, b, k) in enumerate(pairs):
        src[i], dst[i], n[i] = a, b, k
    return src, dst, n, np.int32(len(pairs))


def like_weights(old: Any, new: Any) -> Any:
    """``new`` weights placed as ``old`` are (same structure, shapes and dtypes, else a
    ``ValueError`` naming the first leaf that differs)."""
    old_leaves, old_tree = jax.tree.flatten(old)
    new_leaves, new_tree = jax.tree.flatten(new)
    if old_tree != new_tree:
        raise ValueError("update_weights: state structure differs from the engine's model")
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"update_weights: leaf {i} is {b.shape} {b.dtype}, expected {a.shape} {a.dtype}"
            )
    new_leaves = [
        jax.device_put(b, a.sharding) if isinstance(a, jax.Array) else b
        for a, b in zip(old_leaves, new_leaves, strict=True)
    ]
    return jax.tree.unflatten(old_tree, new_leaves)
