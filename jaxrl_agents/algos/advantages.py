"""Advantage estimators for trajectory-level multi-turn RL: a registry of pure, jittable functions.

Every estimator maps :class:`AdvantageInputs` (fixed-shape device arrays built by
``rollout.packing``) to :class:`AdvantageOutput` with per-token advantages that are exactly zero
wherever ``loss_mask == 0`` (prompt, tool-result and padding tokens). Select one by name::

    out = compute_advantages("grpo", inputs, AdvantageConfig(name="grpo"))
    jax.jit(compute_advantages, static_argnames=("name", "cfg"))  # cfg is frozen, so hashable

Conventions that published systems disagree on, fixed here (and tested against plain loops):

* Group statistics use segment sums over ``group_ids`` with ``num_segments=B`` (no Python loop
  over the batch). Group std is the unbiased (Bessel) estimate, as in verl/TRL; a singleton group
  (e.g. a padding row) gets advantage 0, never NaN.
* "Token distance" for discounting (``reinforce_pp``, ``gae``) counts *sampled* tokens only: tool
  results and chat-template tokens between turns are environment transitions, not policy steps.
  The trajectory reward sits on the last sampled token of each row.
* ``turn_level`` and ``gigpo`` discount across turns (``gamma`` per turn), never across tokens.
* One reverse-scan kernel (:func:`discounted_gae`) serves token GAE, turn GAE and plain discounted
  returns, so the recursion is written once.

Registering your own: ``@register_advantage("mine", group=True)`` on
``fn(inputs, cfg) -> AdvantageOutput``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class AdvantageInputs(NamedTuple):
    """Device arrays, fixed shapes (see the axis glossary in ``jaxrl_agents.types``)."""

    rewards: Array  # Float['B']  trajectory-level scalar reward (sum of composed terms)
    group_ids: Array  # Int['B']  same task -> same id, ids in [0, B)
    loss_mask: Array  # Float['B T']  1 on policy-sampled tokens
    turn_ids: Array  # Int['B T']  turn index of each sampled token, -1 elsewhere
    turn_rewards: Array  # Float['B N']  trajectory-level terms land on the last turn
    turn_mask: Array  # Float['B N']  1 for turns that exist
    values: Array | None = None  # Float['B T']  value-head predictions (gae, turn-level GAE)
    anchor_ids: Array | None = None  # Int['B N']  GiGPO anchor state before turn n, -1 pad


class AdvantageOutput(NamedTuple):
    advantages: Array  # Float['B T']  exactly 0 where loss_mask == 0
    returns: Array | None  # Float['B T']  value targets (gae / turn-level GAE), else None


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Which estimator and its constants (Hydra group ``advantage``)."""

    name: str = "grpo"
    """Registered estimator name (see ``ADVANTAGE_ESTIMATORS``)."""
    eps: float = 1e-6
    """Added to standard deviations before dividing."""
    normalize_std: bool = True
    """Divide group-centred rewards by the group std (grpo, gigpo, turn_level with a group
    baseline). ``dr_grpo`` never does."""
    gamma: float = 1.0
    """Discount: per sampled token for gae / reinforce_pp, per turn for turn_level / gigpo."""
    lam: float = 1.0
    """GAE lambda (gae, turn_level with values)."""
    omega: float = 1.0
    """GiGPO weight of the step-level (anchor-state) advantage."""
    baseline: str = "group"
    """turn_level without values: 'group' (group mean of episode returns, grpo-style),
    'loo' (leave-one-out mean, rloo-style) or 'none'."""
    whiten: bool = False
    """Whiten the final advantages over all sampled tokens of the batch (reinforce_pp* always
    do)."""

    def __post_init__(self) -> None:
        if self.name not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"unknown advantage estimator {self.name!r}; "
                f"valid: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
            )
        if self.baseline not in _BASELINES:
            raise ValueError(f"unknown baseline {self.baseline!r}; valid: {', '.join(_BASELINES)}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"gamma={self.gamma} and lam={self.lam} must lie in [0, 1]")

    def validate(self, *, group_size: int, has_turns: bool, has_values: bool = False) -> None:
        """Reject estimator/batch combinations that would silently train on garbage."""
        spec = _SPECS[self.name]
        needs_group = spec.group and not (self.name == "turn_level" and self.baseline == "none")
        if needs_group and group_size < 2:
            valid = sorted(n for n, s in _SPECS.items() if not s.group)
            raise ValueError(
                f"advantage estimator {self.name!r} compares samples of the same task and needs "
                f"group_size >= 2, got {group_size}; estimators that work with group_size=1: "
                f"{', '.join(valid)}"
            )
        if spec.turns and not has_turns:
            valid = sorted(n for n, s in _SPECS.items() if not s.turns)
            raise ValueError(
                f"advantage estimator {self.name!r} needs turn spans (turn_ids / turn_rewards) "
                f"but the batch has none; estimators that do not: {', '.join(valid)}"
            )
        if spec.values and not has_values:
            raise ValueError(f"advantage estimator {self.name!r} needs a value head (values)")


_BASELINES = ("group", "loo", "none")


class _Spec(NamedTuple):
    fn: Callable[[AdvantageInputs, AdvantageConfig], AdvantageOutput]
    group: bool
    turns: bool
    values: bool


_SPECS: dict[str, _Spec] = {}
ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs, AdvantageConfig], AdvantageOutput]] = {}


