"""A ragged decode-attention kernel over the KV cache (Pallas), for one query per row.

The reference decode step (``attention._attend`` with ``T == 1``) scores every cached position of
the attention window for every row and masks the ones past the row's length, so a step costs the
window, not the row's context, and XLA lowers it to several kernels per layer. This kernel runs one
program per (row, KV head): it walks the row's own visible positions in blocks of ``block`` keys
with an online softmax (FlashAttention's running max / sum), so a short row stops early and the
scores never leave registers. All G query heads of a KV head share each loaded key block (GQA).

Layouts are the cache's: ``k`` is ``[B K S Dh]`` (stacked layers) or ``[B K Dh S]`` with ``k_t``
(the sampler's unrolled per-layer cache), ``v`` is ``[B K S Dh]``. ``lengths[b]`` is the number of
visible positions of row ``b`` (at least 1: the token being decoded was written before attending).

Where it runs: on GPU through Pallas' Triton lowering; on CPU only in interpret mode (tests check
it equals the reference path there). Whether it beats the reference step on a GPU is a measurement
(``scripts/gpu_check.sh`` times both); ``ModelConfig.decode_attention`` keeps ``reference`` the
default until one says otherwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl

_NEG = -1e30


def _kernel(len_ref, q_ref, k_ref, v_ref, o_ref, *, block: int, k_t: bool, scale: float):
    b = pl.program_id(0)
    n = len_ref[b]
    q = q_ref[0, 0].astype(jnp.float32) * scale  # [G Dh]
    G, Dh = q.shape

    def body(i, carry):
        m, l, acc = carry
        start = pl.multiple_of(i * block, block)
        if k_t:
            kb = k_ref[0, 0, :, pl.ds(start, block)].astype(jnp.float32)  # [Dh BS]
            s = jnp.dot(q, kb)  # [G BS]
        else:
            kb = k_ref[0, 0, pl.ds(start, block), :].astype(jnp.float32)  # [BS Dh]
            s = jnp.dot(q, kb.T)
        vb = v_ref[0, 0, pl.ds(start, block), :].astype(jnp.float32)  # [BS Dh]
        pos = start + lax.broadcasted_iota(jnp.int32, (G, block), 1)
        s = jnp.where(pos < n, s, _NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        return m_new, l * corr + jnp.sum(p, axis=1), acc * corr[:, None] + jnp.dot(p, vb)

    init = (
        jnp.full((G,), _NEG, jnp.float32),
        jnp.zeros((G,), jnp.float32),
        jnp.zeros((G, Dh), jnp.float32),
    )
    _, l, acc = lax.fori_loop(0, pl.cdiv(n, block), body, init)
    o_ref[0, 0] = (acc / l[:, None]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("k_t", "block", "interpret"))
def ragged_decode_attention(
    q: Array,
    k: Array,
    v: Array,
    lengths: Array,
    *,
    k_t: bool = False,
    block: int = 128,
    interpret: bool | None = None,
) -> Array:
    """Attention of one query per row over each row's first ``lengths[b]`` cached positions.

    q: Float['B H Dh']; k: Float['B K S Dh'] (Float['B K Dh S'] with ``k_t``); v: Float['B K S Dh'];
    lengths: Int['B'] (>= 1). Returns Float['B H Dh'] in ``v``'s dtype (float32 accumulation).
    ``block`` must divide S (it is lowered to the largest power of two that does). ``interpret``:
    default True off GPU.
    """
    B, H, Dh = q.shape
    K = k.shape[1]
    S = v.shape[2]
    G = H // K
    while S % block:
        block //= 2
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    qg = q.reshape(B, K, G, Dh)
    k_block = (1, 1, Dh, S) if k_t else (1, 1, S, Dh)
    out = pl.pallas_call(
        functools.partial(_kernel, block=block, k_t=k_t, scale=Dh**-0.5),
        grid=(B, K),
        in_specs=[
            pl.BlockSpec((B,), lambda b, h: (0,)),
            pl.BlockSpec((1, 1, G, Dh), lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec(k_block, lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec((1, 1, S, Dh), lambda b, h: (b, h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((1, 1, G, Dh), lambda b, h: (b, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, K, G, Dh), v.dtype),
        interpret=interpret,
    )(lengths.astype(jnp.int32), qg, k, v)
    return out.reshape(B, H, Dh)
