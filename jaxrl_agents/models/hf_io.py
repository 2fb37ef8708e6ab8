"""Load a local Hugging Face checkpoint into the NNX decoder, and export it back bit-exactly.

Loading: ``config.json`` -> ModelConfig; the model is built abstractly (``nnx.eval_shape``, no
device memory) and each parameter is read from ``model.safetensors`` or the shards named in
``model.safetensors.index.json`` through ``safe_open`` (memory-mapped), converted to our layout on
the host, and placed with ``jax.make_array_from_callback`` so every device receives only its own
shard. The host holds one parameter at a time -- for the stacked per-layer weights that is one
``[L, ...]`` buffer filled layer by layer.

Export (:func:`export_pretrained`, ``models/hf_export.py``) is the inverse mapping, bit-exact:
fp32 round trips are exact (transposes and reshapes only), and so is a bf16 checkpoint loaded in
fp32 and exported in bf16.

Multi-host: loading works per process (each reads what its devices need); export gathers each
parameter with ``process_allgather`` and only process 0 writes.

Where the parts live: this module loads; ``models/hf_export.py`` exports,
``models/hf_layout.py`` maps our parameters to Hugging Face tensors, ``models/safetensors_io.py``
reads and writes the safetensors files. Their public names are importable from here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_agents.models import gguf
from jaxrl_agents.models.config import ModelConfig
from jaxrl_agents.models.decoder import Transformer
from jaxrl_agents.models.hf_export import (
    EXPORT_DTYPES,
    GENERATION_FILE,
    TOKENIZER_FILES,
    export_pretrained,
    hf_tensors,
    parse_size,
    source_dtype,
)
from jaxrl_agents.models.hf_layout import param_items, read_param
from jaxrl_agents.models.safetensors_io import (
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointError,
    SafetensorsReader,
)
from jaxrl_agents.sharding import logical_sharding

__all__ = [
    "EXPORT_DTYPES",
    "GENERATION_FILE",
    "INDEX_FILE",
    "SINGLE_FILE",
    "TOKENIZER_FILES",
    "CheckpointError",
    "export_pretrained",
    "hf_tensors",
    "load_pretrained",
    "parse_size",
    "source_dtype",
]


def _local_folder(path: str | Path) -> Path:
    """``path``, or the converted folder of a GGUF model (``CheckpointError`` when it fails)."""
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
    scan_unroll: int = 1,
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
        hf_cfg,
        dtype=dtype,
        param_dtype=param_dtype,
        remat=remat,
        attention=attention,
        scan_unroll=scan_unroll,
    )
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    reader = SafetensorsReader(folder)
    pdtype = jnp.dtype(cfg.param_dtype)
    for key, var in param_items(state):
        shape = tuple(var.get_value().shape)
        host = read_param(reader, key, shape, pdtype, cfg.num_hidden_layers)
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
        # Imported on use: importing AutoTokenizer costs ~3.6 s, paid only when a tokenizer is
        # loaded, not by every import of jaxrl_agents.models.
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
    return model, tok