def register_advantage(
    name: str, *, group: bool = False, turns: bool = False, values: bool = False
):
    """Decorator registering ``fn(inputs, cfg) -> AdvantageOutput`` under ``name``.

    ``group``/``turns``/``values`` declare what the estimator needs (``AdvantageConfig.validate``).
    """

    def deco(fn):
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        _SPECS[name] = _Spec(fn, group, turns, values)
        return fn

    return deco


def compute_advantages(name: str, inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Run estimator ``name``; masks the result so non-sampled tokens are exactly 0."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; "
            f"valid: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
        )
    out = ADVANTAGE_ESTIMATORS[name](inputs, cfg)
    mask = inputs.loss_mask > 0
    adv = out.advantages
    if cfg.whiten and name not in ("reinforce_pp", "reinforce_pp_baseline"):
        adv = whiten(adv, inputs.loss_mask, eps=cfg.eps)
    # where (not multiply): a NaN/inf upstream must not leak into masked positions.
    adv = jnp.where(mask, adv, 0.0)
    ret = None if out.returns is None else jnp.where(mask, out.returns, 0.0)
    return AdvantageOutput(adv, ret)


# -- shared kernels ---------------------------------------------------------------------------


def group_stats(x: Array, group_ids: Array, *, num_segments: int, weights: Array | None = None):
    """Per-element group mean, unbiased std and count. ``x, group_ids, weights: [M]`` -> ``[M]`` x3.

    Elements with weight 0 neither contribute nor get meaningful stats. Singleton groups get std 0.
    """
    w = jnp.ones_like(x) if weights is None else weights
    count = jax.ops.segment_sum(w, group_ids, num_segments=num_segments)
    total = jax.ops.segment_sum(x * w, group_ids, num_segments=num_segments)
    mean = total / jnp.maximum(count, 1.0)
    dev2 = jax.ops.segment_sum(w * (x - mean[group_ids]) ** 2, group_ids, num_segments=num_segments)
    std = jnp.sqrt(dev2 / jnp.maximum(count - 1.0, 1.0))
    return mean[group_ids], std[group_ids], count[group_ids]


def whiten(x: Array, mask: Array, *, eps: float) -> Array:
    """``(x - mean) / (std + eps)`` over masked entries of the whole batch (population std)."""
    n = jnp.maximum(mask.sum(), 1.0)
    mean = (x * mask).sum() / n
    std = jnp.sqrt((((x - mean) * mask) ** 2).sum() / n)
    return (x - mean) / (std + eps) * mask


def discounted_gae(
    rewards: Array, values: Array, mask: Array, *, gamma: float, lam: float
) -> tuple[Array, Array]:
    """GAE along the last axis, skipping unmasked positions. All ``Float['B K']``.

    ``delta_k = r_k + gamma V_{k'} - V_k`` and ``A_k = delta_k + gamma lam A_{k'}``, where ``k'`` is
    the next *masked* position (bootstrap 0 after the last). With ``values = 0, lam = 1`` this is
    the discounted return. Returns ``(advantages, returns = A + V)``, 0 where unmasked.
    """

    def step(carry, xs):
        next_v, next_a = carry
        r, v, m = xs
        a = r + gamma * next_v - v + gamma * lam * next_a
        keep = m > 0
        carry = (jnp.where(keep, v, next_v), jnp.where(keep, a, next_a))
        return carry, jnp.where(keep, a, 0.0)

    zeros = jnp.zeros(rewards.shape[0], rewards.dtype)
    _, adv = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, mask.T), reverse=True)
    adv = adv.T
    return adv, jnp.where(mask > 0, adv + values, 0.0)


def _sampled_after(mask: Array) -> Array:
    """``Int['B T']``: number of sampled tokens strictly after position t in the row."""
    m = (mask > 0).astype(jnp.int32)
    return jnp.flip(jnp.cumsum(jnp.flip(m, 1), 1), 1) - m


def _to_tokens(per_turn: Array, turn_ids: Array) -> Array:
    """Gather ``Float['B N']`` onto tokens via ``turn_ids: Int['B T']`` (0 where turn_ids < 0)."""
    n = per_turn.shape[1]
    g = jnp.take_along_axis(per_turn, jnp.clip(turn_ids, 0, n - 1), axis=1)
    return jnp.where(turn_ids >= 0, g, 0.0)


