"""The fused attention path (``ModelConfig.attention="fused"``: ``jax.nn.dot_product_attention``,
cuDNN flash attention on GPU) computes what the reference einsums compute, checked on CPU through
its XLA lowering: packed rows (several segments per row, padding), gradients, and cache prefill
(stacked and unrolled layers)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_agents.models import ModelConfig, Transformer, init_cache
from jaxrl_agents.models.decoder import (
    decode_weights,
    forward_unrolled,
    fused_attention,
    init_layer_cache,
)

BASE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    model_type="qwen3",
    qk_norm=True,
)


def pair():
    ref = ModelConfig(**BASE, attention="reference")
    model = Transformer(ref, rngs=nnx.Rngs(0))
    fused = Transformer(ref.replace(attention="fused"), rngs=nnx.Rngs(0))
    nnx.update(fused, nnx.state(model))
    return model, fused


def segment_positions(seg: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 in each segment of each row (0 on padding)."""
    pos = np.zeros_like(seg)
    for b in range(seg.shape[0]):
        for s in set(seg[b]) - {0}:
            idx = np.where(seg[b] == s)[0]
            pos[b, idx] = np.arange(len(idx))
    return pos


def packed_rows():
    """Two rows: three segments + padding, and one segment + padding."""
    rng = np.random.default_rng(0)
    seg = np.array([[1] * 5 + [2] * 7 + [3] * 3 + [0] * 1, [1] * 11 + [0] * 5], np.int32)
    pos = segment_positions(seg)
    tokens = rng.integers(0, BASE["vocab_size"], seg.shape).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)


def test_auto_is_fused_on_gpu_only():
    cfg = ModelConfig(**BASE)
    assert fused_attention(cfg) == ("cudnn" if jax.default_backend() == "gpu" else None)
    assert fused_attention(cfg.replace(attention="reference")) is None
    assert fused_attention(cfg.replace(attention="fused")) in ("xla", "cudnn")
    with pytest.raises(ValueError, match="attention='flash'"):
        cfg.replace(attention="flash")


def test_packed_rows_and_gradients_match_the_reference():
    model, fused = pair()
    tokens, pos, seg = packed_rows()
    valid = np.asarray(seg) != 0
    a, _ = model(tokens, pos, segment_ids=seg)
    b, _ = fused(tokens, pos, segment_ids=seg)
    assert np.all(np.isfinite(np.asarray(b)))  # padding queries too
    np.testing.assert_allclose(np.asarray(b)[valid], np.asarray(a)[valid], atol=2e-5, rtol=2e-5)
    # each segment alone gives the same logits as inside the packed row (isolation)
    alone, _ = fused(tokens[:1, 5:12], pos[:1, 5:12], segment_ids=jnp.ones((1, 7), jnp.int32))
    np.testing.assert_allclose(np.asarray(alone)[0], np.asarray(b)[0, 5:12], atol=2e-5)

    def loss(m):
        logits, _ = m(tokens, pos, segment_ids=seg)
        lp = jax.nn.log_softmax(logits, -1)
        return jnp.sum(jnp.where(seg[..., None] > 0, lp, 0.0)[..., 0])

    ga = nnx.state(nnx.grad(loss)(model), nnx.Param)
    gb = nnx.state(nnx.grad(loss)(fused), nnx.Param)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=5e-5, rtol=1e-4)


def test_cache_prefill_matches_the_reference_stacked_and_unrolled():
    model, fused = pair()
    rng = np.random.default_rng(1)
    B, T, S = 3, 6, 20
    tokens = jnp.asarray(rng.integers(0, 96, (B, T)), jnp.int32)
    seg = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2, [0] * 6], jnp.int32)  # a row with nothing new
    # stacked layers: prefill on top of rows that already hold a few tokens
    prior = jnp.asarray(rng.integers(0, 96, (B, 3)), jnp.int32)
    outs = []
    for m in (model, fused):
        cache = init_cache(m.cfg, batch=B, max_len=S)
        _, cache = m(prior, jnp.tile(jnp.arange(3), (B, 1)), cache=cache)
        logits, cache = m(tokens, 3 + jnp.tile(jnp.arange(T), (B, 1)), segment_ids=seg, cache=cache)
        outs.append((np.asarray(logits), cache))
    valid = np.asarray(seg) != 0
    np.testing.assert_allclose(outs[1][0][valid], outs[0][0][valid], atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(outs[1][1].k), np.asarray(outs[0][1].k), atol=1e-5)
    # unrolled layers (the sampler's layout; K stored transposed)
    hs = []
    for m in (model, fused):
        w = decode_weights(m)
        cache = init_layer_cache(m.cfg, batch=B, max_len=S)
        h, _ = forward_unrolled(
            m.cfg, w, tokens, jnp.tile(jnp.arange(T), (B, 1)), segment_ids=seg, cache=cache
        )
        hs.append(np.asarray(h))
    np.testing.assert_allclose(hs[1][valid], hs[0][valid], atol=2e-5, rtol=2e-5)


