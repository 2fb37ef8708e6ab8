"""Low-rank adapters (LoRA) on the decoder's projections, as NNX variables of the policy.

Each wrapped projection ``W`` (``q k v o gate up down``, ``ModelConfig.lora.targets``) gains
``A`` (input side, rank ``r``) and ``B`` (output side), stacked on the leading ``layers`` axis
like the base weights, and computes ``x @ W + s * (x @ A) @ B`` with ``s = alpha / r``. ``A``
starts like PEFT's (Kaiming-uniform, bound ``1 / sqrt(fan_in)``) and ``B`` at zero, so a fresh
adapter is the base policy exactly.

* **Frozen base, no copies.** The adapters are ``nnx.LoRAParam`` variables (a ``Param``
  subclass): the jobs split the policy on them (``jobs.build.split_params``), so gradients,
  optimizer state and checkpoints hold the adapters only, and the base weights ride along as
  non-trained state. The KL reference is the run's starting adapters over the same base.
* **Training forward: unmerged.** ``(x @ A) @ B`` costs ``2 r (D_in + D_out)`` flops a token
  against ``2 D_in D_out`` for ``W``, and the backward pass computes no ``dW`` (the dominant cost
  of full fine-tuning's backward pass, together with the tied embedding's gradient).
* **Sampler: merged on push.** ``decode_weights`` already re-lays the weights out into the
  sampler's own copy at every push; adding ``s * A @ B`` there costs one small matmul per
  projection and nothing per token. ``EngineConfig.merge_lora=false`` keeps the adapters
  unmerged in the decode step instead (measured slower: ``scripts/bench_lora.py``).

Why an NNX-native module and not ``qwix`` (Tunix's route: it intercepts the ``nnx.Linear`` /
``einsum`` calls of an existing model and adds adapters to them by a regex over module paths):
this decoder keeps every layer's weights stacked for one ``lax.scan`` and re-lays them out for the
sampler (``decode_weights``), and neither is a per-layer ``nnx.Linear`` that qwix could wrap; the
adapters must ride the same scan and be folded into the sampler's copy, which are a few lines
here. Explicit ``LoRAParam`` variables also give the jobs a filter for what is trained
(``nnx.LoRAParam``), the PEFT name mapping by construction, and no extra dependency.

Our layouts (leading ``L`` omitted; D model width, H/K query/kv heads, Dh head width, F MLP):
``q``: A ``[D, r]``, B ``[r, H, Dh]``; ``k``/``v``: A ``[D, r]``, B ``[r, K, Dh]``; ``o``: A
``[H, Dh, r]``, B ``[r, D]``; ``gate``/``up``: A ``[D, r]``, B ``[r, F]``; ``down``: A ``[F, r]``,
B ``[r, D]``. PEFT stores ``lora_A.weight [r, in]`` and ``lora_B.weight [out, r]``
(``models.peft_io`` converts).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from jaxrl_agents.models.config import ModelConfig


def lora_layout(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], int]]:
    """``'q_a' -> (shape, logical axes, fan_in)`` of every adapter tensor (leading ``layers``)."""
    if cfg.lora is None:
        return {}
    L = cfg.num_hidden_layers - cfg.lora.first_layer(cfg.num_hidden_layers)  # adapted layers
    D, F, r = cfg.hidden_size, cfg.intermediate_size, cfg.lora.rank
    H, K, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    full = {
        "q": (((D, r), ("embed", "lora")), ((r, H, Dh), ("lora", "q_heads", "head_dim")), D),
        "k": (((D, r), ("embed", "lora")), ((r, K, Dh), ("lora", "kv_heads", "head_dim")), D),
        "v": (((D, r), ("embed", "lora")), ((r, K, Dh), ("lora", "kv_heads", "head_dim")), D),
        "o": (((H, Dh, r), ("q_heads", "head_dim", "lora")), ((r, D), ("lora", "embed")), H * Dh),
        "gate": (((D, r), ("embed", "lora")), ((r, F), ("lora", "mlp")), D),
        "up": (((D, r), ("embed", "lora")), ((r, F), ("lora", "mlp")), D),
        "down": (((F, r), ("mlp", "lora")), ((r, D), ("lora", "embed")), F),
    }
    out = {}
    for name in cfg.lora.targets:
        (a_shape, a_axes), (b_shape, b_axes), fan_in = full[name]
        out[f"{name}_a"] = ((L, *a_shape), ("layers", *a_axes), fan_in)
        out[f"{name}_b"] = ((L, *b_shape), ("layers", *b_axes), fan_in)
    return out


class LoRAAdapters(nnx.Module):
    """Every adapter of the policy: ``<target>_a`` / ``<target>_b`` ``nnx.LoRAParam`` variables
    stacked on the ``layers`` axis (see the module docstring for shapes)."""

    def __init__(self, cfg: ModelConfig, *, key: Array):
        dtype = jnp.dtype(cfg.param_dtype)
        layout = lora_layout(cfg)
        keys = jax.random.split(key, len(layout))
        for k, (name, (shape, axes, fan_in)) in zip(keys, sorted(layout.items()), strict=True):
            if name.endswith("_a"):
                bound = 1.0 / math.sqrt(fan_in)
                value = jax.random.uniform(k, shape, jnp.float32, -bound, bound).astype(dtype)
            else:
                value = jnp.zeros(shape, dtype)
            setattr(self, name, nnx.LoRAParam(value, out_sharding=axes, eager_sharding=False))

    def stacked(self) -> dict[str, tuple[Array, Array]]:
        """``target -> (A, B)``, each Float['L ...'], the adapters' ``xs`` of the layer scan."""
        names = sorted({k[:-2] for k, v in vars(self).items() if isinstance(v, nnx.LoRAParam)})
        return {n: (getattr(self, f"{n}_a")[...], getattr(self, f"{n}_b")[...]) for n in names}


