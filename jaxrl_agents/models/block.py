"""One pre-norm decoder block, shared by the model's layer scan (``models/decoder.py``) and the
sampler's unrolled layers (``models/unrolled.py``).

RMSNorm, q/k/v projections (optional bias, optional per-head q/k RMSNorm), RoPE at explicit
positions, GQA attention (``models/attention.py``), the output projection, then RMSNorm and a
SwiGLU MLP, each with a residual connection. Projections with LoRA adapters (``"lora"`` in the
layer's weights) add their low-rank deltas.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

from jaxrl_agents.models.attention import gqa_attention
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.lora import lora_delta
from jaxrl_agents.models.rope import apply_rope


def rms_norm(x: Array, scale: Array, *, eps: float) -> Array:
    """HF RMSNorm: normalise in float32, cast back, then multiply by the weight."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return x32.astype(x.dtype) * scale.astype(x.dtype)


def _plus(x: Array, delta: Array | None) -> Array:
    return x if delta is None else x + delta


def _qkv(cfg: ModelConfig, p: dict, h: Array) -> tuple[Array, Array, Array]:
    """Queries Float['B T H Dh'] and keys/values Float['B T K Dh'] of normed activations ``h``
    (biases and LoRA deltas added, before q/k norm and RoPE)."""
    dt = h.dtype
    H, K = cfg.num_attention_heads, cfg.num_key_value_heads
    if "qkv" in p:  # the sampler's fused layout (decode_weights): one matmul for q, k and v
        qkv = jnp.einsum("btd,dhk->bthk", h, p["qkv"].astype(dt))
        if cfg.attention_bias:
            qkv = qkv + p["qkv_bias"].astype(dt)
        q, k, v = qkv[:, :, :H], qkv[:, :, H : H + K], qkv[:, :, H + K :]
        if "lora" in p:  # adapters kept unmerged in the sampler (EngineConfig.merge_lora=false)
            q, k, v = (
                _plus(t, lora_delta(cfg, p, n, h)) for t, n in ((q, "q"), (k, "k"), (v, "v"))
            )
        return q, k, v
    q = jnp.einsum("btd,dhk->bthk", h, p["q"].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", h, p["k"].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", h, p["v"].astype(dt))
    if "lora" in p:
        q, k, v = (_plus(t, lora_delta(cfg, p, n, h)) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if cfg.attention_bias:
        q = q + p["q_bias"].astype(dt)
        k = k + p["k_bias"].astype(dt)
        v = v + p["v_bias"].astype(dt)
    return q, k, v


def _mlp(cfg: ModelConfig, p: dict, h: Array) -> Array:
    """The SwiGLU MLP of normed activations ``h`` (LoRA deltas added)."""
    dt = h.dtype
    if "gate_up" in p:  # fused layout: one matmul for gate and up
        gate, up = jnp.split(h @ p["gate_up"].astype(dt), 2, axis=-1)
    else:
        gate, up = h @ p["gate"].astype(dt), h @ p["up"].astype(dt)
    gate, up = _plus(gate, lora_delta(cfg, p, "gate", h)), _plus(up, lora_delta(cfg, p, "up", h))
    act = jax.nn.silu(gate) * up
    return _plus(act @ p["down"].astype(dt), lora_delta(cfg, p, "down", act))


def decoder_block(
    cfg: ModelConfig,
    p: dict,
    x: Array,
    positions: Array,
    inv_freq: Array,
    mask: Array,
    write: Callable | None,
    k_t: bool = False,
):
    """One pre-norm decoder block on Float['B T D'] ``x`` (its dtype is the compute dtype).

    ``write`` is None (attend over this call's own tokens) or ``write(k, v) -> (k_ctx, v_ctx,
    new_cache_state)``: store the new keys/values Float['B T K Dh'] and return the context to
    attend over, Float['B K S Dh'] each (k_ctx Float['B K Dh S'] with ``k_t``). Returns the new
    ``x`` and ``new_cache_state``.
    """
    dt = x.dtype
    h = rms_norm(x, p["attn_norm"], eps=cfg.rms_norm_eps)
    q, k, v = _qkv(cfg, p, h)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], eps=cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], eps=cfg.rms_norm_eps)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    new = None
    if write is None:
        k_ctx, v_ctx, k_t = k.swapaxes(1, 2), v.swapaxes(1, 2), False
    else:
        k_ctx, v_ctx, new = write(k, v)
        k_ctx, v_ctx = k_ctx.astype(dt), v_ctx.astype(dt)
    attn = gqa_attention(cfg, q, k_ctx, v_ctx, mask, cached=write is not None, k_t=k_t)
    out = _plus(jnp.einsum("bthk,hkd->btd", attn, p["o"].astype(dt)), lora_delta(cfg, p, "o", attn))
    if cfg.o_proj_bias:
        out = out + p["o_bias"].astype(dt)
    x = x + out
    return x + _mlp(cfg, p, rms_norm(x, p["mlp_norm"], eps=cfg.rms_norm_eps)), new
