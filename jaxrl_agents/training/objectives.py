"""Losses as seen by the train step: SFT (masked NLL) and RL (the configured policy loss).

Gradient accumulation is exact: every micro-batch divides by the *full* batch's aggregation
denominator (``LossInputs.denom``: tokens for token-mean, sequences for the seq-mean modes; see
``algos.aggregation_denominator``), so micro-batch losses sum to the loss of the whole batch
(tested in ``tests/training``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_agents.batches import TrainBatch
from jaxrl_agents.training.logprobs import SamplingTransform, token_stats
from jaxrl_agents.training.step import LossInputs


class RLLossInputs(NamedTuple):
    """``LossInputs`` of the RL loss, plus the truncated-IS weights of a mismatch correction
    (``training.update`` builds them; :func:`rl_loss` also accepts a plain ``LossInputs``)."""

    denom: jax.Array
    """Float[]: the full batch's aggregation denominator (see ``LossInputs.denom``)."""
    ref_logprobs: jax.Array | None = None
    """Float['B T']: the frozen reference's (temperature-1) logprobs, when a KL loss term is on."""
    is_weights: jax.Array | None = None
    """Float['B T']: truncated-IS weights multiplying the per-token policy loss (``tis_*``)."""
    old_values: jax.Array | None = None
    """Float['B T']: the critic's values at the step's starting weights (clipped value loss)."""


def _stats(
    model,
    mb: TrainBatch,
    *,
    chunk: int,
    with_entropy: bool,
    sampling=None,
    with_values: bool = False,
):
    return token_stats(
        model,
        mb.input_ids,
        mb.positions,
        mb.segment_ids,
        mb.target_ids,
        chunk=chunk,
        with_entropy=with_entropy,
        sampling=sampling,
        with_values=with_values,
    )


def sft_loss(*, chunk: int):
    """Token-mean negative log-likelihood over assistant tokens (same mask as RL)."""

    def loss_fn(model, mb: TrainBatch, extra: LossInputs):
        stats = _stats(model, mb, chunk=chunk, with_entropy=False)
        mask = mb.loss_mask
        nll_sum = -jnp.sum(stats.logprobs * mask)
        loss = nll_sum / jnp.maximum(extra.denom, 1.0)
        n = jnp.maximum(jnp.sum(mask), 1.0)
        return loss, {"nll": nll_sum / n, "tokens": jnp.sum(mask)}

    return loss_fn


def rl_loss(loss_cfg: Any, *, chunk: int, sampling: SamplingTransform | None = None):
    """The configured policy loss (``algos.policy_loss``) on a rollout batch (one trajectory per
    row or packed rows: every per-sequence reduction is per segment of ``mb.segment_ids``).

    ``extra`` (``RLLossInputs`` or ``LossInputs``) holds the full-batch aggregation denominator,
    the reference logprobs when a KL loss term to the frozen reference is on, and the
    truncated-IS weights of a mismatch correction.

    ``sampling``: the transform the rollouts were sampled under (temperature, top-k/p, min-p;
    None: temperature 1, unfiltered). The learner's logprobs, the ratio and the entropy are under
    it, so that they match the stored behaviour logprobs; the KL term to the reference compares
    the policies themselves (temperature-1 logprobs of both).
    """
    from jaxrl_agents.algos import policy_loss

    def loss_fn(model, mb: TrainBatch, extra: LossInputs | RLLossInputs):
        need_entropy = getattr(loss_cfg, "entropy_coef", 0.0) != 0.0
        critic = loss_cfg.vf_coef > 0
        stats = _stats(
            model, mb, chunk=chunk, with_entropy=True, sampling=sampling, with_values=critic
        )
        loss, metrics = policy_loss(
            logprobs=stats.logprobs,
            old_logprobs=mb.old_logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            cfg=loss_cfg,
            ref_logprobs=extra.ref_logprobs,
            entropy=stats.entropy if need_entropy else None,
            denominator=extra.denom,
            is_weights=getattr(extra, "is_weights", None),
            policy_logprobs=stats.policy_logprobs,
            values=stats.values if critic else None,
            old_values=getattr(extra, "old_values", None) if critic else None,
            returns=mb.returns if critic else None,
            segment_ids=mb.segment_ids,  # packed rows: per-sequence terms are per segment
        )
        mask = mb.loss_mask
        n = jnp.maximum(jnp.sum(mask), 1.0)
        metrics = {
            **metrics,
            "entropy": jnp.sum(stats.entropy * mask) / n,
            "logprob_diff": jnp.sum(jnp.abs(stats.logprobs - mb.old_logprobs) * mask) / n,
        }
        return loss, metrics

    return loss_fn
