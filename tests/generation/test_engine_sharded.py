"""Under a mesh of 8 simulated CPU devices the engine gives the 1-device greedy tokens."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.sharding import make_mesh

CFG = ModelConfig(
    model_type="qwen2",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
)
ENGINE = EngineConfig(
    max_slots=8, max_seq_len=48, prefill_buckets=(16,), decode_chunk=6, decode_windows=(24,)
)


def run(mesh, unroll=None):
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 128, n).tolist() for n in (2, 9, 15, 4, 11, 7, 1, 13, 6, 3)]
    eng = Engine(model, dataclasses.replace(ENGINE, unroll_layers=unroll), mesh=mesh)
    res = eng.generate_batch(prompts, SamplingParams(temperature=0.0, max_new_tokens=10))
    return eng, [r.token_ids for r in res], [r.logprobs for r in res]


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("unroll", [True, False], ids=["unrolled", "stacked"])
def test_mesh_matches_single_device(unroll):
    _, ref_tokens, ref_lps = run(None, unroll)
    eng, tokens, lps = run(make_mesh((2, 2, 2)), unroll)  # every axis in use
    assert eng.unrolled is unroll
    assert tokens == ref_tokens
    np.testing.assert_allclose(np.concatenate(lps), np.concatenate(ref_lps), atol=1e-5)
    # Slots over data x fsdp (8 slots -> 2 per shard), KV heads over tensor (2 -> 1 per shard).
    for kv, per_layer in ((eng._cache.k, (2, 1, 16, 48)), (eng._cache.v, (2, 1, 48, 16))):
        shards = {s.data.shape for a in (kv if unroll else [kv]) for s in a.addressable_shards}
        assert shards == ({per_layer} if unroll else {(2, 2, 1, 48, 16)})  # K: [B K Dh S]
    # Weight updates keep the placement and the compiled programs.
    n = eng.compile_count
    eng.update_weights(Transformer(CFG, rngs=nnx.Rngs(3)))
    eng.generate_batch([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert eng.compile_count == n


def test_slots_must_divide_the_data_axes():
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    with pytest.raises(ValueError, match="max_slots=6"):
        Engine(model, EngineConfig(max_slots=6), mesh=make_mesh((4, 2, 1)))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")
@pytest.mark.parametrize("unroll", [True, False], ids=["unrolled", "stacked"])
def test_mesh_prefix_forks_match_unshared(unroll):
    """Forks between slots on different shards (the fork runs under shard_map) give the
    unshared single-device results."""
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(1)
    p, q = rng.integers(0, 128, 20).tolist(), rng.integers(0, 128, 20).tolist()
    prompts = [p, q] * 4  # each group spread over the four slot shards
    sps = [SamplingParams(temperature=1.0, max_new_tokens=8, seed=i) for i in range(8)]
    cfg = dataclasses.replace(ENGINE, unroll_layers=unroll)
    ref = Engine(model, dataclasses.replace(cfg, share_prefixes=False)).generate_batch(prompts, sps)
    eng = Engine(model, cfg, mesh=make_mesh((2, 2, 2)))
    got = eng.generate_batch(prompts, sps)
    assert eng.stats["forks"] == 6 and eng.stats["shared_tokens"] == 6 * 19
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    np.testing.assert_allclose(
        np.concatenate([r.logprobs for r in got]),
        np.concatenate([r.logprobs for r in ref]),
        atol=1e-5,
    )
