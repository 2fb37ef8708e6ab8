"""The KV cache of a decoder forward, its logical axes, and the mask and write positions of a
forward over it.

Two layouts: :func:`init_cache`'s stacked ``[L B K S Dh]`` buffers, carried through the model's
layer scan, and :func:`init_layer_cache`'s per-layer buffers of the sampler's unrolled layers
(``models/unrolled.py``). Either is updated in place with a scatter at ``lengths[b] + t``;
padding tokens and writes past ``max_len`` are dropped (callers must size ``max_len`` for prompt +
generation).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import Array

from jaxrl_agents.models.config import ModelConfig


class KVCache(NamedTuple):
    """Per-layer key/value buffers; a pytree, so it can be donated and carried in loops."""

    # Heads before positions: decode attention reads each (row, head)'s keys contiguously, so
    # the per-step einsums need no transpose of the cache (a 3-5x cost on XLA:CPU otherwise).
    k: Array  # Float['L B K S Dh'] compute dtype, RoPE already applied
    v: Array  # Float['L B K S Dh']
    lengths: Array  # Int['B']: tokens already stored per row


def init_cache(cfg: ModelConfig, *, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache for ``batch`` rows of ``max_len`` tokens (dtype defaults to cfg.dtype)."""
    shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
    dtype = jnp.dtype(dtype or cfg.dtype)
    return KVCache(
        k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32)
    )


def init_layer_cache(cfg: ModelConfig, *, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache of per-layer buffers: ``k`` a tuple of Float['B K Dh S'] (positions last:
    decode scores reduce along contiguous memory), ``v`` a tuple of Float['B K S Dh']."""
    B, K, Dh = batch, cfg.num_key_value_heads, cfg.head_dim
    dtype = jnp.dtype(dtype or cfg.dtype)
    L = cfg.num_hidden_layers
    return KVCache(
        k=tuple(jnp.zeros((B, K, Dh, max_len), dtype) for _ in range(L)),
        v=tuple(jnp.zeros((B, K, max_len, Dh), dtype) for _ in range(L)),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


# Logical axes (jaxrl_agents.sharding) of one k and one v buffer: stacked ``init_cache`` buffers
# [L B K S Dh]; ``init_layer_cache`` stores each layer's K as [B K Dh S] and V as [B K S Dh].
_STACKED_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
_LAYER_K_AXES = ("batch", "kv_heads", "head_dim", "cache_seq")
_LAYER_V_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")


def cache_axes(cache: KVCache) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Logical axes of one of ``cache``'s k buffers and one of its v buffers."""
    if isinstance(cache.k, tuple):
        return _LAYER_K_AXES, _LAYER_V_AXES
    return _STACKED_AXES, _STACKED_AXES


def cache_seq_axes(cache: KVCache) -> tuple[int, int]:
    """The (negative) position axis of ``cache``'s k and v buffers."""
    return tuple(axes.index("cache_seq") - len(axes) for axes in cache_axes(cache))


def mask_and_writes(
    segment_ids: Array | None, valid: Array, cache: KVCache | None
) -> tuple[Array, Array | None]:
    """Bool['B T S'] attention mask and Int['B T'] cache write positions (None without a cache).

    Without a cache: causal within equal segment ids. With one: query t of row b sees cache
    positions ``<= lengths[b] + t``; padding (and overflow past S) writes to index S, which the
    scatter drops.
    """
    B, T = valid.shape
    if cache is None:
        seg = valid.astype(jnp.int32) if segment_ids is None else segment_ids
        causal = jnp.tril(jnp.ones((T, T), bool))
        return causal[None] & (seg[:, :, None] == seg[:, None, :]) & valid[:, :, None], None
    v0 = cache.v[0] if isinstance(cache.v, tuple) else cache.v
    S = v0.shape[-2]
    pos = cache.lengths[:, None] + jnp.arange(T)[None, :]
    mask = jnp.arange(S)[None, None, :] <= pos[..., None]
    return mask, jnp.where(valid, pos, S)
