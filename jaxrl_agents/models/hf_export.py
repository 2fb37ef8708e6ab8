"""Export the NNX decoder as a Hugging Face folder, bit-exactly.

The inverse of loading (``models/hf_io.py``); safetensors files are split at ``max_shard_size``
with an index, and the folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``. fp32 round
trips are exact (transposes and reshapes only), and so is a bf16 checkpoint loaded in fp32 and
exported in bf16. Given the ``source`` folder the weights came from, the export is written in the
source's dtype and its ``generation_config.json`` starts from the source's; given a
``tokenizer_source`` folder, its tokenizer files are copied byte for byte.

Multi-host: each parameter is gathered with ``process_allgather`` and only process 0 writes.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from jaxrl_agents.models.decoder import Transformer
from jaxrl_agents.models.hf_layout import param_items, to_hf
from jaxrl_agents.models.lora import merge_lora
from jaxrl_agents.models.safetensors_io import split_shards, stored_dtype, write_shards

GENERATION_FILE = "generation_config.json"
EXPORT_DTYPES: tuple[str, ...] = ("bfloat16", "float32", "float16")
"""The dtypes an export can be written in."""
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)
"""The files a tokenizer folder may hold (plus the tokenizer class's ``vocab_files_names`` and an
``additional_chat_templates/`` folder): copied verbatim by :func:`export_pretrained`."""
_SAMPLING_ONLY = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "top_h",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
)


# ---------------------------------------------------------------------------- tensors
def parse_size(size: int | str) -> int:
    """``'2GB'`` -> 2e9 bytes (HF convention: GB = 10**9, GiB = 2**30); ints pass through."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)?\s*", size.upper())
    if not m:
        raise ValueError(f"max_shard_size={size!r}; expected bytes or e.g. '500MB', '2GB', '1GiB'")
    unit = m.group(2) or "B"
    powers = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    powers.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
    return int(float(m.group(1)) * powers[unit])


def _to_host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def hf_tensors(model: Transformer, *, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, array)`` in HF layout, one parameter gathered to host at a time (LoRA
    adapters folded into the weights they wrap)."""
    model = merge_lora(model)
    cfg = model.cfg
    out_dtype = jnp.dtype(dtype or cfg.param_dtype)
    for key, var in param_items(nnx.state(model, nnx.Param)):
        host = _to_host(var[...]).astype(out_dtype)
        yield from to_hf(key, host, cfg.num_hidden_layers)


def source_dtype(path: str | Path) -> str | None:
    """The dtype a local HF checkpoint is stored in: ``config.json``'s ``torch_dtype`` (``dtype``
    in transformers 5), else its safetensors tensors' (the most common one); ``None`` when neither
    names one of :data:`EXPORT_DTYPES`."""
    folder = Path(path)
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        hf = {}
    for key in ("torch_dtype", "dtype"):
        name = hf.get(key)
        if isinstance(name, str) and name.removeprefix("torch.") in EXPORT_DTYPES:
            return name.removeprefix("torch.")
    return stored_dtype(folder)


# ---------------------------------------------------------------------------- folder
def _ids(x: Any) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in x] if isinstance(x, (list, tuple)) else [int(x)]


def _generation_config(
    hf: dict[str, Any],
    tokenizer: Any,
    source: Path | None,
    stop_token_ids: Sequence[int],
    generation: dict[str, Any] | None,
) -> dict[str, Any]:
    """``generation_config.json``: the source's (missing bos/eos/pad from ``hf``, else the
    tokenizer's eos), ``stop_token_ids`` added to ``eos_token_id``, then ``generation`` on top."""
    gen: dict[str, Any] = {}
    if source is not None and (source / GENERATION_FILE).is_file():
        gen = json.loads((source / GENERATION_FILE).read_text())
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if gen.get(k) is None and hf.get(k) is not None:
            gen[k] = hf[k]
    eos = _ids(gen.get("eos_token_id"))
    if not eos:
        eos = _ids(getattr(tokenizer, "eos_token_id", None))
    eos += [int(i) for i in dict.fromkeys(stop_token_ids) if int(i) not in eos]
    if eos:
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    gen.update(generation or {})
    if gen.get("do_sample") is False:  # transformers refuses sampling flags on greedy configs
        for k in _SAMPLING_ONLY:
            gen.pop(k, None)
    return gen


