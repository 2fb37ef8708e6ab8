"""Token logprobs and entropies from the policy without materialising ``[B, T, V]`` logits.

The final hidden states are cut into sequence chunks; each chunk is projected to logits, reduced to
(logprob of the target, entropy) and dropped. ``jax.checkpoint`` on the chunk function makes the
backward pass recompute a chunk's logits instead of storing them, so peak memory is
``B * chunk * V`` floats rather than ``B * T * V``.

This is the same model code the sampler runs (``Transformer.hidden_states`` +
``logits_from_hidden``), so sampler logprobs and training logprobs agree (the on-policy invariant;
tested in ``tests/training``).

**Sampling transform.** Rollouts sampled with a temperature or a top-k / top-p / min-p filter
store the logprob under the distribution actually sampled from (``GenerationResult.
sampling_logprobs``). Given the same :class:`SamplingTransform`, :func:`token_stats` computes the
learner's logprob under that same distribution, per position, with the sampler's own code
(``generation.sampling.filter_logits``): ``logits / T``, then the top-k -> top-p -> min-p mask,
then ``log_softmax`` over the kept set. With shared weights and dtype the PPO ratio then starts at
exactly 1 (tested in ``tests/training/test_sampling_logprobs.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

OUT_OF_SUPPORT_LOGPROB = -1.0e4
"""Logprob reported for a target the transform filters out (probability 0). Finite so that
differences and masked products stay finite (``-inf - -inf`` would be NaN); ``exp`` of it is 0
and its gradient is 0."""

_THRESHOLD = "sampling_threshold"


@dataclasses.dataclass(frozen=True)
class SamplingTransform:
    """The sampling distribution's transform of the policy logits (hashable: a static setting).

    Same fields, meaning and order as :class:`~jaxrl_agents.generation.SamplingParams`:
    temperature, then top-k, top-p, min-p. Build it from the rollout settings with
    :meth:`from_rollout`; ``None`` (or :attr:`identity`) means temperature 1, unfiltered.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        from jaxrl_agents.generation.config import check_sampling

        check_sampling(self, greedy_ok=False)

    @property
    def identity(self) -> bool:
        """True when the transform leaves the policy unchanged (temperature 1, no filter)."""
        return self.temperature == 1.0 and not self.filters

    @property
    def filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @classmethod
    def from_rollout(cls, rollout: Any) -> SamplingTransform | None:
        """The transform of training rollouts sampled with ``rollout`` (a ``RolloutConfig``, or
        anything whose ``sampling`` has ``temperature, top_k, top_p, min_p``). None when it is the
        identity or greedy (temperature 0: the stored logprobs are then the temperature-1
        policy's)."""
        t = float(rollout.sampling.temperature)
        if t <= 0.0:
            return None
        out = cls(
            temperature=t,
            top_k=int(rollout.sampling.top_k),
            top_p=float(rollout.sampling.top_p),
            min_p=float(rollout.sampling.min_p),
        )
        return None if out.identity else out


def normalize_transform(sampling: SamplingTransform | None) -> SamplingTransform | None:
    """None for no transform or the identity, else ``sampling``."""
    if sampling is None:
        return None
    if not isinstance(sampling, SamplingTransform):
        raise TypeError(f"sampling must be a SamplingTransform or None, got {type(sampling)}")
    return None if sampling.identity else sampling


class TokenStats(NamedTuple):
    logprobs: jax.Array  # Float['B T'] log pi_s(target_t | prefix): under the sampling transform
    entropy: jax.Array  # Float['B T'] entropy of pi_s(. | prefix) (the transformed distribution)
    policy_logprobs: jax.Array | None = None
    """Float['B T'] log pi(target_t | prefix) at temperature 1, unfiltered (the policy itself);
    the same array as ``logprobs`` without a transform."""
    values: jax.Array | None = None
    """Float['B T'] the critic's values (``with_values``; ``training.critic``)."""


