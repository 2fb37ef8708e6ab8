"""KL estimators between the policy and a reference policy, per sampled token (Schulman 2020,
"Approximating KL Divergence"), usable as a loss term or subtracted from the reward.

With ``log_r = ref_logprobs - logprobs`` on tokens sampled from the policy:

* ``k1 = -log_r``                  unbiased for KL(pi || ref), high variance, can be negative;
* ``k2 = log_r^2 / 2``             biased, low variance, always >= 0;
* ``k3 = exp(log_r) - 1 - log_r``  unbiased, low variance, always >= 0 (GRPO's choice as a loss);
  bounded as verl bounds it (``verl/trainer/ppo/core_algos.py``, ``kl_penalty`` for
  ``low_var_kl`` / ``k3``): ``log_r`` clamped to ``[-20, 20]`` before ``exp``, the estimate clamped
  to ``[-10, 10]`` (so at most ``K3_BOUND``; no gradient through a clamped value). Without the
  bound one token the policy finds far less likely than the reference (``logp = -5``,
  ``ref = -1``: 49.6) dominates the whole KL term.

As a *loss*, differentiate through ``logprobs`` (``ref_logprobs`` is a constant). Note that the
gradient of k1/k3 as a loss is not the gradient of the true KL (k2's is, at ratio 1); this is the
convention of the published recipes, kept deliberately. As a *reward*
(:func:`kl_reward`), the per-token penalty is summed over the sampled tokens of each trajectory
and subtracted from its scalar reward before the advantage estimator runs (no gradient).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array
KL_ESTIMATORS = ("k1", "k2", "k3")
K3_BOUND = 10.0
"""k3 is clamped to ``[-K3_BOUND, K3_BOUND]`` (verl's ``torch.clamp(kld, min=-10, max=10)``)."""


def kl_penalty(
    logprobs: Array, ref_logprobs: Array, kind: Literal["k1", "k2", "k3"] = "k3"
) -> Array:
    """Per-token KL estimate ``Float['B T']`` from ``logprobs, ref_logprobs: Float['B T']``."""
    log_r = jax.lax.stop_gradient(ref_logprobs) - logprobs
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        # Clamp the exponent: a token the reference finds far likelier would overflow exp().
        # Then bound the estimate itself, as verl does: torch.clamp(kld, min=-10, max=10).
        log_r = jnp.clip(log_r, -20.0, 20.0)
        return jnp.clip(jnp.exp(log_r) - 1.0 - log_r, -K3_BOUND, K3_BOUND)
    raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}")


def kl_reward(
    rewards: Array,
    *,
    logprobs: Array,
    ref_logprobs: Array,
    loss_mask: Array,
    kind: Literal["k1", "k2", "k3"] = "k1",
    coef: float,
) -> tuple[Array, Array]:
    """KL-in-reward: ``r_i - coef * sum_t mask_it k(t)`` (``Float['B']``; inputs ``Float['B T']``).

    Returns ``(shaped rewards Float['B'], per-trajectory KL sum Float['B'])``; no gradient flows.
    """
    k = jax.lax.stop_gradient(kl_penalty(logprobs, ref_logprobs, kind))
    per_traj = (k * loss_mask).sum(-1)
    return rewards - coef * per_traj, per_traj
