"""Load a local Hugging Face checkpoint into the NNX decoder, and export it back bit-exactly.

Loading: ``config.json`` -> ModelConfig; the model is built abstractly (``nnx.eval_shape``, no
device memory) and each parameter is read from ``model.safetensors`` or the shards named in
``model.safetensors.index.json`` through ``safe_open`` (memory-mapped), converted to our layout on
the host, and placed with ``jax.make_array_from_callback`` so every device receives only its own
shard. The host holds one parameter at a time -- for the stacked per-layer weights that is one
``[L, ...]`` buffer filled layer by layer.

Export is the inverse mapping; safetensors files are split at ``max_shard_size`` with an index,
and the folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer``. fp32 round trips are exact
(transposes and reshapes only), and so is a bf16 checkpoint loaded in fp32 and exported in bf16.
Given the ``source`` folder the weights came from, the export is written in the source's dtype and
its ``generation_config.json`` starts from the source's; given a ``tokenizer_source`` folder, its
tokenizer files are copied byte for byte.

Multi-host: loading works per process (each reads what its devices need); export gathers each
parameter with ``process_allgather`` and only process 0 writes.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.decoder import Transformer
from jaxrl_agents.models.lora import merge_lora
from jaxrl_agents.sharding import logical_sharding

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_FILE = "generation_config.json"
EXPORT_DTYPES: tuple[str, ...] = ("bfloat16", "float32", "float16")
"""The dtypes an export can be written in."""
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "vocab.txt",
    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "tiktoken.model",
)  # fmt: skip
"""The files a tokenizer folder may hold (plus the tokenizer class's ``vocab_files_names`` and an
``additional_chat_templates/`` folder): copied verbatim by :func:`export_pretrained`."""
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}
_SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p",
                  "epsilon_cutoff", "eta_cutoff")  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint folder we cannot read: missing/corrupt files, missing or mis-shaped tensors."""


@dataclass(frozen=True)
class _TensorMap:
    """How one of our parameters corresponds to HF tensor(s).

    ``n_in``: leading dims of our (per-layer) array that form a torch Linear's input dimension
    (HF stores ``[out, in]``); ``None`` for vectors (norms, biases: flattened in HF); ``0`` when
    the layouts agree (the embedding table).
    """

    hf_name: str  # may contain {i} for the layer index
    n_in: int | None


_LAYER = "model.layers.{i}."
_MAP: dict[str, _TensorMap] = {
    "embed": _TensorMap("model.embed_tokens.weight", 0),
    "final_norm": _TensorMap("model.norm.weight", None),
    "lm_head": _TensorMap("lm_head.weight", 1),
    "layers.attn_norm": _TensorMap(_LAYER + "input_layernorm.weight", None),
    "layers.q": _TensorMap(_LAYER + "self_attn.q_proj.weight", 1),
    "layers.k": _TensorMap(_LAYER + "self_attn.k_proj.weight", 1),
    "layers.v": _TensorMap(_LAYER + "self_attn.v_proj.weight", 1),
    "layers.o": _TensorMap(_LAYER + "self_attn.o_proj.weight", 2),
    "layers.q_bias": _TensorMap(_LAYER + "self_attn.q_proj.bias", None),
    "layers.k_bias": _TensorMap(_LAYER + "self_attn.k_proj.bias", None),
    "layers.v_bias": _TensorMap(_LAYER + "self_attn.v_proj.bias", None),
    "layers.o_bias": _TensorMap(_LAYER + "self_attn.o_proj.bias", None),
    "layers.q_norm": _TensorMap(_LAYER + "self_attn.q_norm.weight", None),
    "layers.k_norm": _TensorMap(_LAYER + "self_attn.k_norm.weight", None),
    "layers.mlp_norm": _TensorMap(_LAYER + "post_attention_layernorm.weight", None),
    "layers.gate": _TensorMap(_LAYER + "mlp.gate_proj.weight", 1),
    "layers.up": _TensorMap(_LAYER + "mlp.up_proj.weight", 1),
    "layers.down": _TensorMap(_LAYER + "mlp.down_proj.weight", 1),
}


def _hf_shape(ours: tuple[int, ...], n_in: int | None) -> tuple[int, ...]:
    if n_in is None:
        return (math.prod(ours),)
    if n_in == 0:
        return ours
    return (math.prod(ours[n_in:]), math.prod(ours[:n_in]))


def _to_ours(w: np.ndarray, shape: tuple[int, ...], n_in: int | None) -> np.ndarray:
    return w.reshape(shape) if not n_in else w.T.reshape(shape)


def _to_hf(a: np.ndarray, n_in: int | None) -> np.ndarray:
    if n_in is None:
        return a.reshape(-1)
    if n_in == 0:
        return a
    return np.ascontiguousarray(a.reshape(math.prod(a.shape[:n_in]), -1).T)


def _param_items(state: nnx.State) -> Iterator[tuple[str, nnx.Variable]]:
    for path, var in nnx.to_flat_state(state):
        yield ".".join(map(str, path)), var