def _transformed(logits: jax.Array, sampling: SamplingTransform):
    """``(scaled logits, keep mask or None)`` of the sampling distribution, per position.

    The kept set is the sampler's (``generation.sampling.filter_logits`` on the same scaled
    logits). Its bisection loop cannot be reverse-differentiated and costs a few dozen passes
    over the vocabulary, so it runs on stop-gradient logits and is reduced to one threshold per
    position (the smallest kept logit: ``{scaled >= it}`` is exactly the kept set); the threshold
    is saved for the backward pass (``checkpoint_name``), which then recomputes only the mask.
    """
    from jax.ad_checkpoint import checkpoint_name

    from jaxrl_agents.generation.sampling import filter_logits

    scaled = logits / jnp.float32(sampling.temperature)
    if not sampling.filters:
        return scaled, None
    lead, V = scaled.shape[:-1], scaled.shape[-1]
    flat = jax.lax.stop_gradient(scaled).reshape(-1, V)
    rows = flat.shape[0]
    masked = filter_logits(
        flat,
        top_k=jnp.full((rows,), sampling.top_k, jnp.int32),
        top_p=jnp.full((rows,), sampling.top_p, jnp.float32),
        min_p=jnp.full((rows,), sampling.min_p, jnp.float32),
    )
    thr = jnp.min(jnp.where(masked > -jnp.inf, flat, jnp.inf), axis=-1).reshape(lead)
    thr = checkpoint_name(jax.lax.stop_gradient(thr), _THRESHOLD)
    return scaled, scaled >= thr[..., None]


def token_stats(
    model,
    input_ids: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array,
    target_ids: jax.Array,
    *,
    chunk: int = 128,
    with_entropy: bool = True,
    sampling: SamplingTransform | None = None,
    with_values: bool = False,
) -> TokenStats:
    """Logprob of each ``target_ids[b, t]`` and the entropy at each position.

    Shapes: ``input_ids, positions, segment_ids, target_ids: Int['B T']`` -> ``Float['B T']``.
    ``T`` must be a multiple of ``chunk`` or smaller than it.

    ``sampling``: the distribution the rollout sampled from (None: temperature 1, unfiltered).
    ``logprobs`` and ``entropy`` are then under that distribution, and ``policy_logprobs`` under
    the policy itself. A target outside the kept set gets ``OUT_OF_SUPPORT_LOGPROB`` with zero
    gradient.
    """
    sampling = normalize_transform(sampling)
    hidden, _ = model.hidden_states(input_ids, positions, segment_ids=segment_ids)
    vals = None
    if with_values:
        from jaxrl_agents.training.critic import values as critic_values

        vals = critic_values(model, hidden)
    B, T, D = hidden.shape
    c = min(chunk, T)
    if T % c:
        raise ValueError(f"sequence length {T} is not a multiple of the logprob chunk {c}")
    n = T // c
    # [n, B, c, ...] so lax.map walks the chunks.
    h = hidden.reshape(B, n, c, D).swapaxes(0, 1)
    tgt = target_ids.reshape(B, n, c).swapaxes(0, 1)

    def pick(x, t_c):
        return jnp.take_along_axis(x, t_c[..., None], axis=-1)[..., 0]

    def one(args):
        h_c, t_c = args
        logits = model.logits_from_hidden(h_c).astype(jnp.float32)  # [B, c, V]
        logz = jax.nn.logsumexp(logits, axis=-1)
        policy_lp = pick(logits, t_c) - logz
        if sampling is None:
            s, keep, s_logz, lp = logits, None, logz, policy_lp
        else:
            s, keep = _transformed(logits, sampling)
            masked = s if keep is None else jnp.where(keep, s, -jnp.inf)
            s_logz = jax.nn.logsumexp(masked, axis=-1)
            lp = pick(s, t_c) - s_logz
            if keep is not None:
                lp = jnp.where(pick(keep, t_c), lp, OUT_OF_SUPPORT_LOGPROB)
        if with_entropy:
            p = jnp.exp(s - s_logz[..., None])
            ps = p * s if keep is None else jnp.where(keep, p * s, 0.0)
            ent = s_logz - jnp.sum(ps, axis=-1)
        else:
            ent = jnp.zeros_like(lp)
        return lp, ent, policy_lp

    policy = jax.checkpoint_policies.save_only_these_names(_THRESHOLD)
    lp, ent, policy_lp = jax.lax.map(jax.checkpoint(one, policy=policy), (h, tgt))
    unchunk = lambda x: x.swapaxes(0, 1).reshape(B, T)
    lp, ent = unchunk(lp), unchunk(ent)
    return TokenStats(lp, ent, lp if sampling is None else unchunk(policy_lp), vals)
