"""Rotary position embeddings (RoPE) with optional Llama 3 frequency scaling.

Matches Hugging Face's ``rotate_half`` convention: the head dimension is split into two halves
``[x1, x2]`` (not interleaved pairs) and rotated by ``cat(freqs, freqs)``. Frequencies are computed
on the host in float64 and angles in float32 on device, as transformers does, so fp32 logits agree
to ~1e-6.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxrl_agents.models.config import ModelConfig, RopeScaling


def _llama3_scale(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    """Llama 3.1 scaling: long wavelengths / factor, short kept, a smooth blend in between."""
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """Float32['Dh/2']: per-pair angular frequencies, scaled when ``cfg.rope_scaling`` is set."""
    dim = cfg.head_dim
    # transformers computes in float32 from an int64 arange; mirror it for bit-level agreement.
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponents)).astype(np.float32)
    if cfg.rope_scaling is not None:
        inv_freq = _llama3_scale(inv_freq, cfg.rope_scaling).astype(np.float32)
    return inv_freq


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray | Array) -> Array:
    """Rotate ``x``: Float['B T N Dh'] at Int['B T'] ``positions``; returns x's dtype."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B T Dh/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B T 1 Dh]
    cos = jnp.cos(angles).astype(x.dtype)
    sin = jnp.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
