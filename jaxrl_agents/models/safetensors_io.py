"""Safetensors checkpoints on disk: ``model.safetensors`` or shards listed in
``model.safetensors.index.json``, read tensor by tensor (memory-mapped) and written in shards of a
size limit."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}


class CheckpointError(ValueError):
    """A checkpoint folder we cannot read: missing/corrupt files, missing or mis-shaped tensors."""


class SafetensorsReader:
    """Name -> tensor over a single or sharded safetensors checkpoint (files opened lazily)."""

    def __init__(self, folder: Path):
        self._handles: dict[Path, Any] = {}
        if (folder / INDEX_FILE).exists():
            try:
                weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{folder / INDEX_FILE} is not a valid index: {e}") from e
            self.files = {name: folder / f for name, f in weight_map.items()}
        elif (folder / SINGLE_FILE).exists():
            self.files = {
                n: folder / SINGLE_FILE for n in self._handle(folder / SINGLE_FILE).keys()
            }
        else:
            raise CheckpointError(f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")

    def _handle(self, file: Path):
        if file not in self._handles:
            if not file.exists():
                raise CheckpointError(f"checkpoint file {file} (listed in the index) is missing")
            try:
                self._handles[file] = safe_open(str(file), framework="numpy")
            except Exception as e:  # safetensors raises its own error types for bad headers
                raise CheckpointError(f"corrupt safetensors file {file}: {e}") from e
        return self._handles[file]

    def get(self, name: str, expected: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name``, checked to have shape ``expected`` (:class:`CheckpointError`)."""
        if name not in self.files:
            raise CheckpointError(
                f"tensor {name!r} (expected shape {expected}) is missing from the checkpoint"
            )
        handle = self._handle(self.files[name])
        try:
            got = tuple(handle.get_slice(name).get_shape())
            if got != expected:
                raise CheckpointError(
                    f"tensor {name!r} has shape {got} but the config implies {expected}"
                )
            return handle.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"corrupt safetensors file {self.files[name]} (reading {name!r}): {e}"
            ) from e


def stored_dtype(folder: Path) -> str | None:
    """The most common tensor dtype of the first ``*.safetensors`` file of ``folder`` (read from
    its header), as ``bfloat16`` / ``float32`` / ``float16``; ``None`` when there is none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:  # the header: 8-byte little-endian length, then JSON {name: {"dtype": ...}, ...}
        with open(files[0], "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError):
        return None
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name != "__metadata__" and isinstance(info, dict):
            counts[info.get("dtype")] = counts.get(info.get("dtype"), 0) + 1
    found = max(counts, key=counts.get) if counts else None
    return _SAFETENSORS_DTYPES.get(found)


def split_shards(
    tensors: Iterable[tuple[str, np.ndarray]], limit: int
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """``(name, array)`` pairs grouped in order into shards of at most ``limit`` bytes (a larger
    tensor gets a shard of its own), and each shard's size."""
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, arr in tensors:
        if shards[-1] and sizes[-1] + arr.nbytes > limit:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = arr
        sizes[-1] += arr.nbytes
    return shards, sizes


def write_shards(shards: list[dict[str, np.ndarray]], sizes: list[int], folder: Path) -> None:
    """Write :data:`SINGLE_FILE` (one shard) or numbered shards with :data:`INDEX_FILE`, removing
    the other layout's file of an earlier write."""
    meta = {"format": "pt"}  # transformers refuses safetensors without a known format
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata=meta)
        (folder / INDEX_FILE).unlink(missing_ok=True)
        return
    weight_map = {}
    for j, shard in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata=meta)
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    (folder / SINGLE_FILE).unlink(missing_ok=True)