def _write_tokenizer(tokenizer: Any, tokenizer_source: Path | None, folder: Path) -> None:
    """Copy ``tokenizer_source``'s tokenizer files verbatim (else ``tokenizer.save_pretrained``);
    tokenizer files of an earlier export that the new one lacks are removed."""
    names = set(TOKENIZER_FILES) | set(getattr(tokenizer, "vocab_files_names", {}).values())
    templates = "additional_chat_templates"
    copy = tokenizer_source is not None and any(
        (tokenizer_source / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")
    )
    if not copy and tokenizer is None:
        return
    for name in sorted(names):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / templates, ignore_errors=True)
    if not copy:
        tokenizer.save_pretrained(str(folder))
        return
    for name in sorted(names):
        if (tokenizer_source / name).is_file():
            shutil.copyfile(tokenizer_source / name, folder / name)
    if (tokenizer_source / templates).is_dir():
        shutil.copytree(tokenizer_source / templates, folder / templates)


def export_pretrained(
    model: Transformer,
    path: str | Path,
    *,
    tokenizer: Any = None,
    max_shard_size: int | str = "2GB",
    dtype: str | None = None,
    generation: dict[str, Any] | None = None,
    source: str | Path | None = None,
    tokenizer_source: str | Path | None = None,
    stop_token_ids: Sequence[int] = (),
) -> Path:
    """Write an HF folder: config.json, generation_config.json, safetensors (+ index), tokenizer.

    ``dtype``: the dtype of the written tensors (one of :data:`EXPORT_DTYPES`; config.json's
    ``torch_dtype`` says it). Default: the ``source`` checkpoint's (:func:`source_dtype`), else
    the model's ``param_dtype``.

    ``source``: the HF folder the weights were loaded from. Its ``generation_config.json``, when
    there is one, is the base of the exported one (its eos list, bos/pad, sampling defaults).
    Without it: bos/eos/pad of config.json (eos: else the tokenizer's).

    ``stop_token_ids``: more ids that end generation (e.g. every stop id of the policy's chat
    format), added to ``eos_token_id`` -- a list when there are several ids, one int for one.

    ``generation``: entries applied on top (e.g. the sampling settings the policy was trained
    with: ``do_sample``, ``temperature``, ``top_p``, ``top_k``); with ``do_sample=False`` the
    sampling-only entries are dropped (transformers rejects them on a greedy config).

    ``tokenizer_source``: a folder whose tokenizer files (:data:`TOKENIZER_FILES`, e.g.
    ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) are copied byte for
    byte instead of ``tokenizer.save_pretrained`` (which rewrites them, e.g. moving the chat
    template to ``chat_template.jinja`` in transformers 5)."""
    folder = Path(path)
    source = Path(source) if source is not None else None
    tokenizer_source = Path(tokenizer_source) if tokenizer_source is not None else None
    for src in (source, tokenizer_source):
        if src is not None and folder.resolve() == src.resolve():
            raise ValueError(f"cannot export into {src}, the folder being exported from")
    if dtype is None and source is not None:
        dtype = source_dtype(source)
    out_dtype = dtype or model.cfg.param_dtype
    if not isinstance(out_dtype, str):  # jnp.bfloat16 / np.dtype too
        out_dtype = jnp.dtype(out_dtype).name
    if out_dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype={out_dtype!r}: expected one of {', '.join(EXPORT_DTYPES)}")
    limit = parse_size(max_shard_size)
    write = jax.process_index() == 0
    shards, sizes = split_shards(hf_tensors(model, dtype=out_dtype), limit)
    if not write:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    write_shards(shards, sizes, folder)
    hf = model.cfg.to_hf_config()
    hf["torch_dtype"] = out_dtype  # float16 is no ModelConfig.param_dtype, so set it here
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    gen = _generation_config(hf, tokenizer, source, stop_token_ids, generation)
    (folder / GENERATION_FILE).write_text(json.dumps(gen, indent=2, sort_keys=True))
    _write_tokenizer(tokenizer, tokenizer_source, folder)
    return folder