def _group_centre(r: Array, group_ids: Array, *, normalize_std: bool, eps: float) -> Array:
    mean, std, _ = group_stats(r, group_ids, num_segments=r.shape[0])
    centred = r - mean
    return centred / (std + eps) if normalize_std else centred


def _loo_centre(r: Array, group_ids: Array) -> Array:
    mean, _, count = group_stats(r, group_ids, num_segments=r.shape[0])
    # r - (sum - r)/(n-1) == n/(n-1) (r - mean); a singleton has no other sample: advantage 0.
    return jnp.where(count > 1, count / jnp.maximum(count - 1.0, 1.0) * (r - mean), 0.0)


def _broadcast(adv: Array, mask: Array) -> Array:
    return adv[:, None] * mask


# -- estimators -------------------------------------------------------------------------------


@register_advantage("grpo", group=True)
def grpo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean_g r) / (std_g r + eps)`` for
    every sampled token of trajectory ``i`` in group ``g`` (std divide off if not normalize_std)."""
    a = _group_centre(
        inputs.rewards, inputs.group_ids, normalize_std=cfg.normalize_std, eps=cfg.eps
    )
    return AdvantageOutput(_broadcast(a, inputs.loss_mask), None)


@register_advantage("dr_grpo", group=True)
def dr_grpo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``A_i = r_i - mean_g r``.
    Drops the std divide (question-difficulty bias); pair with the ``seq-mean-token-sum-norm`` loss
    aggregation to also drop the length bias."""
    a = _group_centre(inputs.rewards, inputs.group_ids, normalize_std=False, eps=cfg.eps)
    return AdvantageOutput(_broadcast(a, inputs.loss_mask), None)


@register_advantage("rloo", group=True)
def rloo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): ``A_i = r_i - 1/(n-1) sum_{j != i} r_j``,
    the leave-one-out baseline over the ``n`` samples of the group (unbiased)."""
    a = _loo_centre(inputs.rewards, inputs.group_ids)
    return AdvantageOutput(_broadcast(a, inputs.loss_mask), None)


@register_advantage("reinforce_pp")
def reinforce_pp(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++ (Hu 2025): token return ``G_t = gamma^{k(t)} r_i`` with ``k(t)`` the number of
    sampled tokens after ``t`` (reward on the last sampled token; KL-as-reward is applied upstream
    by ``algos.kl.kl_reward``), then whitened over all sampled tokens of the batch (global, not
    per-group, normalisation)."""
    k = _sampled_after(inputs.loss_mask)
    g = inputs.rewards[:, None] * jnp.power(cfg.gamma, k.astype(inputs.rewards.dtype))
    return AdvantageOutput(whiten(g * inputs.loss_mask, inputs.loss_mask, eps=cfg.eps), None)


@register_advantage("reinforce_pp_baseline", group=True)
def reinforce_pp_baseline(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025, v2 of the REINFORCE++ paper): ``r_i - mean_g r``
    broadcast to tokens, then whitened over all sampled tokens of the batch."""
    a = _group_centre(inputs.rewards, inputs.group_ids, normalize_std=False, eps=cfg.eps)
    m = inputs.loss_mask
    return AdvantageOutput(whiten(_broadcast(a, m), m, eps=cfg.eps), None)


@register_advantage("gae", values=True)
def gae(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GAE (Schulman et al. 2016) over sampled tokens: ``delta_t = r_t + gamma V_{t'} - V_t``,
    ``A_t = sum_l (gamma lam)^l delta_{t+l}`` with ``t'`` the next sampled token and
    ``r_t = r_i`` on the row's last sampled token, 0 elsewhere. ``returns = A + V``."""
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs inputs.values (a value head)")
    m = inputs.loss_mask
    last = (m > 0) & (_sampled_after(m) == 0)
    r = jnp.where(last, inputs.rewards[:, None], 0.0)
    adv, ret = discounted_gae(r, inputs.values, m, gamma=cfg.gamma, lam=cfg.lam)
    return AdvantageOutput(adv, ret)


def _turn_start_values(values: Array, turn_ids: Array, n_turns: int) -> tuple[Array, Array]:
    """``V_n``: the value at the first sampled token of each turn, and whether the turn has one."""
    onehot = turn_ids[:, :, None] == jnp.arange(n_turns)[None, None, :]  # [B T N]
    first = jnp.argmax(onehot, axis=1)  # [B N]; 0 when the turn has no token (masked below)
    has = onehot.any(axis=1)
    return jnp.where(has, jnp.take_along_axis(values, first, axis=1), 0.0), has


