"""Policy losses (PPO-clip with clip-higher and dual-clip, GSPO, CISPO, vanilla PG), the clipped
value loss, entropy bonus and KL term, aggregated by one of the four published loss-aggregation
modes (``algos.aggregation``, whose module docstring lists them, with packed rows and the
log-ratio clamp).

All inputs are ``Float['B T']`` arrays aligned with ``batches.TrainBatch`` (position ``t`` describes
token ``t + 1``); only positions with ``loss_mask == 1`` contribute. Usage::

    loss, metrics = policy_loss(logprobs=lp, old_logprobs=batch.old_logprobs,
                                advantages=batch.advantages, loss_mask=batch.loss_mask, cfg=cfg)

Packed rows: pass ``segment_ids`` and every per-sequence quantity is per segment, so a packed
batch gives the same loss and gradients as one trajectory per row.

Sampler/learner mismatch (``LossConfig.is_correction``): :func:`rollout_correction`
(``algos.correction``) weights or masks the per-token loss by ``rho = pi_old / mu``.

Deviation: the value loss uses the same aggregation mode (and denominator) as the policy loss, so
micro-batch weighting stays consistent; published PPO code mostly uses token-mean for it.

The aggregation and correction names stay importable from here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_agents.algos.aggregation import (
    AGG_MODES,
    LOG_RATIO_BOUND,
    aggregate,
    aggregation_denominator,
    clamp_log_ratio,
    masked_mean,
    sequence_sum,
    sequence_table,
)
from jaxrl_agents.algos.correction import IS_CORRECTIONS, RolloutCorrection, rollout_correction
from jaxrl_agents.algos.kl import KL_ESTIMATORS, kl_penalty

__all__ = [
    "AGG_MODES",
    "IS_CORRECTIONS",
    "LOG_RATIO_BOUND",
    "POLICY_LOSSES",
    "LossConfig",
    "LossFn",
    "RolloutCorrection",
    "TokenLoss",
    "aggregate",
    "aggregation_denominator",
    "clamp_log_ratio",
    "cispo",
    "gspo",
    "masked_mean",
    "policy_loss",
    "ppo_clip",
    "register_policy_loss",
    "rollout_correction",
    "sequence_sum",
    "sequence_table",
    "value_loss",
    "vanilla_pg",
]

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Policy-loss choice and coefficients (Hydra group ``loss``)."""

    name: str = "ppo_clip"
    """Registered policy loss (see ``POLICY_LOSSES``)."""
    clip_low: float = 0.2
    """Ratio clip below: ``1 - clip_low``."""
    clip_high: float = 0.2
    """Ratio clip above: ``1 + clip_high`` (clip-higher, DAPO: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant ``c > 1`` (Ye et al. 2020) bounding the loss of negative advantages."""
    agg_mode: str = "token-mean"
    """One of ``AGG_MODES``."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference term (0 disables it)."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 (see ``algos.kl``)."""
    kl_as_reward: bool = False
    """Apply KL as a reward penalty (``algos.kl.kl_reward``) instead of as a loss term."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (subtracted from the loss)."""
    vf_coef: float = 0.0
    """Value-loss weight (GAE / turn-level GAE with a value head)."""
    vf_clip: float | None = None
    """Clip of the value prediction around the rollout's value (PPO's clipped value loss)."""
    max_len_norm: int | None = None
    """Dr. GRPO's constant for ``seq-mean-token-sum-norm``; None: the padded length ``T`` (the
    row length, which packed rows change: the jobs resolve None to the generation budget,
    ``jobs.system.effective_loss``)."""
    is_correction: str = "none"
    """Sampler/learner mismatch correction (one of ``IS_CORRECTIONS``), with ``rho = pi_old / mu``
    (``pi_old``: the learner at the step's starting weights, ``mu``: the sampler's behaviour
    logprob). Any value but ``none`` adds one forward pass per step (``pi_old``), which then
    replaces ``mu`` as the PPO ratio's denominator.

    * ``tis_token``: per-token loss x ``min(rho_t, cap)`` (verl ``rollout_is: token``).
    * ``tis_seq``:   per-token loss x ``min(prod_t rho_t, cap)`` (product over the sequence's
      sampled tokens, verl ``rollout_is: sequence``).
    * ``mis_token``: drop tokens with ``rho_t`` outside ``[1/cap, cap]`` (verl ``rollout_rs:
      token``).
    * ``mis_seq``:   drop sequences whose product ``prod_t rho_t`` leaves ``[1/cap, cap]``
      (verl ``rollout_rs: sequence``).
    * ``mis_geo``:   drop sequences whose geometric mean ``exp(mean_t log rho_t)`` leaves
      ``[1/cap, cap]`` (verl ``rollout_rs: geometric``; use a cap close to 1, e.g. 1.001-1.01).

    Dropped tokens leave the loss mask (every term and the aggregation denominators), as verl's
    rejection does; truncation weights only the policy-gradient term."""
    is_cap: float = 2.0
    """The truncation cap / masking bound of ``is_correction`` (verl ``rollout_is_threshold``,
    default 2.0; the masking range is ``[1/is_cap, is_cap]``). Must be > 1."""

    def __post_init__(self) -> None:
        if self.name not in POLICY_LOSSES:
            raise ValueError(
                f"unknown policy loss {self.name!r}; valid: {', '.join(sorted(POLICY_LOSSES))}"
            )
        if self.agg_mode not in AGG_MODES:
            raise ValueError(f"unknown agg_mode {self.agg_mode!r}; valid: {', '.join(AGG_MODES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"unknown kl_estimator {self.kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}"
            )
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be None or > 1, got {self.dual_clip}")
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip_low={self.clip_low} / clip_high={self.clip_high} must be >= 0")
        if self.is_correction not in IS_CORRECTIONS:
            raise ValueError(
                f"unknown is_correction {self.is_correction!r}; valid: {', '.join(IS_CORRECTIONS)}"
            )
        if not self.is_cap > 1.0:
            raise ValueError(f"is_cap={self.is_cap} must be > 1 (masking keeps [1/cap, cap])")


