"""The RL update program against a plain host loop over the same pieces.

``training.update.make_rl_update`` computes advantages, then runs epochs x minibatches of
optimizer updates as one ``lax.scan`` with the permutations drawn on device. The reference below
does the same work the way the job used to: advantages by ``compute_advantages``, a permutation
per epoch from the same key, minibatches gathered on the host, one jitted ``make_train_step``
call per minibatch. The two must end at the same parameters and report the same means.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from toy_lm import ToyLM

from jaxrl_agents.algos import (
    AdvantageConfig,
    AdvantageInputs,
    LossConfig,
    aggregation_denominator,
    compute_advantages,
)
from jaxrl_agents.batches import EpisodeArrays, TrainBatch
from jaxrl_agents.training.objectives import rl_loss
from jaxrl_agents.training.step import (
    LossInputs,
    OptimizerConfig,
    init_train_state,
    make_train_step,
)
from jaxrl_agents.training.update import RLMetrics, make_rl_update

B, T, G = 8, 16, 4


def _rollout(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 32, (B, T + 1)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for i in range(B):
        p = int(rng.integers(2, 6))
        mask[i, p : T - int(rng.integers(0, 3))] = 1.0
    batch = TrainBatch(
        input_ids=ids[:, :-1],
        positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids=np.ones((B, T), np.int32),
        target_ids=ids[:, 1:],
        loss_mask=mask,
        old_logprobs=np.where(mask > 0, rng.normal(-3.5, 0.2, (B, T)), 0).astype(np.float32),
        advantages=np.zeros((B, T), np.float32),
        returns=np.zeros((B, T), np.float32),
        turn_ids=np.where(mask > 0, 0, -1).astype(np.int32),
    )
    rewards = rng.choice([-1.0, 1.0], B).astype(np.float32)
    episodes = EpisodeArrays(
        rewards=rewards,
        group_ids=np.repeat(np.arange(B // G), G).astype(np.int32),
        turn_rewards=rewards[:, None],
        turn_mask=np.ones((B, 1), np.float32),
        anchor_ids=np.full((B, 1), -1, np.int32),
        row_valid=np.ones((B,), np.float32),
    )
    return jax.tree.map(jnp.asarray, batch), jax.tree.map(jnp.asarray, episodes)


def _host_advantages(batch, episodes, adv_cfg):
    inputs = AdvantageInputs(
        rewards=episodes.rewards,
        group_ids=episodes.group_ids,
        loss_mask=batch.loss_mask,
        turn_ids=batch.turn_ids,
        turn_rewards=episodes.turn_rewards,
        turn_mask=episodes.turn_mask,
        anchor_ids=episodes.anchor_ids,
    )
    return compute_advantages(adv_cfg.name, inputs, adv_cfg)


def _reference(graphdef, rest, tx, state, batch, episodes, key, *, loss_cfg, adv_cfg, epochs, mbs):
    adv = _host_advantages(batch, episodes, adv_cfg)
    batch = batch._replace(advantages=adv.advantages)
    step = make_train_step(graphdef, tx, rl_loss(loss_cfg, chunk=8), rest=rest)
    losses = []
    for e in range(epochs):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, e), B))
        for m in range(mbs):
            pick = perm[m * (B // mbs) : (m + 1) * (B // mbs)]
            mb = jax.tree.map(lambda x, pick=pick: x[pick], batch)
            denom = aggregation_denominator(mb.loss_mask, loss_cfg.agg_mode)
            state, metrics = step(state, mb, LossInputs(denom=denom))
            losses.append(float(metrics["loss"]))
    return state, losses


@pytest.mark.parametrize("epochs, mbs", [(1, 1), (2, 2)])
def test_update_program_matches_host_loop(epochs, mbs):
    model = ToyLM(rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=5e-2, warmup_steps=0, grad_clip=0.0).build()
    loss_cfg, adv_cfg = LossConfig(name="ppo_clip"), AdvantageConfig(name="grpo")
    batch, episodes = _rollout()
    key = jax.random.key(7)
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=loss_cfg,
        adv_cfg=adv_cfg,
        epochs=epochs,
        minibatches=mbs,
        microbatches=1,
        logprob_chunk=8,
    )
    copy = lambda: init_train_state(jax.tree.map(jnp.copy, params), tx)
    new, metrics = update(copy(), batch, episodes, key, None)
    ref, losses = _reference(
        graphdef,
        rest,
        tx,
        copy(),
        batch,
        episodes,
        key,
        loss_cfg=loss_cfg,
        adv_cfg=adv_cfg,
        epochs=epochs,
        mbs=mbs,
    )
    assert isinstance(metrics, RLMetrics)
    assert int(new.step) == epochs * mbs == int(ref.step)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(ref.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    moved = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params), strict=True)
    )
    assert moved > 1e-4  # the update did something
    assert float(metrics.loss) == pytest.approx(np.mean(losses), rel=1e-4, abs=1e-6)
    assert float(metrics.adv_abs) > 0 and int(metrics.skipped) == 0
    assert np.isnan(float(metrics.kl)) and np.isnan(float(metrics.kl_reward))  # no reference


def test_update_compiles_once_and_uses_kl_reference():
    model = ToyLM(rngs=nnx.Rngs(1))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=0).build()
    loss_cfg = LossConfig(name="ppo_clip", kl_coef=0.1)
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=loss_cfg,
        adv_cfg=AdvantageConfig(name="rloo"),
        epochs=1,
        minibatches=2,
        microbatches=2,
        logprob_chunk=8,
    )
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)
    ref = jax.tree.map(jnp.copy, params)
    for s in range(3):
        batch, episodes = _rollout(seed=s)
        state, metrics = update(state, batch, episodes, jax.random.key(s), ref)
        assert np.isfinite(float(metrics.kl)) and float(metrics.kl) >= 0
    assert update._cache_size() == 1


# -- sampler/learner mismatch correction ------------------------------------------------------


def _learner_old(graphdef, rest, params, batch):
    from jaxrl_agents.training.logprobs import token_stats

    model = nnx.merge(graphdef, params, rest)
    return token_stats(
        model, batch.input_ids, batch.positions, batch.segment_ids, batch.target_ids, chunk=8
    ).logprobs


@pytest.mark.parametrize("correction", ["none", "tis_token", "tis_seq", "mis_token", "mis_geo"])
def test_update_with_mismatch_correction_matches_host_reference(correction):
    from jaxrl_agents.algos.correction import rollout_correction
    from jaxrl_agents.training.objectives import RLLossInputs

    model = ToyLM(rngs=nnx.Rngs(2))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=5e-2, warmup_steps=0, grad_clip=0.0).build()
    cap = 1.05 if correction == "mis_geo" else 1.5
    loss_cfg = LossConfig(name="ppo_clip", is_correction=correction, is_cap=cap)
    adv_cfg = AdvantageConfig(name="grpo")
    batch, episodes = _rollout(seed=4)
    old = _learner_old(graphdef, rest, params, batch)
    # Behaviour logprobs: the learner's plus sampler noise (a mismatch of a few percent per token)
    noise = jnp.asarray(np.random.default_rng(0).normal(0, 0.3, old.shape), jnp.float32)
    behaviour = jnp.where(batch.loss_mask > 0, old + noise, 0.0)
    batch = batch._replace(old_logprobs=behaviour)
    key = jax.random.key(3)
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=loss_cfg,
        adv_cfg=adv_cfg,
        epochs=2,
        minibatches=2,
        microbatches=1,
        logprob_chunk=8,
    )
    copy = lambda: init_train_state(jax.tree.map(jnp.copy, params), tx)
    new, metrics = update(copy(), batch, episodes, key, None)

    # Host reference: advantages, the correction on (pi_old, mu), then plain train steps.
    adv = _host_advantages(batch, episodes, adv_cfg)
    ref_batch = batch._replace(advantages=adv.advantages)
    corr = rollout_correction(old, behaviour, batch.loss_mask, mode=correction, cap=cap)
    weights = None
    if correction != "none":
        ref_batch = ref_batch._replace(old_logprobs=old)
        if corr.keep is not None:
            ref_batch = ref_batch._replace(loss_mask=batch.loss_mask * corr.keep)
        weights = corr.weights
    step = make_train_step(graphdef, tx, rl_loss(loss_cfg, chunk=8), rest=rest)
    state, first_kl = copy(), None
    for e in range(2):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, e), B))
        for m in range(2):
            pick = perm[m * (B // 2) : (m + 1) * (B // 2)]
            mb = jax.tree.map(lambda x, pick=pick: x[pick], ref_batch)
            w = None if weights is None else weights[pick]
            denom = aggregation_denominator(mb.loss_mask, loss_cfg.agg_mode)
            state, ms = step(state, mb, RLLossInputs(denom=denom, is_weights=w))
            first_kl = float(ms["approx_kl"]) if first_kl is None else first_kl
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)

    # Diagnostics: the mismatch k3 (full batch with the old-policy pass, else the first
    # minibatch's, free), and the truncated / masked fractions of the configured correction.
    assert float(metrics.mismatch_kl) > 0.01
    if correction == "none":
        assert float(metrics.mismatch_kl) == pytest.approx(first_kl, rel=1e-5)
        for name in ("is_weight_mean", "is_truncated_frac", "is_masked_frac"):
            assert np.isnan(float(getattr(metrics, name)))
        return
    assert float(metrics.mismatch_kl) == pytest.approx(float(corr.mismatch_kl), rel=1e-5)
    assert float(metrics.is_weight_mean) == pytest.approx(float(corr.weight_mean), rel=1e-5)
    if correction.startswith("tis"):
        assert 0.0 < float(metrics.is_truncated_frac) < 1.0
        assert np.isnan(float(metrics.is_masked_frac))
    else:
        assert 0.0 < float(metrics.is_masked_frac) < 1.0
        assert np.isnan(float(metrics.is_truncated_frac))
    assert int(metrics.skipped) == 0


@pytest.mark.parametrize("as_reward", [False, True])
def test_kl_to_reference_compares_temperature_one_policies(as_reward):
    """Under a sampling transform the learner's ratio uses transformed logprobs, but the KL to
    the reference compares the policies: with the reference = the starting weights it is 0."""
    from jaxrl_agents.training.logprobs import SamplingTransform

    model = ToyLM(rngs=nnx.Rngs(5))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=0).build()
    sampling = SamplingTransform(temperature=0.7, top_p=0.9)
    batch, episodes = _rollout(seed=6)
    # Behaviour logprobs as the sampler reports them: under the transform, at these weights.
    from jaxrl_agents.training.logprobs import token_stats

    stats = token_stats(
        nnx.merge(graphdef, params, rest),
        batch.input_ids,
        batch.positions,
        batch.segment_ids,
        batch.target_ids,
        chunk=8,
        sampling=sampling,
    )
    batch = batch._replace(old_logprobs=jnp.where(batch.loss_mask > 0, stats.logprobs, 0.0))
    loss_cfg = LossConfig(name="ppo_clip", kl_coef=0.1, kl_as_reward=as_reward, kl_estimator="k1")
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=loss_cfg,
        adv_cfg=AdvantageConfig(name="rloo"),
        epochs=1,
        minibatches=1,
        microbatches=1,
        logprob_chunk=8,
        sampling=sampling,
    )
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)
    _, metrics = update(state, batch, episodes, jax.random.key(0), jax.tree.map(jnp.copy, params))
    assert float(metrics.ratio_mean) == pytest.approx(1.0, abs=1e-5)
    kl = float(metrics.kl_reward if as_reward else metrics.kl)
    assert abs(kl) < 1e-5  # k1 of transformed vs T=1 logprobs would be far from 0
    assert abs(float(metrics.mismatch_kl)) < 1e-6
