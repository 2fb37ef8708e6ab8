"""HF folder -> ours -> export -> transformers loads it: identical tensors and logits.

Also ours -> export -> ours (bit-exact in fp32 and bf16), sharded exports with an index, and the
tokenizer + chat template + generation config travelling with the export.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flax import nnx
from model_refs import hf_logits, ragged_batch

from jaxrl_agents import ModelConfig, Transformer, export_pretrained, load_pretrained
from jaxrl_agents.models.hf_io import INDEX_FILE, SINGLE_FILE, parse_size

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    ("family", "max_shard_size"),
    [("llama3", "2GB"), ("qwen2", "40KB"), ("qwen3", "40KB")],
)
def test_hf_to_ours_to_hf_is_exact(hf_checkpoints, tmp_path, family, max_shard_size):
    from transformers import AutoModelForCausalLM

    hf_model, folder = hf_checkpoints[family]
    model, _ = load_pretrained(folder, tokenizer=False)
    export_pretrained(model, tmp_path, max_shard_size=max_shard_size)

    sharded = max_shard_size != "2GB"
    assert (tmp_path / INDEX_FILE).exists() == sharded
    assert (tmp_path / SINGLE_FILE).exists() == (not sharded)
    if sharded:
        index = json.loads((tmp_path / INDEX_FILE).read_text())
        assert len(set(index["weight_map"].values())) > 1
        for f in set(index["weight_map"].values()):
            assert (tmp_path / f).stat().st_size <= parse_size(max_shard_size) + 10_000

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(hf_model)
    want, got = hf_model.state_dict(), reloaded.state_dict()
    assert sorted(want) == sorted(got)
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name
    assert reloaded.config.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert reloaded.config.rope_parameters == hf_model.config.rope_parameters

    batch = ragged_batch()
    valid = batch[2] != 0
    np.testing.assert_array_equal(
        hf_logits(reloaded, *batch)[valid], hf_logits(hf_model, *batch)[valid]
    )


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_ours_to_hf_to_ours_is_bit_exact(tmp_path, param_dtype):
    cfg = ModelConfig(
        model_type="qwen2",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        param_dtype=param_dtype,
        eos_token_id=2,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(3))
    # Biases and norms start at 0/1; randomise them so a mapping mix-up cannot hide.
    for name in ("q_bias", "k_bias", "v_bias", "attn_norm", "mlp_norm"):
        var = getattr(model.layers, name)
        noise = 0.1 * np.random.RandomState(0).randn(*var[...].shape)
        var.set_value((var[...] + noise).astype(var[...].dtype))
    export_pretrained(model, tmp_path, max_shard_size="30KB")
    loaded, _ = load_pretrained(tmp_path, param_dtype=param_dtype, tokenizer=False)
    assert loaded.cfg == cfg
    want = nnx.to_flat_state(nnx.state(model, nnx.Param))
    got = dict(nnx.to_flat_state(nnx.state(loaded, nnx.Param)))
    assert len(want) == len(got)
    for path, var in want:
        a, b = np.asarray(var[...]), np.asarray(got[path][...])
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3}
    vocab.update({w: i + 4 for i, w in enumerate(["user", "assistant", "hi", "there", "\n"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        chat_template=CHAT_TEMPLATE,
    )


def test_export_writes_tokenizer_chat_template_and_generation_config(hf_checkpoints, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    _, folder = hf_checkpoints["qwen2"]
    model, tok = load_pretrained(folder)
    assert tok is None  # the reference folder has no tokenizer files
    export_pretrained(model, tmp_path, tokenizer=_tiny_tokenizer())

    loaded = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "hi there"}]
    text = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert GenerationConfig.from_pretrained(tmp_path).eos_token_id == loaded.eos_token_id == 2

    _, tok2 = load_pretrained(tmp_path)
    assert tok2 is not None and tok2.chat_template == CHAT_TEMPLATE


def test_parse_size():
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("1GiB") == 2**30
    assert parse_size("40KB") == 40_000
    assert parse_size(123) == 123
    with pytest.raises(ValueError, match="max_shard_size='2 gigs'"):
        parse_size("2 gigs")
