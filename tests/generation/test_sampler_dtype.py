"""A sampler computing in bf16 under a float32 model (``EngineConfig.dtype``): its weight copy and
KV cache are bf16, the learner's parameters untouched; the log-probs it records are its own,
off the float32 model's by a bf16-sized amount (a float32 sampler's are within 2e-4); bad values
name the valid ones."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
from jaxrl_agents.models import ModelConfig, Transformer

CFG = ModelConfig(
    model_type="qwen2",
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
)
ENGINE = dict(max_slots=4, max_seq_len=96, prefill_buckets=(16, 32), decode_chunk=4)


def engine(model, **kw):
    return Engine(model, EngineConfig(**ENGINE, unroll_layers=True, **kw))


def teacher_forced(model, dtype: str, ids: list[int]) -> np.ndarray:
    """Log-probs of ``ids[1:]`` under ``model``'s weights computed in ``dtype`` (a full forward,
    no cache), float32 logits."""
    m = Transformer(dataclasses.replace(model.cfg, dtype=dtype), rngs=nnx.Rngs(0))
    nnx.update(m, nnx.state(model))
    x = jnp.asarray([ids])
    logits = m(x, jnp.arange(len(ids))[None])[0].astype(jnp.float32)
    lp = jax.nn.log_softmax(logits[0, :-1], axis=-1)
    return np.asarray(jnp.take_along_axis(lp, x[0, 1:, None], axis=-1)[:, 0])


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(3))


def test_bf16_sampler_records_its_own_logprobs(model):
    prompts = [list(range(5 + i, 21 + i)) for i in range(3)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)
    bf16 = engine(model, dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(bf16._state)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in bf16._cache.k} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(jnp.float32)}
    own, learner = [], []
    for prompt, r in zip(prompts, bf16.generate_batch(prompts, sp), strict=True):
        assert len(r.token_ids) == 24 and np.all(np.isfinite(r.logprobs))
        n = len(r.token_ids)
        ids = prompt + r.token_ids
        got = np.asarray(r.logprobs)
        own.append(np.abs(got - teacher_forced(model, "bfloat16", ids)[-n:]))
        learner.append(np.abs(got - teacher_forced(model, "float32", ids)[-n:]))
    own, learner = np.concatenate(own), np.concatenate(learner)
    # bf16 rounding moves the log-probs off the float32 learner's, by a bf16-sized amount (the
    # mismatch the RL update measures); a bf16 forward without the cache is as far off (the
    # two bf16 paths round differently), a float32 sampler 10x nearer (below)
    assert 1e-4 < learner.mean() < 0.05 and learner.max() < 0.2, (learner.mean(), learner.max())
    assert own.mean() < 0.05 and own.max() < 0.2, (own.mean(), own.max())
    # a float32 sampler of the same model: the learner's log-probs
    f32 = engine(model, dtype="float32")
    (r,) = f32.generate_batch(prompts[:1], sp)
    ref = teacher_forced(model, "float32", prompts[0] + r.token_ids)[-len(r.token_ids) :]
    np.testing.assert_allclose(r.logprobs, ref, atol=2e-4)
    assert np.abs(np.asarray(r.logprobs) - ref).mean() < 0.1 * learner.mean()


def test_bf16_sampler_takes_float32_weight_pushes(model):
    """update_weights takes the learner's float32 state and re-lays it out in bf16: a greedy
    turn after pushing the same weights back is the same turn."""
    sp = SamplingParams(temperature=0.0, max_new_tokens=12)
    eng = engine(model, dtype="bfloat16")
    (before,) = eng.generate_batch([list(range(10, 30))], sp)
    eng.update_weights(nnx.state(model))
    assert {x.dtype for x in jax.tree.leaves(eng._state)} == {jnp.dtype(jnp.bfloat16)}
    (after,) = eng.generate_batch([list(range(10, 30))], sp)
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs


def test_bad_sampler_dtype_is_named():
    with pytest.raises(ValueError, match=r"dtype='float16'; valid: None, 'float32', 'bfloat16'"):
        EngineConfig(dtype="float16")
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"unroll_layers=true"):
        Engine(model, EngineConfig(**ENGINE, unroll_layers=False, dtype="bfloat16"))
