"""The Flax NNX decoder shared by sampling and training: Llama 3.x / Qwen2 / Qwen3.

Pre-norm blocks of GQA self-attention (RoPE, optional q/k/v bias, optional per-head q/k RMSNorm)
and a SwiGLU MLP, a final RMSNorm and a tied or untied LM head -- numerically the same as
transformers' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` (see
tests/models/test_model_parity.py).

Implementation choices (and where this deviates from a literal port):
- Per-layer weights are stacked on a leading ``layers`` axis and the blocks run under one
  ``lax.scan``: compile time does not grow with depth and the forward is a single traced function.
  ``cfg.remat`` wraps the scanned block in ``jax.checkpoint`` (= ``nnx.remat`` per layer).
- Attention masks come from explicit ``segment_ids`` (0 = padding, 1, 2, ... = packed sequences)
  and sequence order, so left padding, right padding and packing all work; RoPE uses explicit
  ``positions``. Softmax runs in float32; fully-masked (padding) queries get a uniform distribution
  instead of NaN. Logits are returned in float32 whatever the compute dtype.
- GQA never materialises repeated K/V: queries are reshaped to ``[B T K G Dh]`` and contracted
  against ``[B K S Dh]``.
- ``cfg.attention`` picks the multi-query path (training forward/backward and prefill):
  ``reference`` is the einsum path above (its float32 ``[B K G T S]`` scores are kept for the
  backward pass: at 8 x 2048 tokens of a 1.5B model they dominate memory); ``fused`` calls
  ``jax.nn.dot_product_attention`` with the same boolean mask (segments, causality, cache
  lengths): cuDNN's flash attention on GPU, which never materialises the scores, and its XLA
  lowering on CPU, where tests check it equals the reference path. ``auto`` (default) is fused
  on GPU only. One-query decode steps use ``cfg.decode_attention``: the reference einsums, or a
  ragged Pallas kernel that reads only each row's visible cache positions
  (``models/decode_attention.py``).
- KV cache: ``[L B K S Dh]`` buffers carried through the layer scan and updated in place with a
  scatter at ``lengths[b] + t``; padding tokens and writes past ``max_len`` are dropped (callers
  must size ``max_len`` for prompt + generation).

Where the parts live: this module holds the model (its parameters and the layer scan);
``models/block.py`` one decoder block, ``models/attention.py`` the attention paths,
``models/kv_cache.py`` the cache and its masks, ``models/unrolled.py`` the sampler's layout. Their
public names are importable from here too.

Run the checks: ``python -m pytest -q tests/models``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxrl_agents.models.attention import QUERY_BLOCK, fused_attention
from jaxrl_agents.models.block import decoder_block, rms_norm
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.kv_cache import (
    KVCache,
    cache_axes,
    cache_seq_axes,
    init_cache,
    init_layer_cache,
    mask_and_writes,
)
from jaxrl_agents.models.lora import LoRAAdapters
from jaxrl_agents.models.rope import inverse_frequencies
from jaxrl_agents.models.unrolled import decode_weights, forward_unrolled, logits_unrolled

__all__ = [
    "QUERY_BLOCK",
    "DecoderLayers",
    "KVCache",
    "Transformer",
    "cache_axes",
    "cache_seq_axes",
    "decode_weights",
    "forward_unrolled",
    "fused_attention",
    "init_cache",
    "init_layer_cache",
    "logits_unrolled",
    "param_layout",
    "rms_norm",
]


def param_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
    """``'layers.q' -> (shape, logical axis names, init)`` for every parameter of the model."""
    L, D, F, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, K, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = {"embed": ((V, D), ("vocab", "embed"), "normal")}
    layer = {
        "attn_norm": ((D,), ("norm",), "ones"),
        "q": ((D, H, Dh), ("embed", "q_heads", "head_dim"), "normal"),
        "k": ((D, K, Dh), ("embed", "kv_heads", "head_dim"), "normal"),
        "v": ((D, K, Dh), ("embed", "kv_heads", "head_dim"), "normal"),
        "o": ((H, Dh, D), ("q_heads", "head_dim", "embed"), "normal"),
    }
    if cfg.attention_bias:
        layer["q_bias"] = ((H, Dh), ("q_heads", "head_dim"), "zeros")
        layer["k_bias"] = ((K, Dh), ("kv_heads", "head_dim"), "zeros")
        layer["v_bias"] = ((K, Dh), ("kv_heads", "head_dim"), "zeros")
    if cfg.o_proj_bias:
        layer["o_bias"] = ((D,), ("norm",), "zeros")
    if cfg.qk_norm:
        layer["q_norm"] = ((Dh,), ("head_dim",), "ones")
        layer["k_norm"] = ((Dh,), ("head_dim",), "ones")
    layer["mlp_norm"] = ((D,), ("norm",), "ones")
    layer["gate"] = ((D, F), ("embed", "mlp"), "normal")
    layer["up"] = ((D, F), ("embed", "mlp"), "normal")
    layer["down"] = ((F, D), ("mlp", "embed"), "normal")
    for name, (shape, names, init) in layer.items():
        out[f"layers.{name}"] = ((L, *shape), ("layers", *names), init)
    out["final_norm"] = ((D,), ("norm",), "ones")
    if not cfg.tie_word_embeddings:
        out["lm_head"] = ((D, V), ("embed", "vocab"), "normal")
    return out


@functools.partial(jax.jit, static_argnums=1)
def _init_values(key: Array, cfg: ModelConfig) -> dict[str, Array]:
    # One compiled program per config instead of one eager dispatch (and compile) per tensor.
    dtype = jnp.dtype(cfg.param_dtype)
    layout = sorted(param_layout(cfg).items())
    # A single normal draw sliced into tensors: threefry compiles once, not once per shape.
    sizes = [math.prod(shape) for _, (shape, _, init) in layout if init == "normal"]
    flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)  # HF initializer_range
    out, offset = {}, 0
    for name, (shape, _, init) in layout:
        if init == "normal":
            n = math.prod(shape)
            val = flat[offset : offset + n].reshape(shape)
            offset += n
        else:
            val = jnp.full(shape, 1.0 if init == "ones" else 0.0, jnp.float32)
        out[name] = val.astype(dtype)
    return out


def _param(value: Array, names: tuple[str, ...]) -> nnx.Param:
    """An ``nnx.Param`` carrying its logical axis names (resolved by ``jaxrl_agents.sharding``)."""
    # eager_sharding=False: names are logical; placement happens in sharding.shard_model / load.
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


class DecoderLayers(nnx.Module):
    """All decoder blocks' weights, stacked on a leading ``layers`` axis of size L."""

    def __init__(self, cfg: ModelConfig, values: dict[str, Array]):
        for key, (_, names, _) in param_layout(cfg).items():
            if key.startswith("layers."):
                setattr(self, key.removeprefix("layers."), _param(values[key], names))

    def stacked(self) -> dict[str, Array]:
        """Name -> Float['L ...'] array, the ``xs`` of the layer scan."""
        return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}


