"""Multi-turn slots: continuing a session == generating from the concatenation from scratch."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
from jaxrl_agents.models import ModelConfig, Transformer


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(
        model_type="qwen2",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
    )
    return Transformer(cfg, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def engine(model):
    return Engine(
        model,
        EngineConfig(
            max_slots=4,
            max_seq_len=96,
            prefill_buckets=(8, 32),
            decode_chunk=4,
            decode_windows=(16, 48),  # turns cross windows: the windowed steps must agree
        ),
    )


def teacher_forced_logprobs(model, ids, start):
    """Policy logprob of ids[start:] from one full no-cache forward pass."""
    logits, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
    lp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    return [float(lp[i - 1, ids[i]]) for i in range(start, len(ids))]


def test_continuation_equals_from_scratch(engine, model):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 128, 10).tolist()
    appended = [rng.integers(0, 128, n).tolist() for n in (7, 12, 3)]
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=6, seed=3)
    other_sp = SamplingParams(temperature=1.3, top_k=5, max_new_tokens=11, seed=9)

    async def main():
        async with engine:
            s = await engine.open_session()
            other = (
                await engine.open_session()
            )  # keeps decoding alongside: batching must not matter
            turns, history = [], []
            for new in [prompt, *appended]:
                res, _ = await asyncio.gather(
                    s.generate(new, sp), other.generate(rng.integers(0, 128, 5).tolist(), other_sp)
                )
                turns.append((list(history) + new, res))
                history += new + res.token_ids
                assert s.length == len(history)
            scratch = []
            for context, _ in turns:
                fresh = await engine.open_session()
                scratch.append(await fresh.generate(context, sp))
                await fresh.close()
            await s.close()
            await other.close()
            return history, turns, scratch

    history, turns, scratch = asyncio.run(main())
    for (context, res), ref in zip(turns, scratch, strict=True):
        assert res.token_ids == ref.token_ids
        assert res.finish_reason == ref.finish_reason
        np.testing.assert_allclose(res.logprobs, ref.logprobs, atol=1e-5)
        np.testing.assert_allclose(res.sampling_logprobs, ref.sampling_logprobs, atol=1e-5)
        # On-policy invariant: the sampler's logprobs are the training forward's.
        full = context + res.token_ids
        np.testing.assert_allclose(
            res.logprobs, teacher_forced_logprobs(model, full, len(context)), atol=1e-4
        )


def test_cache_full(model):
    eng = Engine(
        model, EngineConfig(max_slots=2, max_seq_len=32, prefill_buckets=(16,), decode_chunk=4)
    )
    sp = SamplingParams(temperature=0.0, max_new_tokens=10)

    async def main():
        async with eng:
            s = await eng.open_session()
            r1 = await s.generate(list(range(29)), sp)
            assert (len(r1.token_ids), r1.finish_reason, s.length) == (3, "cache_full", 32)
            r2 = await s.generate([5], sp)
            assert (r2.token_ids, r2.finish_reason, s.length) == ([], "cache_full", 32)
            await s.close()
            s = await eng.open_session()  # the freed slot is reused from an empty context
            assert (await s.generate(list(range(32)), sp)).finish_reason == "cache_full"
            r3 = await s.generate(list(range(31)), SamplingParams(temperature=0, max_new_tokens=1))
            assert (len(r3.token_ids), r3.finish_reason) == (1, "length")
            await s.close()

    asyncio.run(main())
