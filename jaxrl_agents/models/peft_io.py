"""LoRA adapters out to (and back from) a PEFT adapter folder.

``export_peft(model, folder, base=...)`` writes ``adapter_config.json`` and
``adapter_model.safetensors`` in the layout ``peft.PeftModel.from_pretrained`` loads onto the
transformers base model: ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``
``[r, in]`` and ``...lora_B.weight`` ``[out, r]``, with ``lora_alpha`` / ``r`` giving the same
scale. Our adapters keep the base weight's layout on their outer side (``models.lora``), so the
conversion is a reshape and a transpose: exact in float32. ``load_peft`` reads such a folder back
into a policy's adapters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_agents.models.config import LoRAConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_PREFIX = "base_model.model.model.layers.{i}."


def _host(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def peft_tensors(model: Any, *, dtype: str | None = None) -> dict[str, np.ndarray]:
    """``{peft name: array}`` of the policy's adapters (``dtype`` default: the params')."""
    cfg = model.cfg
    if cfg.lora is None:
        raise ValueError("the policy has no LoRA adapters (model.lora is unset)")
    out_dtype = np.dtype(jax.numpy.dtype(dtype or cfg.param_dtype))
    r = cfg.lora.rank
    out = {}
    first = cfg.lora.first_layer(cfg.num_hidden_layers)
    for name in cfg.lora.targets:
        a = _host(getattr(model.lora, f"{name}_a")[...]).astype(np.float32)
        b = _host(getattr(model.lora, f"{name}_b")[...]).astype(np.float32)
        for j in range(a.shape[0]):  # the adapted layers, first ... L - 1
            key = _PREFIX.format(i=first + j) + _MODULES[name]
            lora_a = np.ascontiguousarray(a[j].reshape(-1, r).T)  # [r, in]
            lora_b = np.ascontiguousarray(b[j].reshape(r, -1).T)  # [out, r]
            out[f"{key}.lora_A.weight"] = lora_a.astype(out_dtype)
            out[f"{key}.lora_B.weight"] = lora_b.astype(out_dtype)
    return out


def adapter_config(lora: LoRAConfig, *, base: str | None, num_layers: int) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for ``lora`` on the base model folder ``base`` (a decoder
    of ``num_layers`` layers)."""
    layers = None
    if lora.top_layers is not None:
        layers = list(range(lora.first_layer(num_layers), num_layers))
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": [_MODULES[t].split(".")[1] for t in lora.targets],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": layers,
    }


def export_peft(
    model: Any, folder: str | Path, *, base: str | None, dtype: str | None = None
) -> Path:
    """Write the policy's adapters as a PEFT adapter folder (process 0 writes); returns it.

    ``base``: the base model folder recorded as ``base_model_name_or_path`` (the folder the
    adapters were trained on: for a GGUF file, its converted folder)."""
    from safetensors.numpy import save_file

    tensors = peft_tensors(model, dtype=dtype)  # a collective with several processes
    out = Path(folder)
    if jax.process_index() != 0:
        return out
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    cfg = adapter_config(model.cfg.lora, base=base, num_layers=model.cfg.num_hidden_layers)
    (out / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def read_peft_config(folder: str | Path, *, num_layers: int | None = None) -> LoRAConfig:
    """The ``LoRAConfig`` of a PEFT adapter folder (LoRA without rsLoRA/DoRA/biases only).
    ``layers_to_transform``, when set, must be the top layers of the ``num_layers``-layer base
    (``LoRAConfig.top_layers``); without ``num_layers``, its largest index + 1 is taken."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable PEFT adapter config ({e})") from e
    if cfg.get("peft_type") != "LORA" or cfg.get("use_rslora") or cfg.get("use_dora"):
        raise ValueError(
            f"{path}: only plain LoRA adapters are supported (peft_type=LORA, no rsLoRA, no DoRA)"
        )
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):
        raise ValueError(f"{path}: target_modules as a regex ({targets!r}) is not supported")
    layers, top = cfg.get("layers_to_transform"), None
    if layers is not None:
        layers = sorted({layers} if isinstance(layers, int) else set(layers))
        n = num_layers if num_layers is not None else layers[-1] + 1
        if not layers or layers != list(range(n - len(layers), n)):
            raise ValueError(
                f"{path}: layers_to_transform={cfg['layers_to_transform']!r}; supported: null "
                f"or the top layers of the {n}-layer base, e.g. {list(range(n - 2, n))}"
            )
        top = len(layers)
    return LoRAConfig(
        rank=int(cfg["r"]),
        alpha=float(cfg["lora_alpha"]),
        targets=tuple(targets),
        dropout=0.0,
        top_layers=top,
    )


def load_peft(model: Any, folder: str | Path) -> Any:
    """Set the policy's adapters (``model.cfg.lora`` must match the folder's) from a PEFT
    adapter folder, in place; returns the model."""
    from safetensors.numpy import load_file

    L = model.cfg.num_hidden_layers
    want = read_peft_config(folder, num_layers=L)
    lora = model.cfg.lora
    shape = (want.rank, want.targets, want.first_layer(L))
    if lora is None or (lora.rank, lora.targets, lora.first_layer(L)) != shape:
        raise ValueError(
            f"{folder}: adapters of rank {want.rank} on {list(want.targets)} "
            f"(top_layers={want.top_layers}) do not match the policy's ({lora})"
        )
    tensors = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    scale = want.alpha / lora.alpha
    first = lora.first_layer(L)
    for name in lora.targets:
        a_var, b_var = getattr(model.lora, f"{name}_a"), getattr(model.lora, f"{name}_b")
        a = np.zeros(a_var.get_value().shape, np.float32)
        b = np.zeros(b_var.get_value().shape, np.float32)
        for j in range(a.shape[0]):
            key = _PREFIX.format(i=first + j) + _MODULES[name]
            a[j] = tensors[f"{key}.lora_A.weight"].T.reshape(a.shape[1:])
            b[j] = (tensors[f"{key}.lora_B.weight"].T * scale).reshape(b.shape[1:])
        dtype = a_var.get_value().dtype
        a_var.set_value(jax.device_put(a.astype(dtype), a_var.get_value().sharding))
        b_var.set_value(jax.device_put(b.astype(dtype), b_var.get_value().sharding))
    return model
