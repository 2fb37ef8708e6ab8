"""Token logprobs and entropies from the policy without materialising ``[B, T, V]`` logits.

The final hidden states are cut into sequence chunks; each chunk is projected to logits, reduced to
(logprob of the target, entropy) and dropped. ``jax.checkpoint`` on the chunk function makes the
backward pass recompute a chunk's logits instead of storing them, so peak memory is
``B * chunk * V`` floats rather than ``B * T * V``.

This is the same model code the sampler runs (``Transformer.hidden_states`` +
``logits_from_hidden``), so sampler logprobs and training logprobs agree (the on-policy invariant;
tested in ``tests/training``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class TokenStats(NamedTuple):
    logprobs: jax.Array  # Float['B T'] log pi(target_t | prefix), temperature 1
    entropy: jax.Array  # Float['B T'] entropy of pi(. | prefix)


def token_stats(
    model,
    input_ids: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array,
    target_ids: jax.Array,
    *,
    chunk: int = 128,
    with_entropy: bool = True,
) -> TokenStats:
    """Logprob of each ``target_ids[b, t]`` and the policy entropy at each position.

    Shapes: ``input_ids, positions, segment_ids, target_ids: Int['B T']`` -> ``Float['B T']`` x2.
    ``T`` must be a multiple of ``chunk`` or smaller than it.
    """
    hidden, _ = model.hidden_states(input_ids, positions, segment_ids=segment_ids)
    B, T, D = hidden.shape
    c = min(chunk, T)
    if T % c:
        raise ValueError(f"sequence length {T} is not a multiple of the logprob chunk {c}")
    n = T // c
    # [n, B, c, ...] so lax.map walks the chunks.
    h = hidden.reshape(B, n, c, D).swapaxes(0, 1)
    tgt = target_ids.reshape(B, n, c).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        h_c, t_c = args
        logits = model.logits_from_hidden(h_c).astype(jnp.float32)  # [B, c, V]
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t_c[..., None], axis=-1)[..., 0]
        lp = picked - logz
        if with_entropy:
            p = jax.nn.softmax(logits, axis=-1)
            ent = logz - jnp.sum(p * logits, axis=-1)
        else:
            ent = jnp.zeros_like(lp)
        return lp, ent

    lp, ent = jax.lax.map(one, (h, tgt))
    return TokenStats(lp.swapaxes(0, 1).reshape(B, T), ent.swapaxes(0, 1).reshape(B, T))