def lora_delta(cfg: ModelConfig, p: dict[str, Any], name: str, x: Array) -> Array | None:
    """``s * (x @ A) @ B`` of projection ``name`` for one layer's weights ``p`` (None without an
    adapter there). ``x``: the projection's input, Float['B T D'] (Float['B T H Dh'] for
    ``o``); the result has the projection's output shape."""
    lora = p.get("lora")
    if lora is None or name not in lora:
        return None
    a, b = lora[name]
    dt = x.dtype
    if name == "o":
        z = jnp.einsum("bthk,hkr->btr", x, a.astype(dt))
    else:
        z = x @ a.astype(dt)
    z = z * jnp.asarray(cfg.lora.scale, dt)
    if name in ("q", "k", "v"):
        return jnp.einsum("btr,rhk->bthk", z, b.astype(dt))
    return z @ b.astype(dt)


def lora_product(cfg: ModelConfig, name: str, a: Array, b: Array) -> Array:
    """``s * A @ B`` of one layer in the base weight's layout (float32)."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    s = cfg.lora.scale
    if name == "o":
        return s * jnp.einsum("hkr,rd->hkd", a, b)
    if name in ("q", "k", "v"):
        return s * jnp.einsum("dr,rhk->dhk", a, b)
    return s * (a @ b)


def merge_layer(cfg: ModelConfig, p: dict[str, Any]) -> dict[str, Any]:
    """One layer's weights, or the stacked layers' (``Transformer.stacked_params``: the adapters
    cover the top layers, ``LoRAConfig.top_layers``), with the adapters folded into the base."""
    lora = p.get("lora")
    if lora is None:
        return p
    out = {k: v for k, v in p.items() if k != "lora"}
    for name, (a, b) in lora.items():
        w = out[name]
        if a.ndim == (4 if name == "o" else 3):  # stacked on the layers axis
            delta = jax.vmap(lambda a_, b_, n=name: lora_product(cfg, n, a_, b_))(a, b)
            first = w.shape[0] - delta.shape[0]
            out[name] = w.astype(jnp.float32).at[first:].add(delta).astype(w.dtype)
        else:
            out[name] = (w.astype(jnp.float32) + lora_product(cfg, name, a, b)).astype(w.dtype)
    return out


def add_lora(model: Any, lora: Any, *, seed: int = 0, mesh: Any = None) -> Any:
    """Give ``model`` (a ``Transformer`` without adapters) fresh adapters of config ``lora``
    (a ``LoRAConfig``), in place; ``mesh``: place them on it. Returns the model."""
    if model.cfg.lora is not None:
        raise ValueError("the model already has LoRA adapters")
    model.cfg = model.cfg.replace(lora=lora)
    model.lora = LoRAAdapters(model.cfg, key=jax.random.key(seed))
    if mesh is not None:
        from jaxrl_agents.sharding import param_shardings

        state = nnx.state(model.lora)
        nnx.update(model.lora, jax.device_put(state, param_shardings(state, mesh)))
    return model


def merge_lora(model: Any) -> Any:
    """A copy of ``model`` with the adapters folded into the base weights and removed (what a
    merged export writes); ``model`` itself when it has none."""
    cfg = model.cfg
    if cfg.lora is None:
        return model
    clone = nnx.clone(model)
    merged = merge_layer(cfg, clone.stacked_params())
    for name in cfg.lora.targets:
        getattr(clone.layers, name).set_value(merged[name])
    del clone.lora
    clone.cfg = cfg.replace(lora=None)
    return clone


def without_lora(model: Any) -> Any:
    """``model``'s base policy: the same base weights (shared, not copied), no adapters."""
    if model.cfg.lora is None:
        return model
    graphdef, state = nnx.split(model)
    clone = nnx.merge(graphdef, state)  # new module objects over the same arrays
    del clone.lora
    clone.cfg = clone.cfg.replace(lora=None)
    return clone


def base_fingerprint(model: Any) -> str:
    """A short identity of the frozen base weights (what a LoRA checkpoint is only valid on):
    a SHA-256 over every base parameter's path, shape, dtype, float64 sum and a strided sample of
    its values. Equal bases give equal fingerprints; another checkpoint (or a fine-tuned copy of
    the same one) gives another."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    state = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    for path, var in sorted(nnx.to_flat_state(state), key=lambda kv: tuple(map(str, kv[0]))):
        if "value_head" in map(str, path):  # a critic is trained, not part of the base
            continue
        x = var.get_value()
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            from jax.experimental import multihost_utils

            x = multihost_utils.process_allgather(x, tiled=True)
        host = np.asarray(jax.device_get(x))
        flat = host.reshape(-1)
        h.update(f"{'.'.join(map(str, path))}:{host.shape}:{host.dtype}".encode())
        h.update(np.float64(flat.astype(np.float64).sum()).tobytes())
        h.update(np.ascontiguousarray(flat[:: max(1, flat.size // 4096)]).tobytes())
    return h.hexdigest()[:16]
