"""Sampler/learner mismatch (``LossConfig.is_correction``; :func:`rollout_correction`): the
rollout's behaviour logprobs ``mu`` come from the sampler (another dtype, kernels, or a stale
policy); the learner recomputes ``pi_old`` at the step's starting weights. The PPO ratio then uses
``pi_old`` and the per-token loss is corrected with ``rho = pi_old / mu`` (verl's "rollout
correction", ``algorithm.rollout_correction``; F. Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training", fengyao.notion.site/off-policy-rl): truncated IS
multiplies the per-token policy loss by ``min(rho, cap)``, masked IS drops the tokens (sequences)
whose ``rho`` leaves ``[1/cap, cap]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_agents.algos.aggregation import clamp_log_ratio, masked_mean, sequence_sum

Array = jax.Array
IS_CORRECTIONS = ("none", "tis_token", "tis_seq", "mis_token", "mis_seq", "mis_geo")


class RolloutCorrection(NamedTuple):
    """What :func:`rollout_correction` returns (``Float['B T']`` arrays, scalar diagnostics)."""

    weights: Array | None
    """Truncated-IS weights for the per-token policy loss (``tis_*``), else None."""
    keep: Array | None
    """1 where a token stays in the loss, 0 where masked IS drops it (``mis_*``), else None."""
    weight_mean: Array
    """Mean correction weight over the sampled tokens (the kept fraction for ``mis_*``; 1 for
    ``none``)."""
    truncated_frac: Array
    """Fraction of sampled tokens whose weight was truncated at the cap (NaN unless ``tis_*``)."""
    masked_frac: Array
    """Fraction of sampled tokens dropped (NaN unless ``mis_*``)."""
    mismatch_kl: Array
    """k3 estimate of KL(mu || pi_old) from the behaviour samples, ``exp(l) - 1 - l`` with
    ``l = log pi_old - log mu`` (clamped to +-20), token mean (verl's ``rollout_corr/k3_kl``)."""


def rollout_correction(
    old_logprobs: Array,
    behaviour_logprobs: Array,
    loss_mask: Array,
    *,
    mode: str,
    cap: float,
    segment_ids: Array | None = None,
) -> RolloutCorrection:
    """Importance correction between the sampler's behaviour policy ``mu`` and the learner's
    ``pi_old`` (see ``LossConfig.is_correction``), following verl's ``rollout_corr_helper``.

    ``log rho_t = log pi_old - log mu`` per sampled token; a sequence's ratio is the product
    ``exp(sum_t log rho_t)`` (``*_seq``) or the geometric mean ``exp(mean_t log rho_t)``
    (``mis_geo``), each log clamped to +-20 before ``exp``. Sequences are the segments of
    ``segment_ids`` (packed rows), else the rows. No gradient flows.
    """
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"unknown is_correction {mode!r}; valid: {', '.join(IS_CORRECTIONS)}")
    sg = jax.lax.stop_gradient
    m = loss_mask
    on = m > 0
    lr = jnp.where(on, sg(old_logprobs) - sg(behaviour_logprobs), 0.0)
    lr_c = clamp_log_ratio(lr)
    nan = jnp.full((), jnp.nan, jnp.float32)
    mismatch = masked_mean(jnp.expm1(lr_c) - lr_c, m)
    if mode == "none":
        return RolloutCorrection(None, None, jnp.ones((), jnp.float32), nan, nan, mismatch)
    if mode.endswith("_token"):
        log_w = lr_c
    elif mode.endswith("_seq"):
        log_w = clamp_log_ratio(sequence_sum(lr, segment_ids))
    else:  # mis_geo
        n_tok = jnp.maximum(sequence_sum(m, segment_ids), 1.0)
        log_w = clamp_log_ratio(sequence_sum(lr, segment_ids) / n_tok)
    log_cap = math.log(cap)
    if mode.startswith("tis"):
        truncated = on & (log_w > log_cap)
        w = jnp.where(on, jnp.minimum(jnp.exp(log_w), cap), 0.0)
        return RolloutCorrection(
            weights=w,
            keep=None,
            weight_mean=masked_mean(w, m),
            truncated_frac=masked_mean(truncated.astype(m.dtype), m),
            masked_frac=nan,
            mismatch_kl=mismatch,
        )
    inside = (log_w >= -log_cap) & (log_w <= log_cap)
    keep = jnp.where(on & inside, 1.0, 0.0).astype(m.dtype)
    return RolloutCorrection(
        weights=None,
        keep=keep,
        weight_mean=masked_mean(keep, m),
        truncated_frac=nan,
        masked_frac=masked_mean(1.0 - keep, m),
        mismatch_kl=mismatch,
    )
