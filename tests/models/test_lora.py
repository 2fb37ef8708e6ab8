"""LoRA adapters: the unmerged forward equals the merged weights' forward and the sampler's
layouts (merged on push, or unmerged), a fresh adapter is the base policy exactly, the PEFT
export loaded by ``peft`` onto the transformers base gives our logits, and the config validates
its values in one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_refs import FAMILIES

from jaxrl_agents.models import load_pretrained
from jaxrl_agents.models.config import LoRAConfig, ModelConfigError
from jaxrl_agents.models.decoder import decode_weights, forward_unrolled, logits_unrolled
from jaxrl_agents.models.lora import add_lora, merge_lora, without_lora
from jaxrl_agents.models.peft_io import export_peft, load_peft, read_peft_config

TOKENS = np.array([[5, 17, 3, 99, 42, 8, 77, 1], [0, 0, 9, 23, 64, 12, 5, 6]], np.int32)
SEG = (TOKENS != 0).astype(np.int32)
SEG[0, 0] = 1
POS = np.maximum(np.cumsum(SEG, axis=1) - 1, 0).astype(np.int32)


def _randomize(model, seed: int = 1) -> None:
    """Non-zero B so the adapters change the outputs (a fresh adapter's B is zero)."""
    for i, (_, var) in enumerate(sorted(nnx.to_flat_state(nnx.state(model.lora)))):
        key = jax.random.key(seed * 1000 + i)
        var.set_value(0.05 * jax.random.normal(key, var.get_value().shape, jnp.float32))


def _logits(model):
    logits, _ = model(TOKENS, POS, segment_ids=SEG)
    return np.asarray(logits)


@pytest.fixture(scope="module", params=FAMILIES)
def lora_model(request, hf_checkpoints):
    _, folder = hf_checkpoints[request.param]
    model, _ = load_pretrained(folder, tokenizer=False)
    base = _logits(model)
    add_lora(model, LoRAConfig(rank=4, alpha=8.0), seed=0)
    return request.param, folder, model, base


def test_fresh_adapter_is_the_base(lora_model):
    _, _, model, base = lora_model
    fresh = nnx.clone(model)
    for name in fresh.cfg.lora.targets:  # undo any randomisation by another test
        var = getattr(fresh.lora, f"{name}_b")
        var.set_value(jnp.zeros_like(var.get_value()))
    np.testing.assert_array_equal(_logits(fresh), base)


def test_unmerged_equals_merged_and_sampler_layouts(lora_model):
    _, _, model, base = lora_model
    _randomize(model)
    ours = _logits(model)
    assert np.abs(ours - base).max() > 1e-2  # the adapters do something
    merged = merge_lora(model)
    assert merged.cfg.lora is None and not hasattr(merged, "lora")
    np.testing.assert_allclose(_logits(merged), ours, atol=2e-5, rtol=1e-5)
    for merge in (True, False):
        w = decode_weights(model, merge_lora=merge)
        assert ("lora" in w["layers"][0]) is not merge
        h, _ = forward_unrolled(model.cfg, w, TOKENS, POS, segment_ids=SEG)
        got = np.asarray(logits_unrolled(w, h))
        np.testing.assert_allclose(got, ours, atol=2e-5, rtol=1e-5)
    # the base policy: the same arrays, no adapters
    base_view = without_lora(model)
    np.testing.assert_array_equal(_logits(base_view), base)
    assert base_view.layers.q.get_value() is model.layers.q.get_value()


def test_peft_export_loads_onto_the_transformers_base(lora_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    family, folder, model, _ = lora_model
    _randomize(model, seed=2)
    ours = _logits(model)
    out = export_peft(model, tmp_path / "adapter", base=str(folder))
    base = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        ids = torch.tensor(TOKENS[:1])
        theirs = peft_model(input_ids=ids).logits.numpy()
    scale = np.abs(theirs).max()
    assert np.abs(theirs - ours[:1]).max() / scale < 1e-4, family
    # back into a fresh adapter of the same shape
    again, _ = load_pretrained(folder, tokenizer=False)
    add_lora(again, read_peft_config(out), seed=5)
    load_peft(again, out)
    np.testing.assert_allclose(_logits(again), ours, atol=2e-5, rtol=1e-5)


def test_top_layers_adapt_only_the_top_and_export_to_peft(hf_checkpoints, tmp_path):
    """``top_layers``: adapters on the last layers only; merged, unmerged, the sampler's layouts
    and PEFT (``layers_to_transform``) agree, and the gradient pass skips the layers below."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = hf_checkpoints["qwen2"][1]
    model, _ = load_pretrained(folder, tokenizer=False)
    L = model.cfg.num_hidden_layers
    assert L >= 2
    add_lora(model, LoRAConfig(rank=4, alpha=8.0, top_layers=1), seed=0)
    assert model.lora.q_a.get_value().shape[0] == 1
    _randomize(model, seed=3)
    ours = _logits(model)
    np.testing.assert_allclose(_logits(merge_lora(model)), ours, atol=2e-5, rtol=1e-5)
    for merge in (True, False):
        w = decode_weights(model, merge_lora=merge)
        assert [("lora" in p) for p in w["layers"]] == [not merge and i == L - 1 for i in range(L)]
        h, _ = forward_unrolled(model.cfg, w, TOKENS, POS, segment_ids=SEG)
        np.testing.assert_allclose(np.asarray(logits_unrolled(w, h)), ours, atol=2e-5, rtol=1e-5)
    out = export_peft(model, tmp_path / "adapter", base=str(folder))
    config = read_peft_config(out, num_layers=L)
    assert config.top_layers == 1
    base = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        theirs = peft_model(input_ids=torch.tensor(TOKENS[:1])).logits.numpy()
    assert np.abs(theirs - ours[:1]).max() / np.abs(theirs).max() < 1e-4
    again, _ = load_pretrained(folder, tokenizer=False)
    add_lora(again, config, seed=5)
    load_peft(again, out)
    np.testing.assert_allclose(_logits(again), ours, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        load_peft(add_lora(load_pretrained(folder, tokenizer=False)[0], LoRAConfig(4, 8.0)), out)

    def flops(m):  # the adapters' gradient program: the frozen layers below run forward only
        graphdef, params, rest = nnx.split(m, nnx.LoRAParam, ...)

        def loss(params, rest):
            return nnx.merge(graphdef, params, rest)(TOKENS, POS, segment_ids=SEG)[0].sum()

        compiled = jax.jit(jax.grad(loss)).lower(params, rest).compile()
        return compiled.cost_analysis()["flops"]

    # layers unrolled: XLA's cost analysis counts a loop's body once
    top, every = (load_pretrained(folder, tokenizer=False, scan_unroll=L)[0] for _ in "ab")
    add_lora(top, LoRAConfig(rank=4, alpha=8.0, top_layers=1), seed=0)
    add_lora(every, LoRAConfig(rank=4, alpha=8.0), seed=0)
    assert flops(top) < 0.9 * flops(every)


def test_lora_config_errors():
    with pytest.raises(ModelConfigError, match="rank=0"):
        LoRAConfig(rank=0)
    with pytest.raises(ModelConfigError, match="'qkv' is not.*valid: q, k, v"):
        LoRAConfig(targets=("qkv",))
    with pytest.raises(ModelConfigError, match="dropout=0.1.*valid: 0.0"):
        LoRAConfig(dropout=0.1)
    assert LoRAConfig(targets=("v_proj", "q_proj", "q")).targets == ("q", "v")
    with pytest.raises(ModelConfigError, match="top_layers=0: a number of layers >= 1"):
        LoRAConfig(top_layers=0)
    with pytest.raises(ModelConfigError, match="top_layers=5 exceeds the model's 2 layers"):
        LoRAConfig(top_layers=5).first_layer(2)


@pytest.fixture(scope="module")
def qwen2_lora(hf_checkpoints):
    model, _ = load_pretrained(hf_checkpoints["qwen2"][1], tokenizer=False)
    return None, None, add_lora(model, LoRAConfig(rank=4, alpha=8.0), seed=0), None


@pytest.mark.parametrize("unroll", [True, False])
@pytest.mark.parametrize("merge", [True, False])
def test_sampler_runs_the_adapted_policy(qwen2_lora, unroll, merge):
    """The engine samples the policy with its adapters, folded in at the push or unmerged, in
    either layer layout: greedy tokens of the merged checkpoint and the sampled tokens'
    log-probs of a teacher-forced forward; ``update_weights`` takes new adapters."""
    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    _, _, model, _ = qwen2_lora
    _randomize(model, seed=3)
    cfg = EngineConfig(
        max_slots=2,
        max_seq_len=48,
        prefill_buckets=(16,),
        decode_chunk=4,
        unroll_layers=unroll,
        merge_lora=merge,
    )
    prompts = [[5, 17, 3, 99, 42], [9, 23, 64, 12, 5, 6, 8]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    want = Engine(merge_lora(model), cfg).generate_batch(prompts, greedy)
    engine = Engine(nnx.clone(model), cfg)
    got = engine.generate_batch(prompts, greedy)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    _randomize(model, seed=4)  # new adapters, pushed
    engine.update_weights(model)
    res = engine.generate_batch(prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=6))[0]
    ids = prompts[0] + res.token_ids
    logits, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
    lp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    ref = [lp[i - 1, ids[i]] for i in range(len(prompts[0]), len(ids))]
    np.testing.assert_allclose(res.logprobs, ref, atol=1e-4)
