"""Logit parity with transformers' PyTorch models, and KV-cache path == full forward.

References: ``LlamaForCausalLM`` (llama3 rope scaling), ``Qwen2ForCausalLM`` (q/k/v bias),
``Qwen3ForCausalLM`` (q/k norm, tied embeddings, head_dim != hidden/heads), on a ragged batch
(left-padded, right-padded and full rows) with explicit position ids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_refs import FAMILIES, hf_logits, jax_logits, ragged_batch

from jaxrl_agents.models import KVCache, ModelConfig, Transformer, init_cache, load_pretrained

FP32_TOL = 1e-4
# bf16 compute (fp32 params, fp32 softmax/norm statistics) vs an fp32 reference: bf16 has an
# 8-bit mantissa, so per-op relative error ~4e-3 compounds over 2 layers; logits here are O(1-3).
BF16_TOL = 0.1


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_fp32(hf_checkpoints, family):
    hf_model, folder = hf_checkpoints[family]
    model, _ = load_pretrained(folder, tokenizer=False)
    tokens, positions, seg = ragged_batch()
    ref = hf_logits(hf_model, tokens, positions, seg)
    ours = jax_logits(model, tokens, positions, seg)
    valid = seg != 0
    assert np.abs(ref[valid]).max() > 0.5  # logits are not trivially tiny
    err = np.abs(ours[valid] - ref[valid]).max()
    assert err <= FP32_TOL, f"{family}: max |diff| {err:.2e} > {FP32_TOL}"


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_logits_match_transformers_bf16_compute(hf_checkpoints, family):
    hf_model, folder = hf_checkpoints[family]
    model, _ = load_pretrained(folder, dtype="bfloat16", param_dtype="float32", tokenizer=False)
    assert model.layers.q[...].dtype == jnp.float32
    tokens, positions, seg = ragged_batch()
    ref = hf_logits(hf_model, tokens, positions, seg)
    ours = jax_logits(model, tokens, positions, seg)
    valid = seg != 0
    err = np.abs(ours[valid] - ref[valid]).max()
    assert err <= BF16_TOL, f"{family} bf16: max |diff| {err:.3f} > {BF16_TOL}"
    assert err > 1e-6  # bf16 compute really happened


def _tiny(model_type: str = "qwen3") -> ModelConfig:
    return ModelConfig(
        model_type=model_type,
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        attention_bias=True,
        qk_norm=True,
        tie_word_embeddings=True,
    )


@nnx.jit
def _step(model, tokens, positions, seg, cache):
    return model(tokens, positions, segment_ids=seg, cache=cache)


def test_cache_path_equals_full_forward():
    """Ragged prefill in two chunks, then T=1 decode steps == one full causal forward per row."""
    model = Transformer(_tiny(), rngs=nnx.Rngs(0))
    rng = np.random.RandomState(1)
    B, total = 3, 12
    tokens = rng.randint(0, 128, (B, total)).astype(np.int32)
    full_pos = np.broadcast_to(np.arange(total, dtype=np.int32), (B, total))
    full, _ = _step(model, tokens, full_pos, None, None)
    full = np.asarray(full)

    # Chunk lengths per row (right-padded chunks): rows advance at different rates.
    chunk1 = np.array([5, 3, 1])
    chunk2 = np.array([2, 4, 6])
    cache = init_cache(model.cfg, batch=B, max_len=16)
    got = [[] for _ in range(B)]
    done = np.zeros(B, int)
    for lens, width in ((chunk1, 6), (chunk2, 6), *[(np.ones(B, int), 1)] * 4):
        t = np.zeros((B, width), np.int32)
        p = np.zeros((B, width), np.int32)
        s = np.zeros((B, width), np.int32)
        for b in range(B):
            n = lens[b]
            t[b, :n] = tokens[b, done[b] : done[b] + n]
            p[b, :n] = np.arange(done[b], done[b] + n)
            s[b, :n] = 1
        logits, cache = _step(model, t, p, s, cache)
        for b in range(B):
            got[b].append(np.asarray(logits)[b, : lens[b]])
        done += lens
        np.testing.assert_array_equal(np.asarray(cache.lengths), done)
    for b in range(B):
        row = np.concatenate(got[b])
        np.testing.assert_allclose(row, full[b, : done[b]], atol=1e-5, rtol=0)


def test_cache_write_leaves_other_rows_untouched():
    cfg = _tiny()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, 8, cfg.head_dim)  # [L B K S Dh]
    k0 = jax.random.normal(jax.random.key(0), shape)
    v0 = jax.random.normal(jax.random.key(1), shape)
    cache = KVCache(k=k0, v=v0, lengths=jnp.array([3, 8], jnp.int32))
    tokens = jnp.array([[5, 6], [7, 8]], jnp.int32)
    positions = jnp.array([[3, 4], [8, 9]], jnp.int32)
    seg = jnp.array([[1, 1], [1, 0]], jnp.int32)  # row 1 is full: its write must be dropped
    _, new = _step(model, tokens, positions, seg, cache)
    np.testing.assert_array_equal(np.asarray(new.lengths), [5, 9])
    changed = np.any(np.asarray(new.k) != np.asarray(k0), axis=(0, 2, 4))  # [B, S]
    expected = np.zeros((2, 8), bool)
    expected[0, 3:5] = True
    np.testing.assert_array_equal(changed, expected)
    np.testing.assert_array_equal(np.asarray(new.v)[:, 1], np.asarray(v0)[:, 1])


def test_remat_and_bf16_params_run_and_differentiate():
    cfg = _tiny().replace(remat=True, param_dtype="bfloat16", dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    assert model.layers.gate[...].dtype == jnp.bfloat16
    tokens, positions, seg = ragged_batch()

    def loss(m):
        return m(tokens, positions, segment_ids=seg)[0].mean()

    grads = nnx.jit(nnx.grad(loss))(model)
    g = grads["layers"]["q"][...]
    assert g.dtype == jnp.bfloat16 and bool(jnp.isfinite(g).all()) and bool((g != 0).any())


@pytest.mark.parametrize("unroll", [2, 3])
def test_unrolled_layer_scan_matches_the_rolled_one(unroll):
    """``scan_unroll`` changes how the layers compile, not what they compute: logits, the KV cache
    and every gradient (base and adapters) equal the one-layer scan's. 2 of 3 layers leaves a
    remainder iteration; 3 unrolls the whole stack."""
    from jaxrl_agents.models.config import LoRAConfig
    from jaxrl_agents.models.lora import add_lora

    cfg = _tiny().replace(num_hidden_layers=3)
    tokens, positions, seg = ragged_batch()

    def run(scan_unroll):
        model = Transformer(cfg.replace(scan_unroll=scan_unroll), rngs=nnx.Rngs(0))
        add_lora(model, LoRAConfig(rank=4, alpha=8.0), seed=1)
        for i, name in enumerate(sorted(n for n in vars(model.lora) if n.endswith("_b"))):
            b = getattr(model.lora, name)  # zeros at init: give A a gradient too
            b[...] = 0.1 * jax.random.normal(jax.random.key(i), b[...].shape)
        cache = init_cache(cfg, batch=tokens.shape[0], max_len=tokens.shape[1] + 2)
        logits, new = nnx.jit(lambda m: m(tokens, positions, segment_ids=seg, cache=cache))(model)
        grads = nnx.jit(nnx.grad(lambda m: m(tokens, positions, segment_ids=seg)[0].mean()))(model)
        return logits, new.k, jax.tree.leaves(nnx.state(grads))

    logits, k, grads = run(1)
    logits_u, k_u, grads_u = run(unroll)
    np.testing.assert_allclose(np.asarray(logits_u), np.asarray(logits), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(k_u), np.asarray(k), rtol=1e-5, atol=1e-5)
    assert len(grads_u) == len(grads) > 10
    for g_u, g in zip(grads_u, grads, strict=True):
        assert float(jnp.abs(g).max()) > 0 or g.size == 0
        np.testing.assert_allclose(np.asarray(g_u), np.asarray(g), rtol=1e-4, atol=1e-6)


def test_scan_unroll_must_be_a_positive_layer_count():
    with pytest.raises(ValueError, match="scan_unroll=0"):
        _tiny().replace(scan_unroll=0)
