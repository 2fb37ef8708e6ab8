"""The jitted train step: exact gradient accumulation, the non-finite guard, SFT loss masking.

Uses a toy NNX language model with the policy's interface (``hidden_states`` +
``logits_from_hidden``), so these properties are checked independently of the decoder.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from toy_lm import ToyLM

from jaxrl_agents.rollout.packing import pack_sft
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import (
    LossInputs,
    OptimizerConfig,
    init_train_state,
    make_train_step,
)


def _batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        L = int(rng.integers(5, 15))
        ids = rng.integers(1, 32, L).tolist()
        p = int(rng.integers(1, L - 2))
        rows.append((ids, [0] * p + [1] * (L - p)))
    b, _ = pack_sft(rows, buckets=[16])
    return jax.tree.map(jnp.asarray, b)


def _setup(micro, lr=1e-2):
    model = ToyLM(rngs=nnx.Rngs(0))
    gd, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=lr, warmup_steps=1, grad_clip=0.0).build()
    state = init_train_state(params, tx)
    step = make_train_step(gd, tx, sft_loss(chunk=8), microbatches=micro, rest=rest)
    return state, step


@pytest.mark.parametrize("micro", [2, 4])
def test_gradient_accumulation_equals_full_batch(micro):
    batch = _batch()
    extra = LossInputs(denom=jnp.sum(batch.loss_mask))
    s1, step1 = _setup(1)
    sk, stepk = _setup(micro)
    for _ in range(3):
        s1, m1 = step1(s1, batch, extra)
        sk, mk = stepk(sk, batch, extra)
    np.testing.assert_allclose(float(m1["loss"]), float(mk["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(sk.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_nan_batch_is_skipped_and_counted():
    batch = _batch()
    extra = LossInputs(denom=jnp.sum(batch.loss_mask))
    state, step = _setup(1)
    before = jax.tree.map(np.asarray, state.params)
    bad_extra = LossInputs(denom=jnp.float32(jnp.nan))
    state, m = step(state, batch, bad_extra)
    assert bool(m["nonfinite"]) and int(state.skipped) == 1 and int(state.step) == 0
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    state, m = step(state, batch, extra)  # training goes on
    assert not bool(m["nonfinite"]) and int(state.step) == 1 and int(state.skipped) == 1


def test_sft_loss_ignores_unmasked_tokens():
    """Changing prompt/observation targets (mask 0) must not change loss or gradients."""
    batch = _batch()
    extra = LossInputs(denom=jnp.sum(batch.loss_mask))
    noisy = batch._replace(
        target_ids=jnp.where(batch.loss_mask > 0, batch.target_ids, (batch.target_ids + 7) % 32)
    )
    s_a, step = _setup(1)
    s_b, _ = _setup(1)
    s_a, ma = step(s_a, batch, extra)
    s_b, mb = step(s_b, noisy, extra)
    assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-6)


@pytest.mark.parametrize("warmup", [0, 1, 5])
def test_first_update_is_not_a_noop(warmup):
    """Warmup ramps to the peak lr without a zero-lr first step (which would skip the first RL
    update of every run)."""
    model = ToyLM(rngs=nnx.Rngs(0))
    gd, params, rest = nnx.split(model, nnx.Param, ...)
    before = jax.tree.map(np.asarray, params)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=warmup, grad_clip=0.0).build()
    step = make_train_step(gd, tx, sft_loss(chunk=8), rest=rest)
    batch = _batch()
    state, _ = step(init_train_state(params, tx), batch, LossInputs(jnp.sum(batch.loss_mask)))
    moved = max(
        float(np.max(np.abs(np.asarray(a) - b)))
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before), strict=True)
    )
    assert moved > 1e-4, moved