# -- policy losses ----------------------------------------------------------------------------


def _ratio(logprobs: Array, old_logprobs: Array) -> Array:
    return jnp.exp(clamp_log_ratio(logprobs - jax.lax.stop_gradient(old_logprobs)))


class TokenLoss(NamedTuple):
    loss: Array  # Float['B T']  per-token policy loss (to be aggregated)
    ratio: Array  # Float['B T']  importance ratio used
    clipped: Array  # Bool['B T']  where clipping changed the (value or gradient of the) loss


LossFn = Callable[..., TokenLoss]
POLICY_LOSSES: dict[str, LossFn] = {}


def register_policy_loss(name: str):
    """Register ``fn(*, logprobs, old_logprobs, advantages, loss_mask, cfg) -> TokenLoss``.

    A loss that reduces over a sequence (as GSPO does) takes a ``segment_ids`` keyword too and
    reduces per segment (``sequence_sum``): packed rows hold several sequences. Losses without
    that keyword are called without it."""

    def deco(fn: LossFn) -> LossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def _clipped_surrogate(ratio: Array, adv: Array, cfg: LossConfig) -> tuple[Array, Array]:
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = jnp.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if cfg.dual_clip is not None:
        # Negative advantage and a huge ratio: bound the loss at -c*A (Ye et al. 2020).
        bound = -adv * cfg.dual_clip
        dual = (adv < 0) & (bound < loss)
        loss = jnp.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


@functools.cache
def _takes_segments(fn: LossFn) -> bool:
    params = inspect.signature(fn).parameters
    return "segment_ids" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@register_policy_loss("ppo_clip")
