"""Greedy decoding == transformers ``generate(do_sample=False)`` on the same (tiny, random)
weights, for a batch of ragged prompts; sampled-token logprobs == a teacher-forced forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
from jaxrl_agents.models.hf_io import load_pretrained

TINY = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
HF_MODELS = {
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True)),
    "llama": lambda: LlamaForCausalLM(
        LlamaConfig(
            **TINY,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        )
    ),
}
NEW = 12


@pytest.fixture(scope="module", params=sorted(HF_MODELS))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = HF_MODELS[request.param]().eval()
    with torch.no_grad():  # the default init (std 0.02) is near-uniform: greedy would be ties
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    model, _ = load_pretrained(path, tokenizer=False)
    return hf, model


def test_greedy_matches_transformers(pair):
    hf, model = pair
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 160, n).tolist() for n in (1, 5, 13, 30, 8, 21)]
    engine = Engine(
        model,
        EngineConfig(
            max_slots=4,
            max_seq_len=64,
            prefill_buckets=(8, 16),
            decode_chunk=5,
            decode_windows=(24,),
        ),
    )
    ours = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW))
    for prompt, res in zip(prompts, ours, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert res.token_ids == ref[0, len(prompt) :].tolist(), prompt
        assert res.finish_reason == "length"


def test_sampled_logprobs_equal_teacher_forced(pair):
    hf, model = pair
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 160, n).tolist() for n in (3, 17, 9)]
    engine = Engine(
        model, EngineConfig(max_slots=4, max_seq_len=64, prefill_buckets=(16,), decode_chunk=4)
    )
    params = [
        SamplingParams(temperature=t, top_k=k, max_new_tokens=NEW, seed=i)
        for i, (t, k) in enumerate([(1.0, 0), (0.7, 0), (1.2, 20)])
    ]
    results = engine.generate_batch(prompts, params)
    for prompt, res in zip(prompts, results, strict=True):
        ids = prompt + res.token_ids
        logits, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
        lp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
        ref = [lp[i - 1, ids[i]] for i in range(len(prompt), len(ids))]
        np.testing.assert_allclose(res.logprobs, ref, atol=1e-4)
        # transformers agrees too (the policy the weights define, not just our forward).
        with torch.no_grad():
            hf_lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()
        np.testing.assert_allclose(
            res.logprobs, [hf_lp[i - 1, ids[i]] for i in range(len(prompt), len(ids))], atol=1e-4
        )
    assert results[0].sampling_logprobs is None  # T=1, unfiltered: same as logprobs
    assert results[1].sampling_logprobs is not None