def test_ragged_decode_kernel_matches_the_reference_decode():
    """The Pallas decode-attention kernel (interpret mode on CPU) equals the reference decode
    step: ragged rows (1 visible position up to the full window), both cache layouts, GQA."""
    from jaxrl_agents.models.decode_attention import ragged_decode_attention

    rng = np.random.default_rng(2)
    B, H, K, S, Dh = 4, 6, 2, 48, 16
    q = jnp.asarray(rng.normal(size=(B, H, Dh)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, K, S, Dh)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, K, S, Dh)), jnp.float32)
    visible = jnp.asarray([1, 5, 33, 48], jnp.int32)
    mask = jnp.arange(S)[None, None, :] < visible[:, None, None]  # [B 1 S]
    from jaxrl_agents.models.attention import _attend

    want = np.asarray(_attend(q[:, None], k, v, mask))[:, 0]
    for k_t, kk in ((False, k), (True, jnp.swapaxes(k, 2, 3))):
        got = ragged_decode_attention(q, kk, v, visible, k_t=k_t, block=16)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, rtol=1e-5)


def test_pallas_decode_through_the_engine_gives_the_same_tokens():
    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    cfg = ModelConfig(**BASE)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    other = Transformer(cfg.replace(decode_attention="pallas"), rngs=nnx.Rngs(0))
    nnx.update(other, nnx.state(model))
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    sp = SamplingParams(temperature=0.0, max_new_tokens=6)
    ecfg = EngineConfig(max_slots=4, max_seq_len=32, prefill_buckets=(8,), decode_chunk=3)
    a = Engine(model, ecfg).generate_batch(prompts, sp)
    b = Engine(other, ecfg).generate_batch(prompts, sp)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_query_blocks_match_the_full_square(monkeypatch):
    """A cache-free forward longer than ``QUERY_BLOCK`` attends one query block at a time over
    the keys up to the block's end (``attention._attend_causal_blocks``): on packed rows of 300
    tokens (segments crossing block edges, padding) the logits and every gradient equal those of
    the one ``[T, T]`` square."""
    import jaxrl_agents.models.attention as att

    model = Transformer(ModelConfig(**BASE, attention="reference"), rngs=nnx.Rngs(0))
    seg = np.array([[1] * 100 + [2] * 150 + [3] * 40 + [0] * 10, [1] * 260 + [0] * 40], np.int32)
    pos = segment_positions(seg)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 96, seg.shape), jnp.int32)
    pos, seg = jnp.asarray(pos), jnp.asarray(seg)
    valid = np.asarray(seg) != 0
    assert att.QUERY_BLOCK < 300 and 300 % att.QUERY_BLOCK  # several blocks, a ragged last one

    def loss(m):
        logits, _ = m(tokens, pos, segment_ids=seg)
        lp = jax.nn.log_softmax(logits, -1)
        return jnp.sum(jnp.where(seg[..., None] > 0, lp, 0.0)[..., :3])

    def run():
        logits, _ = model(tokens, pos, segment_ids=seg)
        return np.asarray(logits), nnx.state(nnx.grad(loss)(model), nnx.Param)

    blocked = run()
    monkeypatch.setattr(att, "QUERY_BLOCK", 1 << 20)
    full = run()
    np.testing.assert_allclose(blocked[0][valid], full[0][valid], atol=2e-6, rtol=2e-6)
    for x, y in zip(jax.tree.leaves(full[1]), jax.tree.leaves(blocked[1]), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2e-5, rtol=1e-4)
