"""Numerical safety of the policy losses (log-ratio clamp, bounded k3) and the sampler/learner
mismatch corrections (truncated / masked importance sampling) against plain-Python loops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.algos import LossConfig, kl_penalty, policy_loss
from jaxrl_agents.algos.correction import IS_CORRECTIONS, rollout_correction
from jaxrl_agents.algos.kl import K3_BOUND

# -- one extreme token must not poison the gradient ------------------------------------------


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "gspo", "vanilla_pg"])
def test_extreme_old_logprob_gives_finite_gradient(name):
    # The case: exp(99.9) overflows; PPO's clipped branch then multiplies 0 by inf.
    lp = jnp.asarray([[-0.5, -0.1, -1.0]])
    old = jnp.asarray([[-0.6, -100.0, -1.1]])
    adv, mask = jnp.ones((1, 3)), jnp.ones((1, 3))
    cfg = LossConfig(name=name)

    def f(x):
        return policy_loss(logprobs=x, old_logprobs=old, advantages=adv, loss_mask=mask, cfg=cfg)

    (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(lp)
    g = np.asarray(g)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(g)), g
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
    if name == "ppo_clip":
        # Tokens 0 and 2: ratio e^0.1 = 1.105 inside [0.8, 1.2]: grad -A r / n. Token 1: clipped.
        np.testing.assert_allclose(g[0, [0, 2]], -math.exp(0.1) / 3, rtol=1e-6)
        np.testing.assert_allclose(g[0, [0, 2]], -0.368, atol=5e-4)
        assert g[0, 1] == 0.0


def test_log_ratio_clamp_keeps_gradient_inside_the_range():
    # |log ratio| < 20: the clamp changes nothing (value and gradient of the plain formula).
    lp = jnp.asarray([[-0.5, -2.0, -1.0]])
    old = jnp.asarray([[-0.4, -1.5, -3.0]])
    adv = jnp.asarray([[0.7, -1.3, 0.2]])
    mask = jnp.ones((1, 3))
    cfg = LossConfig(name="ppo_clip", clip_low=10.0, clip_high=10.0)  # nothing clipped
    f = lambda x: policy_loss(
        logprobs=x, old_logprobs=old, advantages=adv, loss_mask=mask, cfg=cfg
    )[0]
    plain = lambda x: jnp.mean(-adv * jnp.exp(x - old))
    np.testing.assert_allclose(jax.grad(f)(lp), jax.grad(plain)(lp), rtol=1e-6)
    assert float(f(lp)) == pytest.approx(float(plain(lp)), rel=1e-6)


# -- k3 bound ---------------------------------------------------------------------------------


def test_k3_is_bounded_as_in_verl():
    lp, ref = jnp.asarray([[-5.0, -1.0, -1.0]]), jnp.asarray([[-1.0, -1.5, -60.0]])
    k3 = np.asarray(kl_penalty(lp, ref, "k3"))
    assert k3[0, 0] <= 10.0 and k3[0, 0] == K3_BOUND  # unbounded: e^4 - 1 - 4 = 49.6
    d = -0.5
    assert k3[0, 1] == pytest.approx(math.exp(d) - 1 - d, rel=1e-6)  # small values unchanged
    assert np.all(np.isfinite(k3)) and np.all(k3 >= 0) and np.all(k3 <= K3_BOUND)
    g = jax.grad(lambda x: kl_penalty(x, ref, "k3").sum())(lp)
    assert np.all(np.isfinite(np.asarray(g))) and float(g[0, 0]) == 0.0  # clamped: no gradient


# -- importance corrections vs a plain loop ---------------------------------------------------


def _loop_reference(old, beh, mask, mode, cap):
    """Per-token weight (TIS) or keep flag (MIS), written out token by token."""
    B, T = old.shape
    out = np.zeros((B, T))
    clamp = lambda x: min(max(x, -20.0), 20.0)
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t] > 0]
        lrs = [float(old[i, t]) - float(beh[i, t]) for t in toks]
        seq_sum = sum(lrs)
        seq_mean = seq_sum / max(len(toks), 1)
        for t, lr in zip(toks, lrs, strict=True):
            if mode == "tis_token":
                out[i, t] = min(math.exp(clamp(lr)), cap)
            elif mode == "tis_seq":
                out[i, t] = min(math.exp(clamp(seq_sum)), cap)
            else:
                x = {"mis_token": lr, "mis_seq": seq_sum, "mis_geo": seq_mean}[mode]
                rho = math.exp(clamp(x))
                out[i, t] = 1.0 if 1.0 / cap <= rho <= cap else 0.0
    return out


def _mismatch_batch(seed=0, B=5, T=7):
    rng = np.random.default_rng(seed)
    mask = (rng.random((B, T)) < 0.75).astype(np.float32)
    mask[-1] = 0.0  # a padding row
    beh = -rng.random((B, T)).astype(np.float32) * 3
    old = beh + rng.normal(0, 0.5, (B, T)).astype(np.float32)
    old[0, 1], mask[0, 1] = beh[0, 1] + 30.0, 1.0  # an extreme token (clamped at 20)
    old[1, 2], mask[1, 2] = beh[1, 2] - 3.0, 1.0
    return old, beh, mask


@pytest.mark.parametrize("mode", [m for m in IS_CORRECTIONS if m != "none"])
@pytest.mark.parametrize("cap", [1.5, 2.0])
def test_is_corrections_match_loop(mode, cap):
    old, beh, mask = _mismatch_batch(seed=int(cap * 10))
    if mode == "mis_geo":  # geometric mean: a band near 1, as used in practice
        cap = 1.2
    ref = _loop_reference(old, beh, mask, mode, cap)
    c = rollout_correction(
        jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask), mode=mode, cap=cap
    )
    n = mask.sum()
    lr = np.where(mask > 0, np.clip(old - beh, -20, 20), 0.0)
    k3 = np.where(mask > 0, np.exp(lr) - 1 - lr, 0.0).sum() / n
    assert float(c.mismatch_kl) == pytest.approx(k3, rel=1e-5)
    if mode.startswith("tis"):
        assert c.keep is None
        np.testing.assert_allclose(np.asarray(c.weights), ref, rtol=1e-5)
        truncated = ((ref == cap) & (mask > 0)).sum() / n
        assert float(c.truncated_frac) == pytest.approx(truncated, abs=1e-6)
        assert float(c.weight_mean) == pytest.approx(ref.sum() / n, rel=1e-5)
        assert np.isnan(float(c.masked_frac))
        if mode == "tis_token":
            assert 0 < float(c.truncated_frac) < 1  # both kinds of token are present
    else:
        assert c.weights is None
        np.testing.assert_array_equal(np.asarray(c.keep), ref)
        assert float(c.masked_frac) == pytest.approx(1 - ref.sum() / n, abs=1e-6)
        assert np.isnan(float(c.truncated_frac))
        if mode == "mis_token":
            assert 0 < float(c.masked_frac) < 1


def test_truncated_weights_multiply_the_token_loss():
    old, beh, mask = _mismatch_batch(seed=3)
    rng = np.random.default_rng(1)
    lp = jnp.asarray(old + rng.normal(0, 0.05, old.shape).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=old.shape).astype(np.float32))
    c = rollout_correction(
        jnp.asarray(old), jnp.asarray(beh), jnp.asarray(mask), mode="tis_token", cap=2.0
    )
    for name in ("ppo_clip", "cispo", "vanilla_pg"):
        cfg = LossConfig(name=name, is_correction="tis_token")

        def f(x, w, cfg=cfg):
            return policy_loss(
                logprobs=x,
                old_logprobs=jnp.asarray(old),
                advantages=adv,
                loss_mask=jnp.asarray(mask),
                cfg=cfg,
                is_weights=w,
            )[0]

        # per-token weights on the loss == the same weights on the advantages (loss is
        # positively homogeneous in A for these objectives)
        def g(x, cfg=cfg):
            return policy_loss(
                logprobs=x,
                old_logprobs=jnp.asarray(old),
                advantages=adv * c.weights,
                loss_mask=jnp.asarray(mask),
                cfg=cfg,
            )[0]

        assert float(f(lp, c.weights)) == pytest.approx(float(g(lp)), rel=1e-5)
        np.testing.assert_allclose(
            jax.grad(f)(lp, c.weights), jax.grad(g)(lp), rtol=1e-5, atol=1e-8
        )


def test_loss_config_validates_correction():
    with pytest.raises(ValueError, match="is_correction.*tis_token"):
        LossConfig(is_correction="tis")
    with pytest.raises(ValueError, match="is_cap"):
        LossConfig(is_correction="mis_token", is_cap=1.0)
    assert LossConfig().is_correction == "none" and LossConfig().is_cap == 2.0
