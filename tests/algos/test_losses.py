"""Policy losses: gradient identities (jax.grad), clipping, aggregation formulas, KL, value loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.algos import (
    AGG_MODES,
    LossConfig,
    aggregate,
    aggregation_denominator,
    kl_penalty,
    kl_reward,
    policy_loss,
    value_loss,
)


def ragged(seed: int, b: int = 4, t: int = 6):
    rng = np.random.default_rng(seed)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[:, 0] = 1.0
    mask[-1] = 0.0  # a padding row
    lp = -rng.random((b, t)).astype(np.float32) * 2
    adv = rng.normal(size=(b, t)).astype(np.float32)
    return jnp.asarray(lp), jnp.asarray(adv), jnp.asarray(mask)


def grad_wrt_logprobs(cfg: LossConfig, lp, old, adv, mask, **kw):
    f = lambda x: policy_loss(
        logprobs=x, old_logprobs=old, advantages=adv, loss_mask=mask, cfg=cfg, **kw
    )[0]
    return np.asarray(jax.grad(f)(lp))


# -- gradient identities ----------------------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", ["ppo_clip", "cispo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ratio_one_gradient_equals_vanilla_pg(name, agg, seed):
    lp, adv, mask = ragged(seed)
    vanilla = grad_wrt_logprobs(LossConfig(name="vanilla_pg", agg_mode=agg), lp, lp, adv, mask)
    got = grad_wrt_logprobs(LossConfig(name=name, agg_mode=agg), lp, lp, adv, mask)
    np.testing.assert_allclose(got, vanilla, rtol=1e-5, atol=1e-7)
    # and vanilla PG is the aggregation of -A * grad logp: for token-mean, -A m / sum(m)
    if agg == "token-mean":
        np.testing.assert_allclose(vanilla, -adv * mask / mask.sum(), rtol=1e-5, atol=1e-7)


def test_gspo_gradient_equals_sequence_level_objective():
    # GSPO paper, eq. (5)-(7): J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log r_it).
    # With per-sequence advantages the token form + seq-mean-token-mean must give the same gradient.
    lp, _, mask = ragged(3)
    old = lp + 0.01 * jnp.asarray(np.random.default_rng(0).normal(size=lp.shape), jnp.float32)
    seq_adv = jnp.asarray([1.5, -0.7, 0.3, 0.0])
    adv = seq_adv[:, None] * mask
    cfg = LossConfig(name="gspo", clip_low=0.05, clip_high=0.05, agg_mode="seq-mean-token-mean")

    def reference(x):
        n = jnp.maximum(mask.sum(-1), 1.0)
        s = jnp.exp(((x - old) * mask).sum(-1) / n)
        per_seq = -jnp.minimum(s * seq_adv, jnp.clip(s, 0.95, 1.05) * seq_adv)
        has = mask.sum(-1) > 0
        return jnp.where(has, per_seq, 0.0).sum() / has.sum()

    got = grad_wrt_logprobs(cfg, lp, old, adv, mask)
    np.testing.assert_allclose(got, np.asarray(jax.grad(reference)(lp)), rtol=1e-5, atol=1e-7)
    loss, _ = policy_loss(logprobs=lp, old_logprobs=old, advantages=adv, loss_mask=mask, cfg=cfg)
    assert float(loss) == pytest.approx(float(reference(lp)), rel=1e-5)


def test_clipping_zeroes_gradients_where_it_should():
    # One token per case; old logprob 0, so ratio = exp(lp). clip_low 0.2, clip_high 0.28.
    #   0: A>0, r=1.5 > 1.28  -> clipped, grad 0          1: A>0, r=0.5 (< 0.8) -> not clipped
    #   2: A<0, r=0.5 < 0.8   -> clipped, grad 0          3: A<0, r=1.5 -> not clipped (PPO)
    #   4: A<0, r=4.0 > c=3   -> dual-clip, grad 0        5: A>0, r=1.1 -> inside, grad -A r
    r = jnp.asarray([[1.5, 0.5, 0.5, 1.5, 4.0, 1.1]])
    adv = jnp.asarray([[1.0, 1.0, -1.0, -1.0, -1.0, 2.0]])
    lp, old, mask = jnp.log(r), jnp.zeros_like(r), jnp.ones_like(r)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, agg_mode="seq-mean-token-sum")
    g = grad_wrt_logprobs(cfg, lp, old, adv, mask)[0]
    # d(-A r)/d lp = -A r (one sequence, token sums)
    np.testing.assert_allclose(g, [0.0, -0.5, 0.0, 1.5, 4.0, -2.2], rtol=1e-6)
    g_dual = grad_wrt_logprobs(
        LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="seq-mean-token-sum"),
        lp,
        old,
        adv,
        mask,
    )[0]
    np.testing.assert_allclose(g_dual, [0.0, -0.5, 0.0, 1.5, 0.0, -2.2], rtol=1e-6)
    _, m = policy_loss(logprobs=lp, old_logprobs=old, advantages=adv, loss_mask=mask, cfg=cfg)
    assert float(m["clip_frac"]) == pytest.approx(2 / 6)
    assert float(m["ratio_max"]) == pytest.approx(4.0)
    # CISPO keeps every token's gradient: -sg(clip(r)) A, clip range [0.8, 1.28]
    g_c = grad_wrt_logprobs(
        LossConfig(name="cispo", clip_low=0.2, clip_high=0.28, agg_mode="seq-mean-token-sum"),
        lp,
        old,
        adv,
        mask,
    )[0]
    np.testing.assert_allclose(g_c, [-1.28, -0.8, 0.8, 1.28, 1.28, -2.2], rtol=1e-6)


# -- aggregation ------------------------------------------------------------------------------


def test_aggregation_modes_on_hand_built_batch():
    x = jnp.asarray([[1.0, 2.0, 3.0, 100.0], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
    m = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # masked values: row0 {1,2,3} (sum 6, n 3), row1 {4} (sum 4, n 1), row2 empty (not a sequence)
    # token-mean:              (1+2+3+4) / 4 tokens           = 2.5
    # seq-mean-token-sum:      (6 + 4) / 2 sequences           = 5.0
    # seq-mean-token-mean:     (6/3 + 4/1) / 2                 = 3.0
    # seq-mean-token-sum-norm: (6 + 4) / (2 sequences * T=4)   = 1.25 ; with max_len=10: 0.5
    want = {
        "token-mean": 2.5,
        "seq-mean-token-sum": 5.0,
        "seq-mean-token-mean": 3.0,
        "seq-mean-token-sum-norm": 1.25,
    }
    for mode, v in want.items():
        assert float(aggregate(x, m, mode)) == pytest.approx(v), mode
    assert float(aggregate(x, m, "seq-mean-token-sum-norm", max_len=10)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown agg_mode 'mean'.*token-mean"):
        aggregate(x, m, "mean")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_microbatches_with_shared_denominator_sum_to_full_batch(mode):
    lp, adv, mask = ragged(5, b=8, t=6)
    x = adv * lp
    full = aggregate(x, mask, mode, max_len=16)
    denom = aggregation_denominator(mask, mode, max_len=16)
    parts = sum(
        aggregate(x[i : i + 2], mask[i : i + 2], mode, max_len=16, denominator=denom)
        for i in range(0, 8, 2)
    )
    assert float(parts) == pytest.approx(float(full), rel=1e-5)


# -- KL, value loss, composition --------------------------------------------------------------


def test_kl_estimators_match_formulas_and_kl_reward():
    lp = jnp.asarray([[-1.0, -2.0, -0.5]])
    ref = jnp.asarray([[-1.5, -1.0, -0.5]])
    d = np.asarray(ref - lp)  # log(ref / pi)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k1"), -d, rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k2"), 0.5 * d**2, rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(lp, ref, "k3"), np.exp(d) - 1 - d, rtol=1e-6)
    assert np.all(np.asarray(kl_penalty(lp, ref, "k3")) >= 0)
    with pytest.raises(ValueError, match="k4.*k1, k2, k3"):
        kl_penalty(lp, ref, "k4")
    mask = jnp.asarray([[1.0, 1.0, 0.0]])
    shaped, per = kl_reward(
        jnp.asarray([1.0]), logprobs=lp, ref_logprobs=ref, loss_mask=mask, kind="k1", coef=0.1
    )
    # k1 on the two sampled tokens: 0.5 + (-1.0) = -0.5 -> reward 1 - 0.1 * (-0.5) = 1.05
    assert float(per[0]) == pytest.approx(-0.5)
    assert float(shaped[0]) == pytest.approx(1.05)


def test_clipped_value_loss():
    v, old, ret = jnp.asarray([[1.0, 0.0]]), jnp.asarray([[0.0, 0.0]]), jnp.asarray([[0.0, 2.0]])
    # token 0: (1-0)^2 = 1 vs clipped v=0.2: 0.04 -> max 1 -> 0.5
    # token 1: v = old = 0, (0-2)^2 = 4 -> 2
    loss, clipped = value_loss(v, ret, old_values=old, vf_clip=0.2)
    np.testing.assert_allclose(loss, [[0.5, 2.0]])
    # a prediction that moved towards the target past the clip is held back: v=1.8, target 2
    loss2, clipped2 = value_loss(
        jnp.asarray([[1.8]]), jnp.asarray([[2.0]]), old_values=jnp.asarray([[0.0]]), vf_clip=0.2
    )
    assert float(loss2[0, 0]) == pytest.approx(0.5 * 1.8**2) and bool(clipped2[0, 0])


def test_policy_loss_composes_terms():
    lp, adv, mask = ragged(7)
    ref = lp - 0.3
    ent = jnp.full_like(lp, 0.7)
    vals, rets = jnp.zeros_like(lp), jnp.ones_like(lp)
    cfg = LossConfig(kl_coef=0.1, entropy_coef=0.01, vf_coef=0.5, kl_estimator="k2")
    loss, m = policy_loss(
        logprobs=lp,
        old_logprobs=lp,
        advantages=adv,
        loss_mask=mask,
        cfg=cfg,
        ref_logprobs=ref,
        entropy=ent,
        values=vals,
        returns=rets,
    )
    # k2 of a constant 0.3 gap = 0.045; entropy 0.7; value loss 0.5 * 1^2 = 0.5 on every token
    assert float(m["kl"]) == pytest.approx(0.045, rel=1e-5)
    assert float(m["entropy"]) == pytest.approx(0.7)
    assert float(m["vf_loss"]) == pytest.approx(0.5)
    want = float(m["pg_loss"]) + 0.1 * 0.045 - 0.01 * 0.7 + 0.5 * 0.5
    assert float(loss) == pytest.approx(want, rel=1e-5)
    # as a reward, KL is reported but not added
    loss_r, _ = policy_loss(
        logprobs=lp,
        old_logprobs=lp,
        advantages=adv,
        loss_mask=mask,
        cfg=LossConfig(kl_coef=0.1, kl_as_reward=True),
        ref_logprobs=ref,
    )
    assert float(loss_r) == pytest.approx(float(m["pg_loss"]), rel=1e-5)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(
            logprobs=lp,
            old_logprobs=lp,
            advantages=adv,
            loss_mask=mask,
            cfg=LossConfig(kl_coef=0.1),
        )


def test_loss_config_errors_name_valid_choices():
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'.*cispo.*gspo.*ppo_clip"):
        LossConfig(name="ppo")
    with pytest.raises(ValueError, match="agg_mode 'sum'.*seq-mean-token-sum-norm"):
        LossConfig(agg_mode="sum")
    with pytest.raises(ValueError, match="dual_clip must be None or > 1"):
        LossConfig(dual_clip=0.5)