def ppo_clip(*, logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig) -> TokenLoss:
    """PPO (Schulman et al. 2017) with decoupled clip (DAPO, Yu et al. 2025) and optional
    dual-clip: ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))``, ``r = exp(logp - logp_old)``
    (log-ratio clamped to +-20)."""
    ratio = _ratio(logprobs, old_logprobs)
    loss, clipped = _clipped_surrogate(ratio, advantages, cfg)
    return TokenLoss(loss, ratio, clipped)


@register_policy_loss("gspo")
def gspo(
    *, logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig, segment_ids=None
) -> TokenLoss:
    """GSPO (Zheng et al. 2025), token form: the sequence ratio ``s_i = exp(mean_t (logp -
    logp_old))`` clipped as in PPO; ``s_it = sg(s_i) * pi/sg(pi)`` carries the gradient
    ``s_i grad logp_t`` so that with per-sequence advantages and ``seq-mean-token-mean`` this is
    exactly GSPO. Clip ranges are ~1e-4 (paper: 3e-4 / 4e-4), not PPO's 0.2. Sequences are the
    segments of ``segment_ids`` (packed rows), else the rows."""
    lr = jnp.where(loss_mask > 0, logprobs - jax.lax.stop_gradient(old_logprobs), 0.0)
    n = sequence_sum(loss_mask, segment_ids)
    seq_lr = clamp_log_ratio(sequence_sum(lr, segment_ids) / jnp.maximum(n, 1.0))
    ratio = jnp.exp(jax.lax.stop_gradient(seq_lr) + logprobs - jax.lax.stop_gradient(logprobs))
    loss, clipped = _clipped_surrogate(ratio, advantages, cfg)
    return TokenLoss(loss, ratio, clipped)


@register_policy_loss("cispo")
def cispo(*, logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig) -> TokenLoss:
    """CISPO (MiniMax-M1, 2025): ``-sg(clip(r, 1-eps_low, 1+eps_high)) A logp``. The importance
    weight is clipped and detached, so no token's gradient is dropped (unlike PPO's clip)."""
    ratio = _ratio(logprobs, old_logprobs)
    w = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high))
    clipped = (ratio < 1.0 - cfg.clip_low) | (ratio > 1.0 + cfg.clip_high)
    return TokenLoss(-w * advantages * logprobs, ratio, clipped)


@register_policy_loss("vanilla_pg")
def vanilla_pg(*, logprobs, old_logprobs, advantages, loss_mask, cfg: LossConfig) -> TokenLoss:
    """REINFORCE (Williams 1992): ``-A logp`` (on-policy; no importance ratio)."""
    ratio = jax.lax.stop_gradient(_ratio(logprobs, old_logprobs))
    return TokenLoss(-advantages * logprobs, ratio, jnp.zeros_like(ratio, bool))


# -- the full objective -----------------------------------------------------------------------


def value_loss(
    values: Array, returns: Array, *, old_values: Array | None, vf_clip: float | None
) -> tuple[Array, Array]:
    """Per-token ``0.5 max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2)`` and the clip mask."""
    err = (values - returns) ** 2
    if vf_clip is None or old_values is None:
        return 0.5 * err, jnp.zeros_like(err, bool)
    v_clip = old_values + jnp.clip(values - old_values, -vf_clip, vf_clip)
    err_clip = (v_clip - returns) ** 2
    return 0.5 * jnp.maximum(err, err_clip), err_clip > err


