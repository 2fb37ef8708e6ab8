"""Reading a GGUF file through the ``gguf`` package: the magic bytes, the reader, metadata values,
the supported architectures and tensor types, and dequantisation to float32 numpy arrays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
"""``general.architecture`` values that convert."""
SUPPORTED_TENSOR_TYPES: tuple[str, ...] = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)
"""GGML tensor types that are dequantized (to float32)."""
_MISSING = object()


class GGUFError(ValueError):
    """A GGUF file (or named GGUF model) that cannot be found, read or converted."""


def _gguf():
    # Imported on use: gguf is an optional extra (pip install "jaxrl_agents[gguf]"); without it
    # everything but .gguf files works, and reading one fails with this one-line message.
    try:
        import gguf
    except ImportError as e:
        raise GGUFError("reading .gguf files needs the gguf package: pip install gguf") from e
    return gguf


def check_magic(path: Path) -> Path:
    """``path``, after checking it starts with the GGUF magic bytes (:class:`GGUFError` if not)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read it: {e}") from e
    if magic != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return path


def open_reader(path: Path):
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped); :class:`GGUFError` for a bad file."""
    gguf = _gguf()
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as e:  # the reader raises bare ValueError/IndexError/... on bad files
        raise GGUFError(
            f"{path} is not a readable GGUF file (corrupt or truncated?): {type(e).__name__}: {e}"
        ) from e


def metadata(reader, key: str, default: Any = _MISSING) -> Any:
    """Metadata value ``key``; ``default`` when it is missing (:class:`GGUFError` without one)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise GGUFError(f"GGUF metadata {key!r} is missing")
        return default
    return field.contents()


def short_float(x: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def check_supported(reader, path: Path) -> str:
    """The file's architecture, after checking it and every tensor type is supported."""
    arch = metadata(reader, "general.architecture")
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


def dequantize(t) -> np.ndarray:
    """Tensor ``t`` as float32 in numpy (= Hugging Face ``[out, in]``) order."""
    gguf = _gguf()
    arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml lists the fastest dim first
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)
