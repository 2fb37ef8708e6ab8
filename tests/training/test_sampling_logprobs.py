"""Behaviour logprobs under the sampling transform, end to end.

Rollouts sampled at temperature 0.7 with top-p 0.9 through the path training uses (a real
``Engine`` on a tiny ``Transformer``, the ``Collector``'s ``Orchestrator`` on the calculator env
with the shipped tiny tokenizer, then ``Collector.device_batch``) must store, for every sampled
token, its logprob under the distribution it was drawn from; the learner's ``token_stats`` under
the same ``SamplingTransform`` must give a PPO ratio of exactly 1 at the sampler's weights, and so
must the RL update program's first minibatch.
"""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
from jaxrl_agents.envs import ENVIRONMENTS
from jaxrl_agents.generation import Engine, EngineConfig, Sampling
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.rollout.collector import Collector
from jaxrl_agents.rollout.orchestrator import RolloutConfig
from jaxrl_agents.training.logprobs import (
    OUT_OF_SUPPORT_LOGPROB,
    SamplingTransform,
    token_stats,
)
from jaxrl_agents.training.step import OptimizerConfig, init_train_state
from jaxrl_agents.training.update import make_rl_update

TEMP, TOP_P = 0.7, 0.9
Calc = ENVIRONMENTS["calculator"]


def _tiny_policy(vocab: int) -> Transformer:
    cfg = ModelConfig(
        model_type="qwen2", vocab_size=vocab, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    # A fresh init is near-uniform (top-p 0.9 would keep ~85% of the vocabulary): sharpen the head
    # so the filter keeps tens of tokens and the test cannot pass by accident.
    model.lm_head[...] = model.lm_head[...] * 16.0
    return model


def _reference_logprob(logits_row: np.ndarray, token: int, temp: float, top_p: float) -> float:
    """log p(token) under softmax(logits / T) restricted to the top-p nucleus, renormalised
    (the smallest set of most likely tokens whose mass reaches top_p; ties with its last kept
    token kept)."""
    z = logits_row.astype(np.float64) / temp
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    cum = np.cumsum(p[order])
    last = order[int(np.searchsorted(cum, top_p))]
    keep = p >= p[last]
    assert keep[token], "a sampled token outside the nucleus"
    return float(np.log(p[token] / p[keep].sum()))


@pytest.fixture(scope="module")
def rollout_setup():
    chat = ChatFormat(load_tiny_tokenizer())
    model = _tiny_policy(len(chat.tokenizer))
    rollout = RolloutConfig(
        group_size=2,
        max_turns=2,
        max_new_tokens=12,
        max_total_tokens=448,
        sampling=Sampling(temperature=TEMP, top_p=TOP_P),
    )
    collector = Collector(chat=chat, env_factory=Calc, rollout=rollout, seq_buckets=(512,))
    engine = Engine(
        model,
        EngineConfig(max_slots=4, max_seq_len=512, prefill_buckets=(64, 256), decode_chunk=8),
    )
    tasks = Calc.make_tasks("train", 3, seed=0)

    async def main():
        async with engine:
            return await collector.collect(engine, tasks, group_size=2, seed=0)

    roll = asyncio.run(main())
    return chat, model, rollout, collector, roll


def test_stored_logprobs_are_the_sampling_distribution(rollout_setup):
    _, model, _, _, roll = rollout_setup
    checked, kept_sizes, t1_gap = 0, [], []
    for traj in roll.trajectories:
        ids = traj.token_ids
        logits, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
        logits = np.asarray(logits[0], np.float32)
        for i, m in enumerate(traj.loss_mask):
            if not m:
                continue
            ref = _reference_logprob(logits[i - 1], ids[i], TEMP, TOP_P)
            assert traj.logprobs[i] == pytest.approx(ref, abs=1e-5), (i, traj.logprobs[i], ref)
            row = logits[i - 1].astype(np.float64)
            t1 = row[ids[i]] - row.max() - np.log(np.exp(row - row.max()).sum())
            t1_gap.append(abs(traj.logprobs[i] - t1))
            z = np.exp((row - row.max()) / TEMP)
            kept_sizes.append(int(np.searchsorted(np.cumsum(np.sort(z / z.sum())[::-1]), TOP_P)))
            checked += 1
    assert checked >= 30
    assert np.median(kept_sizes) < 200  # the nucleus is a real filter here
    assert np.mean(t1_gap) > 0.05  # and the stored logprobs are not the T=1 ones


def test_learner_ratio_is_one_under_the_same_transform(rollout_setup):
    _, model, rollout, collector, roll = rollout_setup
    db = collector.device_batch(roll, rows=len(roll.trajectories), max_turns=rollout.max_turns)
    b = db.batch
    mask = np.asarray(b.loss_mask) > 0
    assert mask.sum() >= 30
    sampling = SamplingTransform.from_rollout(rollout)
    assert sampling == SamplingTransform(temperature=TEMP, top_p=TOP_P)
    stats = token_stats(
        model, b.input_ids, b.positions, b.segment_ids, b.target_ids, chunk=128, sampling=sampling
    )
    ratio = np.exp(np.asarray(stats.logprobs) - np.asarray(b.old_logprobs))[mask]
    np.testing.assert_allclose(ratio, 1.0, atol=1e-5)
    # Entropy is the transformed distribution's: lower than the policy's at T=0.7 + top-p.
    plain = token_stats(model, b.input_ids, b.positions, b.segment_ids, b.target_ids, chunk=128)
    assert np.all(np.asarray(stats.entropy)[mask] < np.asarray(plain.entropy)[mask])
    np.testing.assert_allclose(
        np.asarray(stats.policy_logprobs), np.asarray(plain.logprobs), atol=1e-6
    )
    # Without the transform the ratio is off (what the issue reports).
    off = np.exp(np.asarray(plain.logprobs) - np.asarray(b.old_logprobs))[mask]
    assert np.max(np.abs(off - 1.0)) > 0.1

    # The update program at the sampler's weights: ratio 1, no mismatch, nothing truncated or
    # masked by either correction (each also reports the plain ratio and mismatch).
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-3, warmup_steps=0).build()
    for correction in ("tis_token", "mis_token"):
        update = make_rl_update(
            graphdef, rest, tx, loss_cfg=LossConfig(name="ppo_clip", is_correction=correction),
            adv_cfg=AdvantageConfig(name="grpo"), epochs=1, minibatches=1, microbatches=1,
            logprob_chunk=128, sampling=sampling,
        )  # fmt: skip
        state = init_train_state(jax.tree.map(jnp.copy, params), tx)
        _, met = update(state, b, db.episodes, jax.random.key(0), None)
        assert float(met.ratio_mean) == pytest.approx(1.0, abs=1e-5)
        assert float(met.ratio_max) == pytest.approx(1.0, abs=2e-5)
        assert abs(float(met.mismatch_kl)) < 1e-6
        if correction == "tis_token":
            assert float(met.is_truncated_frac) == 0.0
            assert float(met.is_weight_mean) == pytest.approx(1.0, abs=1e-5)
        if correction == "mis_token":
            assert float(met.is_masked_frac) == 0.0


