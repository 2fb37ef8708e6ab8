"""The sampler's unrolled forward (per-layer weights and KV buffers) computes what the model's
layer scan computes: same hidden states, logits and cache contents, with and without a cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.models import ModelConfig, Transformer, init_cache
from jaxrl_agents.models.decoder import (
    decode_weights,
    forward_unrolled,
    init_layer_cache,
    logits_unrolled,
)

BASE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)
CASES = {
    "qwen2-tied": dict(model_type="qwen2", attention_bias=True, tie_word_embeddings=True),
    "qwen3-qknorm-untied": dict(model_type="qwen3", qk_norm=True, tie_word_embeddings=False),
    "llama-bf16-compute": dict(model_type="llama", dtype="bfloat16"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unrolled_matches_scan(case):
    cfg = ModelConfig(**BASE, **CASES[case])
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    w = decode_weights(model)
    tol = 2e-2 if cfg.dtype == "bfloat16" else 1e-5
    rng = np.random.default_rng(0)
    B, T, S = 3, 7, 24
    tokens = jnp.asarray(rng.integers(0, 96, (B, T)), jnp.int32)
    seg = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5], jnp.int32)  # right padding

    # no cache (segment masking)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    ref = model(tokens, pos, segment_ids=seg)[0]
    h, _ = forward_unrolled(cfg, w, tokens, pos, segment_ids=seg)
    got = logits_unrolled(w, h)
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)

    # prefill into a cache, then one decode step, from ragged lengths
    lengths = jnp.asarray([0, 5, 2], jnp.int32)
    ref_c = init_cache(cfg, batch=B, max_len=S)._replace(lengths=lengths)
    got_c = init_layer_cache(cfg, batch=B, max_len=S)._replace(lengths=lengths)
    for step_tokens, step_seg in ((tokens, seg), (tokens[:, :1], jnp.ones((B, 1), jnp.int32))):
        t = step_tokens.shape[1]
        p = ref_c.lengths[:, None] + jnp.arange(t)[None]
        ref, ref_c = model(step_tokens, p, segment_ids=step_seg, cache=ref_c)
        h, got_c = forward_unrolled(cfg, w, step_tokens, p, segment_ids=step_seg, cache=got_c)
        valid = np.asarray(step_seg, bool)
        np.testing.assert_allclose(
            np.asarray(logits_unrolled(w, h))[valid], np.asarray(ref)[valid], atol=tol, rtol=tol
        )
        np.testing.assert_array_equal(got_c.lengths, ref_c.lengths)
        for i in range(cfg.num_hidden_layers):
            np.testing.assert_allclose(
                np.asarray(got_c.k[i], np.float32).swapaxes(-1, -2),  # stored [B K Dh S]
                np.asarray(ref_c.k[i], np.float32),
                atol=tol,
                rtol=tol,
            )
            np.testing.assert_allclose(
                np.asarray(got_c.v[i], np.float32),
                np.asarray(ref_c.v[i], np.float32),
                atol=tol,
                rtol=tol,
            )


def test_decode_weights_layout():
    cfg = ModelConfig(**BASE, model_type="qwen2", tie_word_embeddings=True, dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    w = jax.jit(lambda st: decode_weights(nnx.merge(*nnx.split(model)[:1], st)))(nnx.state(model))
    assert len(w["layers"]) == 3 and w["head"].shape == (64, 96)
    assert {a.dtype for a in jax.tree.leaves(w)} == {jnp.dtype("bfloat16")}
    np.testing.assert_array_equal(
        np.asarray(w["head"], np.float32),
        np.asarray(model.embed[...].T.astype(jnp.bfloat16), np.float32),
    )
