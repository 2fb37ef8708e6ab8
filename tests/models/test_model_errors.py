"""User-caused failures get errors that name the bad value (and the valid choices)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxrl_agents.models import (
    CheckpointError,
    ModelConfig,
    ModelConfigError,
    Transformer,
    export_pretrained,
    load_pretrained,
)

TINY_HF = dict(
    model_type="qwen2",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_qwen2")
    model = Transformer(ModelConfig.from_hf_config(TINY_HF), rngs=nnx.Rngs(0))
    export_pretrained(model, folder)
    return folder


def _copy(src, dst, tensors=None):
    (dst / "config.json").write_text((src / "config.json").read_text())
    if tensors is not None:
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def test_unknown_model_type(tmp_path):
    with pytest.raises(ModelConfigError, match=r"'gpt2'.*llama, qwen2, qwen3"):
        ModelConfig.from_hf_config({**TINY_HF, "model_type": "gpt2"})
    (tmp_path / "config.json").write_text(json.dumps({**TINY_HF, "model_type": "mistral"}))
    with pytest.raises(ModelConfigError, match=r"'mistral'.*llama, qwen2, qwen3"):
        load_pretrained(tmp_path)


def test_unsupported_rope_type_and_dtype():
    with pytest.raises(ModelConfigError, match=r"'yarn'.*default, llama3"):
        ModelConfig.from_hf_config({**TINY_HF, "rope_scaling": {"rope_type": "yarn", "factor": 4}})
    with pytest.raises(ModelConfigError, match=r"dtype='float16'.*float32, bfloat16"):
        ModelConfig.from_hf_config(TINY_HF, dtype="float16")


def test_corrupt_safetensors_names_the_file(exported, tmp_path):
    _copy(exported, tmp_path)
    good = (exported / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8 + good[8:200])
    with pytest.raises(CheckpointError, match=r"corrupt safetensors file .*model\.safetensors"):
        load_pretrained(tmp_path)


def test_truncated_safetensors_names_the_file(exported, tmp_path):
    _copy(exported, tmp_path)
    good = (exported / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"corrupt safetensors file .*model\.safetensors"):
        load_pretrained(tmp_path)


def test_missing_tensor_is_named(exported, tmp_path):
    tensors = load_file(str(exported / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    _copy(exported, tmp_path, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.1\.self_attn\.k_proj\.bias' \(expected shape \(32,\)",
    ):
        load_pretrained(tmp_path)


def test_misshaped_tensor_names_both_shapes(exported, tmp_path):
    tensors = load_file(str(exported / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((100, 64), np.float32)
    _copy(exported, tmp_path, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape \(100, 64\) .* \(128, 64\)",
    ):
        load_pretrained(tmp_path)


def test_missing_files(exported, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)
    _copy(exported, tmp_path)
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load_pretrained(tmp_path)
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "gone.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"gone\.safetensors \(listed in the index\)"):
        load_pretrained(tmp_path)