@register_advantage("turn_level", group=True, turns=True)
def turn_level(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """Turn-level credit: per-turn rewards discounted across turns, ``G_n = sum_m gamma^(m-n) R_m``.

    Without values: ``A_t = (G_{n(t)} - b_i) / s_i`` with ``b_i`` a baseline of episode returns
    ``G_0`` (``baseline``: group mean and std if normalize_std, i.e. GRPO; leave-one-out, i.e.
    RLOO; or none). The baseline is per trajectory, not per turn index: turn ``n`` of different
    samples is a different state, so a per-turn-index mean would be a biased baseline.

    With values (turn-level GAE, the critic granularity of ArCHer, Zhou et al. 2024): ``V_n`` is the
    value at turn ``n``'s first sampled token, ``delta_n = R_n + gamma V_{n+1} - V_n``, ``A_n``
    the lam-weighted sum; token ``t`` of turn ``n`` gets ``A_t = (A_n + V_n) - V_t`` (the turn's
    lam-return minus its own value), ``returns_t = A_n + V_n``. Within a turn nothing is discounted,
    so a one-turn episode reduces to token ``gae`` with gamma = lam = 1, and the value-free variant
    to ``grpo`` / ``rloo``.
    """
    tm, tid, n = inputs.turn_mask, inputs.turn_ids, inputs.turn_mask.shape[1]
    if inputs.values is not None:
        v_turn, _ = _turn_start_values(inputs.values, tid, n)
        a_turn, lam_ret = discounted_gae(
            inputs.turn_rewards, v_turn, tm, gamma=cfg.gamma, lam=cfg.lam
        )
        ret = _to_tokens(lam_ret, tid)
        return AdvantageOutput(ret - inputs.values, ret)
    g, _ = discounted_gae(inputs.turn_rewards, jnp.zeros_like(tm), tm, gamma=cfg.gamma, lam=1.0)
    g0 = jnp.take_along_axis(g, jnp.argmax(tm > 0, axis=1)[:, None], axis=1)[:, 0]
    gid = inputs.group_ids
    if cfg.baseline == "none":
        b, s = jnp.zeros_like(g0), jnp.ones_like(g0)
    elif cfg.baseline == "loo":
        b, s = g0 - _loo_centre(g0, gid), jnp.ones_like(g0)
    else:
        mean, std, count = group_stats(g0, gid, num_segments=g0.shape[0])
        # A singleton's std is 0: dividing its nonzero G_n - G_0 by eps would explode.
        s = jnp.where(count > 1, std + cfg.eps, 1.0) if cfg.normalize_std else jnp.ones_like(std)
        b = mean
    return AdvantageOutput(_to_tokens((g - b[:, None]) / s[:, None], tid), None)


@register_advantage("gigpo", group=True, turns=True)
def gigpo(inputs: AdvantageInputs, cfg: AdvantageConfig) -> AdvantageOutput:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training").

    ``A_{i,n} = A^E_i + omega A^S_{i,n}``: the episode advantage ``A^E`` is GRPO over trajectory
    rewards; the step advantage groups turns whose env state before the turn is the same
    (``anchor_ids``, across the samples of one task) and normalises their discounted turn returns
    ``G_{i,n} = sum_m gamma^(m-n) R_{i,m}`` within that anchor group (mean, and std if
    normalize_std). Turns without an anchor (id -1) or alone in their anchor group get ``A^S = 0``.
    Anchor ids must lie in ``[0, B*N)`` (``rollout.packing`` numbers them from 0).
    """
    if inputs.anchor_ids is None:
        raise ValueError("advantage estimator 'gigpo' needs inputs.anchor_ids (Ann.STATE_KEY)")
    b, n = inputs.turn_mask.shape
    a_ep = _group_centre(
        inputs.rewards, inputs.group_ids, normalize_std=cfg.normalize_std, eps=cfg.eps
    )
    tm = inputs.turn_mask
    g, _ = discounted_gae(inputs.turn_rewards, jnp.zeros_like(tm), tm, gamma=cfg.gamma, lam=1.0)
    valid = ((tm > 0) & (inputs.anchor_ids >= 0)).reshape(-1).astype(g.dtype)
    aid = jnp.clip(inputs.anchor_ids.reshape(-1), 0, b * n - 1)
    gf = g.reshape(-1)
    mean, std, count = group_stats(gf, aid, num_segments=b * n, weights=valid)
    a_step = gf - mean
    if cfg.normalize_std:
        a_step = a_step / (std + cfg.eps)
    a_step = jnp.where((valid > 0) & (count > 1), a_step, 0.0).reshape(b, n)
    a_turn = a_ep[:, None] + cfg.omega * a_step
    return AdvantageOutput(_to_tokens(a_turn, inputs.turn_ids), None)
