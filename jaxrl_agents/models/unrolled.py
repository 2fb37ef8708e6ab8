"""The sampler's layout of the decoder: the same blocks with the layers unrolled in Python.

The sampler runs the blocks over per-layer weights and per-layer KV buffers
(:func:`~jaxrl_agents.models.kv_cache.init_layer_cache`). On XLA:CPU this avoids copying a
layer's weights and cache out of the stacked arrays at every step of the layer scan (measured
~25% of a decode step of a 40M model); the LM head is kept as [D, V] (the tied embedding
transposed once), the faster layout for the decode matmul. The cost is a second copy of the
weights, in the compute dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import Array

from jaxrl_agents.models.block import decoder_block, rms_norm
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.kv_cache import KVCache, mask_and_writes
from jaxrl_agents.models.lora import merge_layer
from jaxrl_agents.models.rope import inverse_frequencies

if TYPE_CHECKING:  # decoder re-exports this module's names
    from jaxrl_agents.models.decoder import Transformer


def _fuse(p: dict[str, Array], cfg: ModelConfig) -> dict[str, Array]:
    """One layer's weights with q/k/v and gate/up concatenated (fewer, larger matmuls)."""
    p = dict(p)
    p["qkv"] = jnp.concatenate([p.pop("q"), p.pop("k"), p.pop("v")], axis=1)
    if cfg.attention_bias:
        p["qkv_bias"] = jnp.concatenate([p.pop("q_bias"), p.pop("k_bias"), p.pop("v_bias")], 0)
    p["gate_up"] = jnp.concatenate([p.pop("gate"), p.pop("up")], axis=1)
    return p


def decode_weights(
    model: Transformer, *, merge_lora: bool = True, dtype: Any = None
) -> dict[str, Any]:
    """The model's weights in the sampler's layout (traceable; jit it with the model split).

    ``{"embed": [V, D], "head": [D, V], "final_norm": [D], "layers": (per-layer dicts, ...)}``,
    every array cast to the compute dtype (the forward casts them to it anyway, so the
    numerics are the same as ``Transformer.__call__``), or to ``dtype`` (a sampler computing in
    another dtype than the model, ``EngineConfig.dtype``). LoRA adapters are folded into the
    weights (``merge_lora``, in float32 before the cast) or kept per layer under ``"lora"``.
    """
    cfg = model.cfg
    dt = jnp.dtype(dtype or cfg.dtype)
    stacked = model.stacked_params()
    if merge_lora:
        stacked = merge_layer(cfg, stacked)
    lora = stacked.pop("lora", None)
    L = cfg.num_hidden_layers
    layers = [jax.tree.map(lambda v, i=i: v[i].astype(dt), stacked) for i in range(L)]
    if lora is not None:  # unmerged: on the adapted (top) layers
        first = cfg.lora.first_layer(L)
        for i in range(first, L):
            layers[i]["lora"] = jax.tree.map(lambda v, j=i - first: v[j].astype(dt), lora)
    layers = tuple(_fuse(p, cfg) for p in layers)
    embed = model.embed[...].astype(dt)
    head = embed.T if cfg.tie_word_embeddings else model.lm_head[...].astype(dt)
    return {
        "embed": embed,
        "head": head,
        "final_norm": model.final_norm[...].astype(dt),
        "layers": layers,
    }


def forward_unrolled(
    cfg: ModelConfig,
    weights: dict[str, Any],
    tokens: Array,
    positions: Array,
    *,
    segment_ids: Array | None = None,
    cache: KVCache | None = None,
    rows: Array | None = None,
) -> tuple[Array, KVCache | None]:
    """``Transformer.hidden_states`` over ``decode_weights`` and an ``init_layer_cache`` cache.

    ``rows`` (Int['R'], with a cache): the call's R inputs are cache rows ``rows`` (``lengths``
    are theirs, Int['R']); the other rows are untouched and cost nothing. Rows whose tokens are
    all padding may repeat an index (their writes are dropped).
    """
    dt = jnp.dtype(cfg.dtype)
    x = jnp.take(weights["embed"], tokens, axis=0).astype(dt)
    inv_freq = inverse_frequencies(cfg)
    B, T = tokens.shape
    valid = jnp.ones((B, T), bool) if segment_ids is None else segment_ids != 0
    mask, write_pos = mask_and_writes(segment_ids, valid, cache)
    idx = (jnp.arange(B) if rows is None else rows)[:, None]
    new_k, new_v = [], []
    for i, p in enumerate(weights["layers"]):
        write = None
        if cache is not None:

            def write(k, v, kc=cache.k[i], vc=cache.v[i]):
                # Advanced indices split by slices put their dims first: [B T K Dh] either way.
                kc = kc.at[idx, :, :, write_pos].set(k.astype(kc.dtype), mode="drop")
                vc = vc.at[idx, :, write_pos].set(v.astype(vc.dtype), mode="drop")
                if rows is None:
                    return kc, vc, (kc, vc)
                return kc[rows], vc[rows], (kc, vc)

        x, kv = decoder_block(cfg, p, x, positions, inv_freq, mask, write, k_t=True)
        if kv is not None:
            new_k.append(kv[0])
            new_v.append(kv[1])
    h = rms_norm(x, weights["final_norm"], eps=cfg.rms_norm_eps)
    if cache is not None:
        n_valid = valid.sum(axis=1).astype(cache.lengths.dtype)
        cache = KVCache(k=tuple(new_k), v=tuple(new_v), lengths=cache.lengths + n_valid)
    return h, cache


def logits_unrolled(weights: dict[str, Any], h: Array) -> Array:
    """Float['B T D'] -> Float32['B T V'] through ``decode_weights``' [D, V] head."""
    return jnp.einsum(
        "btd,dv->btv", h, weights["head"].astype(h.dtype), preferred_element_type=jnp.float32
    )