# -- the transform itself ---------------------------------------------------------------------


class _Head(nnx.Module):
    """Logits = a free parameter per position (so the reference is a few lines of numpy)."""

    def __init__(self, logits):
        self.w = nnx.Param(jnp.asarray(logits))

    def hidden_states(self, tokens, positions, *, segment_ids=None, cache=None):
        return jax.nn.one_hot(positions, self.w.shape[0]), None  # [B T T]

    def logits_from_hidden(self, h):
        return h @ self.w[...]


def _np_transform(row, temp, top_k, top_p, min_p):
    z = row.astype(np.float64) / temp
    keep = np.ones_like(z, bool)
    if top_k:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p)
        last = order[int(np.searchsorted(np.cumsum(p[order]), top_p))]
        keep &= p >= p[last]
    if min_p:
        keep &= z >= z.max() + np.log(min_p)
    q = np.where(keep, np.exp(z - z.max()), 0.0)
    return keep, q / q.sum()


@pytest.mark.parametrize(
    "tr",
    [
        SamplingTransform(temperature=0.7, top_p=0.9),
        SamplingTransform(temperature=1.3, top_k=5),
        SamplingTransform(temperature=1.0, min_p=0.05),
        SamplingTransform(temperature=0.5, top_k=20, top_p=0.8, min_p=0.01),
    ],
)
def test_token_stats_transform_matches_numpy(tr):
    T, V = 8, 64
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(T, V)) * 3).astype(np.float32)
    model = _Head(logits)
    tgt = np.zeros((1, T), np.int32)
    keeps = []
    for t in range(T):
        keep, q = _np_transform(logits[t], tr.temperature, tr.top_k, tr.top_p, tr.min_p)
        keeps.append(keep)
        tgt[0, t] = int(np.argsort(-q)[t % int(keep.sum())])  # some kept token
    tgt[0, -1] = int(np.argmin(logits[-1]))  # outside the kept set
    ids = jnp.zeros((1, T), jnp.int32)
    pos = jnp.arange(T)[None]
    seg = jnp.ones((1, T), jnp.int32)

    stats = token_stats(model, ids, pos, seg, jnp.asarray(tgt), chunk=4, sampling=tr)
    lp, ent = np.asarray(stats.logprobs[0]), np.asarray(stats.entropy[0])
    for t in range(T):
        keep, q = _np_transform(logits[t], tr.temperature, tr.top_k, tr.top_p, tr.min_p)
        want = np.log(q[tgt[0, t]]) if keep[tgt[0, t]] else OUT_OF_SUPPORT_LOGPROB
        assert lp[t] == pytest.approx(want, abs=1e-5)
        h = -np.sum(q[keep] * np.log(q[keep]))
        assert ent[t] == pytest.approx(h, abs=1e-5)

    # Gradient: that of log_softmax over the (fixed) kept set; zero for the out-of-support target.
    def f(m):
        s = token_stats(m, ids, pos, seg, jnp.asarray(tgt), chunk=4, sampling=tr)
        return jnp.sum(s.logprobs) + jnp.sum(s.entropy)

    def reference(w):
        keep = jnp.asarray(np.stack(keeps))
        z = w / tr.temperature
        lsm = jax.nn.log_softmax(jnp.where(keep, z, -jnp.inf), axis=-1)
        lsm = jnp.where(keep, lsm, 0.0)  # finite everywhere (no NaN cotangents)
        picked = jnp.take_along_axis(lsm, jnp.asarray(tgt[0])[:, None], axis=-1)[:, 0]
        picked = picked.at[-1].set(0.0)
        h = -jnp.sum(jnp.where(keep, jnp.exp(lsm) * lsm, 0.0), axis=-1)
        return jnp.sum(picked) + jnp.sum(h)

    g = nnx.grad(f)(model).w[...]
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(reference)(logits)), atol=1e-5)
    assert np.all(np.isfinite(np.asarray(g)))


