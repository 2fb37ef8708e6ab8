"""Packed rows train exactly like one trajectory per row.

The same trajectories packed two ways by ``rollout.packing`` (one per row, and first-fit
decreasing into fewer, longer rows) go through the real decoder and one ``make_rl_update`` step;
the parameters after the step and every metric must agree to float tolerance, for estimators
and losses whose per-sequence terms differ from per-row ones (seq-mean aggregations, GSPO's
sequence ratio, sequence-level mismatch corrections, KL as a reward, the critic's GAE). The
optimizer is plain SGD, so equal parameters mean equal gradients (Adam's first step would hide
a gradient scale). Also: the decoder isolates a packed row's segments, and SFT is unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.rollout.packing import pack, pack_sft, plan_rows
from jaxrl_agents.training.critic import attach_critic
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import LossInputs, init_train_state, make_train_step
from jaxrl_agents.training.update import RLMetrics, make_rl_update
from jaxrl_agents.types import Ann, EndReason, Task, Trajectory, Turn

BUCKETS = [16, 32, 64]
LENGTHS = [40, 9, 17, 30, 25, 12, 33, 20, 28, 6, 45, 14]  # tokens; 12 trajectories, groups of 4
SLOTS = 14  # two padding slots


def _model(seed=0, critic=False):
    cfg = ModelConfig.from_hf_config(
        dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, tie_word_embeddings=True)
    )  # fmt: skip
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    if critic:
        attach_critic(model, seed=seed)
        # a nonzero head, so the critic's values (and GAE's inputs) are not all 0
        w = model.value_head.proj.kernel
        w[...] = 0.3 * jax.random.normal(jax.random.key(seed + 1), w[...].shape)
    return model


def _trajectories(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(LENGTHS):
        ids = rng.integers(1, 64, n).tolist()
        mask, turns, start = [0] * n, [], max(2, n // 4)
        width = max(1, (n - start) // 4)
        for k in range(2):
            lo, hi = start + 2 * k * width, min(start + (2 * k + 1) * width, n)
            if lo < hi:
                mask[lo:hi] = [1] * (hi - lo)
                terms = {"r": float(rng.normal())}
                turns.append(Turn(index=k, start=lo, end=hi, reward_terms=terms,
                                  annotations={Ann.STATE_KEY: f"s{k}-{i % 2}"}))  # fmt: skip
        lps = [float(rng.normal(-3.5, 0.3)) if m else 0.0 for m in mask]
        out.append(
            Trajectory(
                task=Task(id=f"t{i // 4}", env="x", split="train", data={}), messages=[],
                tools=[], token_ids=ids, loss_mask=mask, logprobs=lps, prompt_len=start,
                turns=turns, end_reason=EndReason.ANSWERED, group_id=i // 4,
                reward=float(rng.choice([-1.0, 0.5, 1.0])),
            )
        )  # fmt: skip
    return out


def _layouts(multiple=1):
    trajs = _trajectories()
    one = pack(trajs, buckets=BUCKETS, batch_size=SLOTS, max_turns=2)
    plan = plan_rows([[n - 1 for n in LENGTHS]], buckets=BUCKETS, multiple=multiple,
                     max_rows=SLOTS)  # fmt: skip
    packed = pack(trajs, buckets=BUCKETS, batch_size=SLOTS, max_turns=2, rows=plan)
    assert packed.batch.input_ids.shape[0] < one.batch.input_ids.shape[0]
    assert packed.real_frac > 1.4 * one.real_frac
    put = lambda p: (jax.tree.map(jnp.asarray, p.batch), jax.tree.map(jnp.asarray, p.episodes))
    return put(one), put(packed)


def _step(model, batch, episodes, *, loss_cfg, adv_cfg, epochs=2, microbatches=1, ref=False,
          sampling=None):  # fmt: skip
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(0.5)
    update = make_rl_update(
        graphdef, rest, tx, loss_cfg=loss_cfg, adv_cfg=adv_cfg, epochs=epochs, minibatches=1,
        microbatches=microbatches, logprob_chunk=16, sampling=sampling,
    )  # fmt: skip
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)
    ref_params = jax.tree.map(jnp.copy, params) if ref else None
    if ref:  # a reference different from the starting weights: the KL is not 0
        ref_params = jax.tree.map(lambda x: x * 0.9, ref_params)
    new, metrics = update(state, batch, episodes, jax.random.key(3), ref_params)
    return new, metrics, params


# Each case compiles two update programs (~15 s on 2 cores), so the cases combine features: every
# aggregation mode, GSPO's sequence ratio, both sequence-level corrections, KL as a loss term and
# as a reward, entropy, and every estimator family (group baselines, token-level returns, GiGPO's
# anchors, the critic's GAE and turn-level values).
CASES = {
    "grpo+ppo_clip token-mean, mis_geo": (
        dict(name="grpo"),
        dict(name="ppo_clip", is_correction="mis_geo", is_cap=1.9),
    ),
    "dr_grpo+seq-mean-token-sum-norm, kl loss term, tis_seq": (
        dict(name="dr_grpo"),
        dict(
            name="ppo_clip",
            agg_mode="seq-mean-token-sum-norm",
            max_len_norm=48,
            kl_coef=0.1,
            is_correction="tis_seq",
            is_cap=1.5,
        ),
    ),  # fmt: skip
    "gspo seq-mean-token-mean": (
        dict(name="grpo"),
        dict(name="gspo", clip_low=3e-4, clip_high=4e-4, agg_mode="seq-mean-token-mean"),
    ),
    "reinforce_pp+cispo seq-mean-token-sum, entropy, kl reward": (
        dict(name="reinforce_pp", gamma=0.97),
        dict(
            name="cispo",
            agg_mode="seq-mean-token-sum",
            entropy_coef=0.01,
            kl_coef=0.05,
            kl_as_reward=True,
            kl_estimator="k1",
        ),
    ),  # fmt: skip
    "gigpo+seq-mean-token-mean": (
        dict(name="gigpo"),
        dict(name="ppo_clip", agg_mode="seq-mean-token-mean"),
    ),
    "gae+ppo_value (critic)": (
        dict(name="gae", gamma=0.99, lam=0.95),
        dict(name="ppo_clip", vf_coef=0.5, vf_clip=0.2),
    ),
    "turn_level with values (critic)": (
        dict(name="turn_level", gamma=0.9, lam=0.9),
        dict(name="ppo_clip", vf_coef=0.5, agg_mode="seq-mean-token-mean"),
    ),
}


def _assert_same(a_params, b_params, a_metrics, b_metrics, start):
    moved = 0.0
    for a, b, s in zip(jax.tree.leaves(a_params), jax.tree.leaves(b_params),
                       jax.tree.leaves(start), strict=True):  # fmt: skip
        a, b, s = np.asarray(a), np.asarray(b), np.asarray(s)
        scale = max(float(np.abs(a - s).max()), 1e-6)
        # float32 sums in another order (other shapes): Adam's m / sqrt(v) turns that into up to
        # ~3e-5 of a tensor's movement (the critic case, 1 of 32 entries); a packing bug (a
        # segment seeing another, a lost token) moves whole tensors by O(their movement)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * scale)
        moved = max(moved, float(np.abs(a - s).max()))
    assert moved > 1e-3  # the step did something
    for name in RLMetrics._fields:
        x, y = float(getattr(a_metrics, name)), float(getattr(b_metrics, name))
        if np.isnan(x):
            assert np.isnan(y), name
        else:
            assert y == pytest.approx(x, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("case", list(CASES))
def test_packed_update_equals_one_trajectory_per_row(case):
    adv_kw, loss_kw = CASES[case]
    loss_cfg, adv_cfg = LossConfig(**loss_kw), AdvantageConfig(**adv_kw)
    critic = loss_cfg.vf_coef > 0
    (b1, e1), (b2, e2) = _layouts()
    ref = loss_cfg.kl_coef > 0
    kw = dict(loss_cfg=loss_cfg, adv_cfg=adv_cfg, ref=ref)
    new1, m1, start = _step(_model(critic=critic), b1, e1, **kw)
    new2, m2, _ = _step(_model(critic=critic), b2, e2, **kw)
    _assert_same(new1.params, new2.params, m1, m2, start)
    assert float(m1.adv_abs) > 0 and int(m1.skipped) == 0
    if loss_cfg.is_correction == "mis_geo":
        assert 0 < float(m1.is_masked_frac) < 1  # some sequences dropped, not all
    if critic:
        assert np.isfinite(float(m1.vf_loss)) and np.isfinite(float(m1.explained_variance))


def test_packed_update_with_microbatches_and_a_sampling_transform():
    """Micro-batches of packed rows (row count from the ladder of multiples of 2) sum to the
    same gradient; the learner's logprobs under a sampling transform are per segment too."""
    from jaxrl_agents.training.logprobs import SamplingTransform

    (b1, e1), (b2, e2) = _layouts(multiple=2)
    assert b2.input_ids.shape[0] % 2 == 0
    loss_cfg = LossConfig(
        name="ppo_clip", agg_mode="seq-mean-token-mean", is_correction="tis_token"
    )
    kw = dict(loss_cfg=loss_cfg, adv_cfg=AdvantageConfig(name="grpo"), microbatches=2,
              sampling=SamplingTransform(temperature=0.8, top_k=20))  # fmt: skip
    new1, m1, start = _step(_model(), b1, e1, **kw)
    new2, m2, _ = _step(_model(), b2, e2, **kw)
    for a, b in zip(jax.tree.leaves(new1.params), jax.tree.leaves(new2.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the summed loss is layout-free; per-micro-batch token means are not (other rows)
    assert float(m2.loss) == pytest.approx(float(m1.loss), rel=1e-5)
    assert float(m2.grad_norm) == pytest.approx(float(m1.grad_norm), rel=1e-5)


def test_packed_row_logits_equal_each_trajectory_alone():
    model = _model(seed=4)
    trajs = _trajectories(seed=1)
    plan = plan_rows([[n - 1 for n in LENGTHS]], buckets=BUCKETS)
    packed = pack(trajs, buckets=BUCKETS, rows=plan)
    b, ep = packed.batch, packed.episodes
    assert (b.segment_ids.max(axis=1) >= 2).any()  # rows really hold several trajectories
    logits, _ = model(jnp.asarray(b.input_ids), jnp.asarray(b.positions),
                      segment_ids=jnp.asarray(b.segment_ids))  # fmt: skip
    logits = np.asarray(logits)
    for i, t in enumerate(trajs):
        L = len(t.token_ids) - 1
        alone, _ = model(jnp.asarray([t.token_ids[:L]]), jnp.arange(L)[None])
        r, o = int(ep.row[i]), int(ep.offset[i])
        np.testing.assert_allclose(logits[r, o : o + L], np.asarray(alone[0]), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip


def test_sft_packed_equals_unpacked():
    rng = np.random.default_rng(2)
    rows = []
    for n in [30, 9, 17, 25, 12, 40, 6, 21]:
        rows.append((rng.integers(1, 64, n).tolist(), [0] * (n // 3) + [1] * (n - n // 3)))
    one, _ = pack_sft(rows, buckets=BUCKETS)
    plan = plan_rows([[len(ids) - 1 for ids, _ in rows]], buckets=BUCKETS)
    packed, _ = pack_sft(rows, buckets=BUCKETS, rows=plan)
    assert packed.input_ids.size < one.input_ids.size
    out = []
    for batch in (one, packed):
        model = _model(seed=5)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tx = optax.sgd(0.5)
        step = make_train_step(graphdef, tx, sft_loss(chunk=16), rest=rest)
        state = init_train_state(params, tx)
        batch = jax.tree.map(jnp.asarray, batch)
        for _ in range(2):
            state, m = step(state, batch, LossInputs(denom=jnp.sum(batch.loss_mask)))
        out.append((state.params, m))
    (p1, m1), (p2, m2) = out
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for name in ("loss", "nll", "tokens", "grad_norm"):
        assert float(m2[name]) == pytest.approx(float(m1[name]), rel=1e-5), name
