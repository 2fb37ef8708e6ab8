"""ModelConfig: the one typed description of a Llama 3 / Qwen2 / Qwen3 decoder.

Converts to and from a Hugging Face ``config.json`` dict. Both the transformers<5 spelling
(``rope_theta`` + ``rope_scaling``) and the transformers>=5 spelling (``rope_parameters``) are read;
export writes both so either version of transformers loads the folder.

The config is frozen and hashable: NNX keeps it in the static graph definition, so a jitted function
closing over a model compiles once per config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "bfloat16")

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


ATTENTION_IMPLS = ("auto", "reference", "fused")


class ModelConfigError(ValueError):
    """A config the decoder cannot represent (unknown model_type, rope type, dtype, ...)."""


LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
"""Projections a LoRA adapter can wrap (ours; PEFT's ``q_proj`` ... ``down_proj`` are read too)."""


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters on the decoder's projections (``W + alpha / rank * A @ B``, B zero at
    the start, so a fresh adapter leaves the base policy unchanged). The base weights are frozen:
    only the adapters (and a critic, when the run has one) are trained."""

    rank: int = 16
    """Inner dimension r of each adapter."""
    alpha: float = 32.0
    """Scale numerator: the update is ``alpha / rank * A @ B`` (PEFT's ``lora_alpha``)."""
    dropout: float = 0.0
    """Dropout on the adapters' input. Only 0.0 is implemented (the usual setting for RL)."""
    targets: tuple[str, ...] = LORA_TARGETS
    """Wrapped projections, a subset of ``q k v o gate up down`` (or PEFT's ``*_proj`` names)."""
    top_layers: int | None = None
    """Adapters on the last ``top_layers`` decoder layers only (PEFT's ``layers_to_transform``
    over the top layers); None: every layer. The backward pass then stops at the lowest adapted
    layer: the frozen layers below it run forward only."""

    def __post_init__(self) -> None:
        if int(self.rank) != self.rank or self.rank < 1:
            raise ModelConfigError(f"rank={self.rank!r} must be an integer >= 1")
        if not self.alpha > 0:
            raise ModelConfigError(f"alpha={self.alpha!r} must be > 0")
        if self.dropout != 0.0:
            raise ModelConfigError(
                f"dropout={self.dropout!r}: dropout on the adapters is not implemented; valid: 0.0"
            )
        names = [self.targets] if isinstance(self.targets, str) else list(self.targets)
        out = []
        for name in names:
            ours = str(name).removeprefix("self_attn.").removeprefix("mlp.").removesuffix("_proj")
            if ours not in LORA_TARGETS:
                raise ModelConfigError(
                    f"{name!r} is not a projection; valid: "
                    f"{', '.join(LORA_TARGETS)} (or {', '.join(t + '_proj' for t in LORA_TARGETS)})"
                )
            if ours not in out:
                out.append(ours)
        if not out:
            raise ModelConfigError("targets is empty: name at least one projection")
        if self.top_layers is not None and (
            isinstance(self.top_layers, bool)
            or int(self.top_layers) != self.top_layers
            or self.top_layers < 1
        ):
            raise ModelConfigError(
                f"top_layers={self.top_layers!r}: a number of layers >= 1, or null for every layer"
            )
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in out))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def first_layer(self, num_layers: int) -> int:
        """Index of the lowest adapted layer of a ``num_layers``-layer decoder."""
        if self.top_layers is None:
            return 0
        if self.top_layers > num_layers:
            raise ModelConfigError(
                f"lora.top_layers={self.top_layers} exceeds the model's {num_layers} layers"
            )
        return num_layers - int(self.top_layers)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.x frequency-dependent RoPE scaling (HF ``rope_type: llama3``)."""

    factor: float
    """Wavelength multiplier applied to the low-frequency band."""
    low_freq_factor: float
    """Wavelengths longer than ``original_max_position_embeddings / low_freq_factor`` are scaled."""
    high_freq_factor: float
    """Wavelengths shorter than ``original_max_position_embeddings / high_freq_factor`` are kept."""
    original_max_position_embeddings: int
    """Context length the base model was pretrained with."""
    rope_type: str = "llama3"
    """Only ``llama3`` is supported."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture + numerics of one decoder; build with ``from_hf_config`` or directly."""

    model_type: str
    """HF family: one of ``llama``, ``qwen2``, ``qwen3``. Decides the export architecture name."""
    vocab_size: int
    """Rows of the embedding table and columns of the LM head."""
    hidden_size: int
    """Residual-stream width D."""
    intermediate_size: int
    """SwiGLU inner width F."""
    num_hidden_layers: int
    """Number of decoder blocks L."""
    num_attention_heads: int
    """Query heads H."""
    num_key_value_heads: int
    """Key/value heads K (GQA); must divide H."""
    head_dim: int | None = None
    """Per-head width Dh; ``None`` = hidden_size // num_attention_heads (Qwen3 sets it apart)."""
    max_position_embeddings: int = 4096
    """Advertised context length (exported; not enforced by the model)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_scaling: RopeScaling | None = None
    """Llama 3 RoPE scaling, or ``None`` for plain RoPE."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    tie_word_embeddings: bool = False
    """LM head reuses the embedding table (transposed)."""
    attention_bias: bool = False
    """Bias on the q/k/v projections (Qwen2: always; Llama/Qwen3: HF ``attention_bias``)."""
    o_proj_bias: bool = False
    """Bias on the output projection (Llama/Qwen3 with ``attention_bias``; never in Qwen2)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k before RoPE (Qwen3)."""
    bos_token_id: int | None = None
    """Exported to config.json / generation_config.json only."""
    eos_token_id: int | tuple[int, ...] | None = None
    """Exported to config.json / generation_config.json only."""
    pad_token_id: int | None = None
    """Exported to config.json only."""
    dtype: str = "float32"
    """Compute dtype of activations and matmuls (``float32`` or ``bfloat16``)."""
    param_dtype: str = "float32"
    """Storage dtype of the parameters (``float32`` or ``bfloat16``)."""
    remat: bool = False
    """Rematerialise each decoder block in the backward pass (saves activation memory)."""
    scan_unroll: int = 1
    """Decoder layers per iteration of the model's layer scan (``lax.scan(unroll=...)``): 1 keeps
    one compiled layer (compile time independent of depth); ``num_hidden_layers`` unrolls the
    whole stack. Measured on 2 CPU cores with the 135M model (BENCHMARKS.md, the real model's RL
    step): unrolled, a full fine-tuning update without ``remat`` ran 1.15x faster, a LoRA update
    no faster, and with ``remat`` a LoRA update ran ~1.25x slower at 3x the peak memory, each
    compiling 2.5-3x longer; keep 1 unless a measurement says otherwise. (The sampler's own
    layout is unrolled separately, ``models/unrolled.py``.)"""
    attention: str = "auto"
    """Attention over a call's own tokens and prefill (more than one query per row):
    ``reference`` (einsums with a materialised float32 score tensor: the checked path), ``fused``
    (``jax.nn.dot_product_attention``: cuDNN flash attention on GPU, no score tensor kept for the
    backward pass; its XLA lowering elsewhere) or ``auto`` (fused on GPU, reference otherwise).
    One-query decode steps use ``decode_attention``."""
    decode_attention: str = "reference"
    """One-query decode steps over the KV cache: ``reference`` (masked einsums over the attention
    window) or ``pallas`` (``models.decode_attention``: a ragged kernel that reads only each
    row's visible positions; Triton on GPU, interpret mode elsewhere — for tests, slow)."""
    lora: LoRAConfig | None = None
    """Low-rank adapters on the projections (``models.lora``); None: none. Not exported to
    ``config.json`` (a PEFT adapter folder or a merged checkpoint carries them)."""

    def __post_init__(self) -> None:
        if isinstance(self.scan_unroll, bool) or int(self.scan_unroll) < 1:
            raise ModelConfigError(
                f"scan_unroll={self.scan_unroll!r}; a positive number of layers per scan iteration"
            )
        if self.decode_attention not in ("reference", "pallas"):
            raise ModelConfigError(
                f"decode_attention={self.decode_attention!r}; supported: reference, pallas"
            )
        if self.attention not in ATTENTION_IMPLS:
            raise ModelConfigError(
                f"attention={self.attention!r}; supported: {', '.join(ATTENTION_IMPLS)}"
            )
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(
                f"unsupported model_type {self.model_type!r}; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("dtype", "param_dtype"):
            val = getattr(self, name)
            if not isinstance(val, str):  # accept jnp.float32 / np.dtype too
                val = str(getattr(val, "__name__", None) or getattr(val, "name", val))
                object.__setattr__(self, name, val)
            if val not in SUPPORTED_DTYPES:
                raise ModelConfigError(f"{name}={val!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    def replace(self, **kw: Any) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    # ------------------------------------------------------------------ HF conversion
    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], **overrides: Any) -> ModelConfig:
        """Parse a HF ``config.json`` dict; ``overrides`` set dtype/param_dtype/remat etc."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelConfigError(
                f"unsupported model_type {model_type!r}; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"hidden_act={act!r}; only 'silu' (SwiGLU) is supported")
        if hf.get("mlp_bias"):
            raise ModelConfigError("mlp_bias=True is not supported")
        if hf.get("use_sliding_window"):
            raise ModelConfigError("use_sliding_window=True is not supported (full attention only)")
        rope_params = dict(hf.get("rope_parameters") or {})
        rope_theta = float(hf.get("rope_theta", rope_params.get("rope_theta", 10000.0)))
        scaling = hf.get("rope_scaling") or rope_params
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else None
        rope_scaling = None
        if rope_type not in (None, "default"):
            if rope_type != "llama3":
                raise ModelConfigError(
                    f"unsupported rope_type {rope_type!r}; supported: "
                    f"{', '.join(SUPPORTED_ROPE_TYPES)}"
                )
            rope_scaling = RopeScaling(
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
        hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        bias = bool(hf.get("attention_bias", False))
        kw: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=True if model_type == "qwen2" else bias,
            o_proj_bias=False if model_type == "qwen2" else bias,
            qk_norm=model_type == "qwen3",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )
        kw.update(overrides)
        return cls(**kw)

    def to_hf_config(self) -> dict[str, Any]:
        """A ``config.json`` dict that ``AutoConfig`` (transformers 4.x and 5.x) reads back."""
        rope_params: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        rope_scaling = None
        if self.rope_scaling is not None:
            rope_scaling = dataclasses.asdict(self.rope_scaling)
            rope_params = {**rope_scaling, "rope_theta": self.rope_theta}
        hf: dict[str, Any] = dict(
            architectures=[_ARCHITECTURES[self.model_type]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=rope_scaling,
            rope_parameters=rope_params,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=list(self.eos_token_id)
            if isinstance(self.eos_token_id, tuple)
            else self.eos_token_id,
            pad_token_id=self.pad_token_id,
            torch_dtype=self.param_dtype,
            use_cache=True,
        )
        if self.model_type != "qwen2":
            hf["attention_bias"] = self.attention_bias
            hf["mlp_bias"] = False
        else:
            hf["use_sliding_window"] = False
        return hf