def _pg_term(
    agg: Callable[[Array], Array],
    *,
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    cfg: LossConfig,
    is_weights: Array | None,
    segment_ids: Array | None,
) -> tuple[Array, dict[str, Array]]:
    """The policy-gradient term of :func:`policy_loss` (``cfg.name``'s token loss, weighted by
    ``is_weights``, aggregated by ``agg``) and its metrics: pg_loss, clip_frac, approx_kl,
    ratio_mean, ratio_max."""
    m = loss_mask
    fn = POLICY_LOSSES[cfg.name]
    seg = {"segment_ids": segment_ids} if segment_ids is not None and _takes_segments(fn) else {}
    tok = fn(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=jax.lax.stop_gradient(advantages),
        loss_mask=m,
        cfg=cfg,
        **seg,
    )
    tok_loss = tok.loss
    if is_weights is not None:
        tok_loss = tok_loss * jax.lax.stop_gradient(is_weights)
    pg = agg(tok_loss)
    ratio = jax.lax.stop_gradient(tok.ratio)
    log_ratio = clamp_log_ratio(jax.lax.stop_gradient(logprobs - old_logprobs))
    metrics = {
        "pg_loss": pg,
        "clip_frac": masked_mean(tok.clipped.astype(m.dtype), m),
        "approx_kl": masked_mean(jnp.expm1(log_ratio) - log_ratio, m),
        "ratio_mean": masked_mean(ratio, m),
        "ratio_max": jnp.max(jnp.where(m > 0, ratio, -jnp.inf)),
    }
    return pg, metrics


def policy_loss(
    *,
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    cfg: LossConfig,
    ref_logprobs: Array | None = None,
    entropy: Array | None = None,
    values: Array | None = None,
    old_values: Array | None = None,
    returns: Array | None = None,
    denominator: Array | None = None,
    is_weights: Array | None = None,
    policy_logprobs: Array | None = None,
    segment_ids: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Scalar loss ``pg + kl_coef kl - entropy_coef H + vf_coef vf`` and metrics.

    All array arguments are ``Float['B T']``; ``denominator`` overrides the aggregation denominator
    (micro-batching). ``is_weights`` (truncated-IS weights, :func:`rollout_correction`) multiply
    the per-token policy-gradient loss (no gradient through them). ``policy_logprobs``: the
    policy's own (temperature-1, unfiltered) logprobs for the KL term when ``logprobs`` are under
    a sampling transform (default: ``logprobs``). ``segment_ids``: the sequences of packed rows
    (see the module docstring; None: one per row). Metrics: loss, pg_loss, clip_frac, approx_kl
    (k3 of old vs new), ratio_mean, ratio_max, and kl / entropy / vf_loss / vf_clip_frac when
    those terms are present.
    """
    m = loss_mask
    agg = functools.partial(
        aggregate,
        mask=m,
        mode=cfg.agg_mode,
        max_len=cfg.max_len_norm,
        denominator=denominator,
        segment_ids=segment_ids,
    )
    pg, metrics = _pg_term(
        agg,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        loss_mask=m,
        cfg=cfg,
        is_weights=is_weights,
        segment_ids=segment_ids,
    )
    loss = pg
    if ref_logprobs is not None:
        pol = logprobs if policy_logprobs is None else policy_logprobs
        kl = agg(kl_penalty(pol, ref_logprobs, cfg.kl_estimator))
        metrics["kl"] = jax.lax.stop_gradient(kl)
        if cfg.kl_coef and not cfg.kl_as_reward:
            loss = loss + cfg.kl_coef * kl
    elif cfg.kl_coef and not cfg.kl_as_reward:
        raise ValueError(f"kl_coef={cfg.kl_coef} needs ref_logprobs (or set kl_as_reward=true)")
    if entropy is not None:
        ent = agg(entropy)
        metrics["entropy"] = jax.lax.stop_gradient(ent)
        loss = loss - cfg.entropy_coef * ent
    if cfg.vf_coef:
        if values is None or returns is None:
            raise ValueError(f"vf_coef={cfg.vf_coef} needs values and returns (a value head)")
        vf_tok, vf_clipped = value_loss(
            values, jax.lax.stop_gradient(returns), old_values=old_values, vf_clip=cfg.vf_clip
        )
        vf = agg(vf_tok)
        metrics["vf_loss"] = jax.lax.stop_gradient(vf)
        metrics["vf_clip_frac"] = masked_mean(vf_clipped.astype(m.dtype), m)
        loss = loss + cfg.vf_coef * vf
    metrics["loss"] = jax.lax.stop_gradient(loss)
    return loss, metrics