class Transformer(nnx.Module):
    """Decoder-only LM. See the module docstring for the masking and cache contract.

    Fresh initialisation (normal(0.02) weights, unit norms, zero biases) runs as one jitted program
    on the default device: meant for tiny/demo models; real checkpoints go through
    ``load_pretrained``, which places each tensor directly on its sharding.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        values = _init_values(rngs.params(), cfg)
        layout = param_layout(cfg)
        self.embed = _param(values["embed"], layout["embed"][1])
        self.layers = DecoderLayers(cfg, values)
        self.final_norm = _param(values["final_norm"], layout["final_norm"][1])
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(values["lm_head"], layout["lm_head"][1])
        if cfg.lora is not None:
            self.lora = LoRAAdapters(cfg, key=rngs.params())

    def stacked_params(self, *, adapters: bool = True) -> dict[str, Any]:
        """The layer scan's weights: every stacked base weight, and under ``"lora"`` the
        adapters' ``target -> (A, B)`` when the policy has them (and ``adapters``)."""
        out: dict[str, Any] = self.layers.stacked()
        if adapters and self.cfg.lora is not None and hasattr(self, "lora"):
            out["lora"] = self.lora.stacked()
        return out

    def _scan_segments(self, layer_ids: Array) -> list[tuple[dict[str, Any], Array]]:
        """The layer scans' ``xs``: one scan over every layer, or with adapters on the top layers
        only (``LoRAConfig.top_layers``) a scan of the frozen layers below them first. Nothing
        trained reaches that one, so a gradient pass stops above it."""
        p = self.stacked_params()
        first = self.cfg.lora.first_layer(self.cfg.num_hidden_layers) if "lora" in p else 0
        if not first:
            return [(p, layer_ids)]
        lora = p.pop("lora")
        below = {k: v[:first] for k, v in p.items()}
        above = {k: v[first:] for k, v in p.items()} | {"lora": lora}
        return [(below, layer_ids[:first]), (above, layer_ids[first:])]

    # ------------------------------------------------------------------ public API
    def __call__(
        self,
        tokens: Array,
        positions: Array,
        *,
        segment_ids: Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Int['B T'] tokens/positions -> (Float32['B T V'] logits, updated cache or None)."""
        h, cache = self.hidden_states(tokens, positions, segment_ids=segment_ids, cache=cache)
        return self.logits_from_hidden(h), cache

    def hidden_states(
        self,
        tokens: Array,
        positions: Array,
        *,
        segment_ids: Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Float['B T D'] activations after the final norm (compute dtype), and the new cache."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        x = jnp.take(self.embed[...], tokens, axis=0).astype(dt)
        inv_freq = inverse_frequencies(cfg)
        B, T = tokens.shape
        valid = jnp.ones((B, T), bool) if segment_ids is None else segment_ids != 0

        mask, write_pos = mask_and_writes(segment_ids, valid, cache)
        kv = None if cache is None else (cache.k, cache.v)

        def block(carry, xs):
            x, kv_all = carry
            p, layer = xs
            write = None
            if kv_all is not None:

                def write(k, v):
                    k_all, v_all = kv_all
                    rows = jnp.arange(B)[:, None]
                    # (layer, rows, :, write_pos): the advanced indices broadcast to [B, T] in
                    # front, so the update is k's own [B, T, K, Dh] layout.
                    k_all = k_all.at[layer, rows, :, write_pos].set(
                        k.astype(k_all.dtype), mode="drop"
                    )
                    v_all = v_all.at[layer, rows, :, write_pos].set(
                        v.astype(v_all.dtype), mode="drop"
                    )
                    return k_all[layer], v_all[layer], (k_all, v_all)

            x, new_kv = decoder_block(cfg, p, x, positions, inv_freq, mask, write)
            return (x, new_kv if kv_all is not None else None), None

        if cfg.remat:
            block = jax.checkpoint(block, prevent_cse=False)
        layer_ids = jnp.arange(cfg.num_hidden_layers)
        for p, ids in self._scan_segments(layer_ids):
            unroll = min(int(cfg.scan_unroll), len(ids))
            (x, kv), _ = jax.lax.scan(block, (x, kv), (p, ids), unroll=unroll)
        h = rms_norm(x, self.final_norm[...], eps=cfg.rms_norm_eps)
        if cache is not None:
            n_valid = valid.sum(axis=1).astype(cache.lengths.dtype)
            cache = KVCache(k=kv[0], v=kv[1], lengths=cache.lengths + n_valid)
        return h, cache

    def logits_from_hidden(self, h: Array) -> Array:
        """Float['B T D'] -> Float32['B T V'] through the LM head (or the tied embedding)."""
        dt = h.dtype
        if self.cfg.tie_word_embeddings:
            w = self.embed[...].astype(dt)
            return jnp.einsum("btd,vd->btv", h, w, preferred_element_type=jnp.float32)
        w = self.lm_head[...].astype(dt)
        return jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32)