# ---------------------------------------------------------------------------- reading
class _Reader:
    """Name -> tensor over a single or sharded safetensors checkpoint (files opened lazily)."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self._open = safe_open
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
                self._handles[file] = self._open(str(file), framework="numpy")
            except Exception as e:  # safetensors raises its own error types for bad headers
                raise CheckpointError(f"corrupt safetensors file {file}: {e}") from e
        return self._handles[file]

    def get(self, name: str, expected: tuple[int, ...]) -> np.ndarray:
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


def _read_param(reader: _Reader, key: str, shape: tuple[int, ...], dtype, n_layers: int):
    """Our full host array for parameter ``key`` (per-layer tensors stacked on axis 0)."""
    if key not in _MAP:
        raise CheckpointError(f"no Hugging Face mapping for parameter {key!r}")
    m = _MAP[key]
    if not key.startswith("layers."):
        return _to_ours(reader.get(m.hf_name, _hf_shape(shape, m.n_in)), shape, m.n_in).astype(
            dtype
        )
    out = np.empty(shape, dtype)
    for i in range(n_layers):
        w = reader.get(m.hf_name.format(i=i), _hf_shape(shape[1:], m.n_in))
        out[i] = _to_ours(w, shape[1:], m.n_in)
    return out


def _local_folder(path: str | Path) -> Path:
    """``path``, or the converted folder of a GGUF model (``CheckpointError`` when it fails)."""
    from jaxrl_agents.models import gguf

    if not gguf.is_gguf(path):
        return Path(path)
    try:
        return gguf.local_folder(path)
    except gguf.GGUFError as e:
        raise CheckpointError(str(e)) from e


def load_pretrained(
    path: str | Path,
    *,
    mesh: Mesh | None = None,
    dtype: str = "float32",
    param_dtype: str = "float32",
    tokenizer: bool = True,
    remat: bool = False,
    attention: str = "auto",
) -> tuple[Transformer, Any]:
    """Load a local HF folder -> (Transformer placed on ``mesh`` or the default device, tokenizer).

    The tokenizer (``AutoTokenizer``) is returned when ``tokenizer`` is true and the folder has
    tokenizer files, else ``None``. ``path`` may also be a ``.gguf`` file or a named GGUF model
    (``smollm2``): it is read through its cached converted folder (``models.gguf``).
    """
    folder = _local_folder(path)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a Hugging Face model folder (no config.json)")
    hf_cfg = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_hf_config(
        hf_cfg, dtype=dtype, param_dtype=param_dtype, remat=remat, attention=attention
    )
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    reader = _Reader(folder)
    pdtype = jnp.dtype(cfg.param_dtype)
    for key, var in _param_items(state):
        shape = tuple(var.get_value().shape)
        host = _read_param(reader, key, shape, pdtype, cfg.num_hidden_layers)
        if mesh is None:
            arr = jax.device_put(host)
        else:
            names = var.get_metadata().get("out_sharding")
            sharding = (
                logical_sharding(names, mesh, shape=shape)
                if names
                else NamedSharding(mesh, PartitionSpec())
            )
            arr = jax.make_array_from_callback(shape, sharding, lambda idx, h=host: h[idx])
        var.set_value(arr)
        del host
    model = nnx.merge(graphdef, state)
    tok = None
    if tokenizer and any(
        (folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
    return model, tok


# ---------------------------------------------------------------------------- writing
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
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def hf_tensors(model: Transformer, *, dtype: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, array)`` in HF layout, one parameter gathered to host at a time (LoRA
    adapters folded into the weights they wrap)."""
    model = merge_lora(model)
    cfg = model.cfg
    out_dtype = jnp.dtype(dtype or cfg.param_dtype)
    for key, var in _param_items(nnx.state(model, nnx.Param)):
        m = _MAP[key]
        host = _to_host(var[...]).astype(out_dtype)
        if key.startswith("layers."):
            for i in range(cfg.num_hidden_layers):
                yield m.hf_name.format(i=i), _to_hf(host[i], m.n_in)
        else:
            yield m.hf_name, _to_hf(host, m.n_in)


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
    from safetensors.numpy import save_file

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
    shards: list[dict[str, np.ndarray]] = [{}]
    sizes = [0]
    for name, arr in hf_tensors(model, dtype=out_dtype):
        if shards[-1] and sizes[-1] + arr.nbytes > limit:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = arr
        sizes[-1] += arr.nbytes
    if not write:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt"}  # transformers refuses safetensors without a known format
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata=meta)
        (folder / INDEX_FILE).unlink(missing_ok=True)
    else:
        weight_map = {}
        for j, shard in enumerate(shards):
            fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / fname), metadata=meta)
            weight_map.update(dict.fromkeys(shard, fname))
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
        (folder / SINGLE_FILE).unlink(missing_ok=True)
    hf = model.cfg.to_hf_config()
    hf["torch_dtype"] = out_dtype  # float16 is no ModelConfig.param_dtype, so set it here
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True))
    gen = _generation_config(hf, tokenizer, source, stop_token_ids, generation)
    (folder / GENERATION_FILE).write_text(json.dumps(gen, indent=2, sort_keys=True))
    _write_tokenizer(tokenizer, tokenizer_source, folder)
    return folder