def test_backward_does_not_rerun_the_threshold_search():
    # The filters' bisection runs once per chunk; the backward pass reuses the saved thresholds.
    model = _Head(np.random.default_rng(1).normal(size=(8, 64)).astype(np.float32))
    ids, pos = jnp.zeros((1, 8), jnp.int32), jnp.arange(8)[None]
    tr = SamplingTransform(temperature=0.7, top_k=10, top_p=0.9)
    f = lambda m, tr: token_stats(m, ids, pos, jnp.ones_like(ids), ids, chunk=4, sampling=tr)
    fwd = str(jax.make_jaxpr(lambda m: f(m, tr).logprobs)(model)).count("while[")
    both = str(jax.make_jaxpr(nnx.grad(lambda m: f(m, tr).logprobs.sum()))(model)).count("while[")
    assert fwd >= 1 and both == fwd


def test_sampling_transform_from_rollout():
    assert SamplingTransform.from_rollout(RolloutConfig()) is None  # T=1, unfiltered
    assert (
        SamplingTransform.from_rollout(RolloutConfig(sampling=Sampling(temperature=0.0, top_p=0.9)))
        is None
    )
    got = SamplingTransform.from_rollout(
        RolloutConfig(sampling=Sampling(temperature=0.8, top_k=40, min_p=0.02))
    )
    assert got == SamplingTransform(temperature=0.8, top_k=40, min_p=0.02)
    assert hash(got) == hash(SamplingTransform(temperature=0.8, top_k=40, min_p=0.02))
    assert (
        SamplingTransform.from_rollout(RolloutConfig(sampling=Sampling(top_p=0.95))).top_p == 0.95
    )
    with pytest.raises(ValueError, match="greedy"):
        SamplingTransform(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingTransform(top_p=0.0)


def test_a_bf16_sampler_shows_as_mismatch_and_the_correction_covers_it(rollout_setup):
    """``EngineConfig.dtype=bfloat16`` under the float32 learner: the rollout's behaviour
    logprobs are the bf16 sampler's, so at the sampler's weights the update sees a small
    mismatch (``mismatch_kl`` > 0, IS weights off 1 by bf16 rounding) instead of none (the test
    above), which truncated IS covers (nothing truncated at the cap of 2)."""
    chat, model, rollout, collector, _ = rollout_setup
    engine = Engine(
        model,
        EngineConfig(
            max_slots=4, max_seq_len=512, prefill_buckets=(64, 256), decode_chunk=8,
            unroll_layers=True, dtype="bfloat16",
        ),
    )  # fmt: skip
    tasks = Calc.make_tasks("train", 3, seed=0)

    async def main():
        async with engine:
            return await collector.collect(engine, tasks, group_size=2, seed=0)

    roll = asyncio.run(main())
    db = collector.device_batch(roll, rows=len(roll.trajectories), max_turns=rollout.max_turns)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-3, warmup_steps=0).build()
    update = make_rl_update(
        graphdef, rest, tx, loss_cfg=LossConfig(name="ppo_clip", is_correction="tis_token"),
        adv_cfg=AdvantageConfig(name="grpo"), epochs=1, minibatches=1, microbatches=1,
        logprob_chunk=128, sampling=SamplingTransform.from_rollout(rollout),
    )  # fmt: skip
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)
    _, met = update(state, db.batch, db.episodes, jax.random.key(0), None)
    assert 1e-7 < float(met.mismatch_kl) < 1e-2, float(met.mismatch_kl)
    # the PPO ratio is against the learner's own recompute (1 at these weights); the IS weights
    # pi_old / mu carry the difference, near 1, none truncated
    assert float(met.ratio_max) == pytest.approx(1.0, abs=2e-5)
    assert 1e-5 < abs(float(met.is_weight_mean) - 1.0) < 0.05, float(met.is_weight_mean)
    assert float(met.is_truncated_frac) == 0.0
