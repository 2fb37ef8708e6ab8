"""Losses as seen by the train step: SFT (masked NLL) and RL (the configured policy loss).

Gradient accumulation is exact: every micro-batch divides by the *full* batch's aggregation
denominator (``LossInputs.denom``: tokens for token-mean, sequences for the seq-mean modes; see
``algos.aggregation_denominator``), so micro-batch losses sum to the loss of the whole batch
(tested in ``tests/training``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from jaxrl_agents.rollout.packing import TrainBatch
from jaxrl_agents.training.logprobs import token_stats
from jaxrl_agents.training.step import LossInputs


def _stats(model, mb: TrainBatch, *, chunk: int, with_entropy: bool):
    return token_stats(
        model, mb.input_ids, mb.positions, mb.segment_ids, mb.target_ids,
        chunk=chunk, with_entropy=with_entropy,
    )  # fmt: skip


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


def rl_loss(loss_cfg: Any, *, chunk: int):
    """The configured policy loss (``algos.policy_loss``) on a packed rollout batch.

    ``extra`` holds the full-batch aggregation denominator and, when a KL loss term to the
    frozen reference is on, the reference logprobs.
    """
    from jaxrl_agents.algos import policy_loss

    def loss_fn(model, mb: TrainBatch, extra: LossInputs):
        need_entropy = getattr(loss_cfg, "entropy_coef", 0.0) != 0.0
        stats = _stats(model, mb, chunk=chunk, with_entropy=True)
        loss, metrics = policy_loss(
            logprobs=stats.logprobs,
            old_logprobs=mb.old_logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            cfg=loss_cfg,
            ref_logprobs=extra.ref_logprobs,
            entropy=stats.entropy if need_entropy else None,
            denominator=extra.denom,
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
