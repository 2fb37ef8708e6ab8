"""How the decoder's parameters correspond to Hugging Face checkpoint tensors.

Our layout keeps each projection's heads as their own axes and stacks the per-layer weights on a
leading ``layers`` axis; Hugging Face stores torch ``Linear`` weights as ``[out, in]`` matrices,
one tensor per layer. The mapping is transposes and reshapes only, so round trips are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from flax import nnx

from jaxrl_agents.models.safetensors_io import CheckpointError, SafetensorsReader


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


def param_items(state: nnx.State) -> Iterator[tuple[str, nnx.Variable]]:
    """``('layers.q', variable)`` for every variable of ``state``."""
    for path, var in nnx.to_flat_state(state):
        yield ".".join(map(str, path)), var


def read_param(reader: SafetensorsReader, key: str, shape: tuple[int, ...], dtype, n_layers: int):
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


def to_hf(key: str, host: np.ndarray, n_layers: int) -> Iterator[tuple[str, np.ndarray]]:
    """``(hf_name, array)`` in HF layout of our host array ``host`` of parameter ``key`` (one
    per layer for the stacked per-layer weights)."""
    m = _MAP[key]
    if key.startswith("layers."):
        for i in range(n_layers):
            yield m.hf_name.format(i=i), _to_hf(host[i], m.n_in)
    else:
        yield m.hf_name, _to_hf(host, m.n_in)
