"""A GGUF file's model as a Hugging Face folder's: ``config.json`` from the metadata and
``model.safetensors`` (or shards) from the tensors.

The config comes from ``{arch}.*`` metadata (block count, head counts, key length,
``rope.freq_base``, RMS epsilon, context length; vocabulary size from ``token_embd``; tied
embeddings when there is no ``output.weight``; Llama 3 RoPE scaling recovered from a
``rope_freqs.weight`` tensor), validated by ``ModelConfig``. Every tensor is dequantized to float32
under its Hugging Face name, llama.cpp's Q/K row permutation undone for the ``llama``
architecture (its converter interleaves the rotary halves of each head there; ``qwen2``/``qwen3``
files are stored unpermuted).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from jaxrl_agents.models.config import ModelConfig, ModelConfigError
from jaxrl_agents.models.gguf_file import GGUFError, dequantize, metadata, short_float

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_ROPE_FREQS = "rope_freqs.weight"


# ---------------------------------------------------------------------------- config
def _llama3_scaling(freqs: np.ndarray, head_dim: int, theta: float, meta_ctx: Any):
    """The Llama 3 RoPE scaling parameters whose per-frequency factors are ``freqs`` (llama.cpp
    stores the factors, not the parameters): ``factor`` is the largest one; the band edges and
    original context are the ones of Llama 3.1-3.3 (or the metadata's original context)."""
    factor = float(np.max(freqs))
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    ctxs = [int(meta_ctx)] if meta_ctx is not None else []
    for orig in dict.fromkeys([*ctxs, 8192, 4096, 16384, 32768, 131072]):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
            smooth = (orig / wavelen - low) / (high - low)
            want = np.where(
                wavelen < orig / high,
                1.0,
                np.where(wavelen > orig / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
            )
            if np.allclose(freqs, want, rtol=1e-4, atol=1e-6):
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": orig,
                }
    raise GGUFError(
        f"{_ROPE_FREQS}: the per-frequency RoPE factors match no Llama 3 scaling (factor "
        f"{factor}); supported: rope_type llama3 or none"
    )


def _rope_scaling(reader, arch: str, tensors: dict, head_dim: int, theta: float):
    """The ``rope_scaling`` of the file: None, or Llama 3 scaling given by ``rope_freqs``."""
    scaling_type = metadata(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "", None):
        raise GGUFError(
            f"{arch}.rope.scaling.type={scaling_type!r}; supported: none (and Llama 3 "
            f"scaling given by {_ROPE_FREQS})"
        )
    if _ROPE_FREQS not in tensors:
        return None
    freqs = np.asarray(dequantize(tensors[_ROPE_FREQS]), dtype=np.float64).reshape(-1)
    if np.allclose(freqs, 1.0):
        return None
    meta_ctx = metadata(reader, f"{arch}.rope.scaling.original_context_length", None)
    return _llama3_scaling(freqs, head_dim, theta, meta_ctx)


def hf_config(reader, arch: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a GGUF file's metadata (validated by
    ``ModelConfig``; written by its ``to_hf_config``)."""

    def g(key: str, *default: Any) -> Any:
        return metadata(reader, f"{arch}.{key}", *default)

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise GGUFError("the GGUF file has no token_embd.weight tensor")
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    kv = g("attention.head_count_kv", heads)
    if isinstance(kv, list):
        if len(set(kv)) != 1:
            raise GGUFError(f"{arch}.attention.head_count_kv varies by layer ({kv}); unsupported")
        kv = kv[0]
    head_dim = int(g("attention.key_length", hidden // heads))
    if int(g("attention.value_length", head_dim)) != head_dim:
        raise GGUFError(f"{arch}.attention.value_length != key_length; unsupported")
    if int(g("rope.dimension_count", head_dim)) != head_dim:
        raise GGUFError(
            f"{arch}.rope.dimension_count={g('rope.dimension_count')} < head_dim={head_dim}: "
            "partial rotary embeddings are unsupported"
        )
    theta = short_float(g("rope.freq_base", 10000.0))
    rope_scaling = _rope_scaling(reader, arch, tensors, head_dim, theta)
    vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [hidden, vocab]

    def tok_id(name: str) -> int | None:
        v = metadata(reader, f"tokenizer.ggml.{name}", None)
        return None if v is None else int(v)

    hf: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": head_dim,
        "max_position_embeddings": int(g("context_length", 4096)),
        "rope_theta": theta,
        "rope_scaling": rope_scaling,
        "rms_norm_eps": short_float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": tok_id("bos_token_id"),
        "eos_token_id": tok_id("eos_token_id"),
        "pad_token_id": tok_id("padding_token_id"),
    }
    try:
        cfg = ModelConfig.from_hf_config(hf)
    except (ModelConfigError, KeyError, TypeError) as e:
        raise GGUFError(f"the GGUF metadata gives an unsupported config: {e}") from e
    out = cfg.to_hf_config()
    out["torch_dtype"] = "float32"
    return out


# ---------------------------------------------------------------------------- tensors
def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of a Llama q/k projection (weight ``[heads*dim, in]`` or
    bias ``[heads*dim]``): its converter reorders each head's rows from the rotate-half layout
    (``[x1..., x2...]``) to interleaved pairs (``[x1_0, x2_0, x1_1, ...]``), the layout of
    llama.cpp's Llama RoPE; this restores the rotate-half order."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return np.ascontiguousarray(
        w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def hf_name(name: str) -> str | None:
    """The Hugging Face name of GGUF tensor ``name``; None when it has none."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{int(m.group(1))}.{_LAYER_NAMES[m.group(2)]}"
    return None


def write_weights(
    reader, arch: str, hf: dict[str, Any], folder: Path, label: str, *, shard_bytes: int
) -> None:
    """Write every tensor as float32 under its Hugging Face name into ``folder``:
    ``model.safetensors``, or shards of at most ``shard_bytes`` with an index."""
    meta = {"format": "pt"}  # transformers refuses safetensors without a known format
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    for t in reader.tensors:
        if t.name != _ROPE_FREQS and hf_name(t.name) is None:
            raise GGUFError(
                f"{label}: tensor {t.name!r} has no Hugging Face counterpart in a {arch} model"
            )
    shards: list[str] = []
    pending: dict[str, np.ndarray] = {}
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            name = f"shard-{len(shards):05d}.tmp"
            save_file(pending, str(folder / name), metadata=meta)
            shards.append(name)
            pending, size = {}, 0

    weight_map: dict[str, int] = {}
    for t in tqdm(reader.tensors, desc=f"converting {label}", unit="tensor", leave=False):
        if t.name == _ROPE_FREQS:
            continue
        name = hf_name(t.name)
        w = dequantize(t)
        if arch == "llama" and re.search(r"\.attn_[qk]\.(weight|bias)$", t.name):
            w = unpermute_qk(w, heads if ".attn_q." in t.name else kv)
        if pending and size + w.nbytes > shard_bytes:
            flush()
        pending[name] = w
        size += w.nbytes
        weight_map[name] = len(shards)
    flush()
    if len(shards) == 1:
        os.replace(folder / shards[0], folder / "model.safetensors")
        return
    final = [f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors" for j in range(len(shards))]
    for tmp, name in zip(shards, final, strict=True):
        os.replace(folder / tmp, folder / name)
    total = sum(4 * int(np.prod(t.shape)) for t in reader.tensors if t.name != _ROPE_FREQS)
    index = {
        "metadata": {"total_size": total},
        "weight_map": {n: final[j] for n, j in sorted(weight_map.items())},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
