"""Flax NNX decoder family (Llama 3.x, Qwen2/2.5, Qwen3) with exact Hugging Face load/export."""

from jaxrl_agents.models.config import ModelConfig, ModelConfigError, RopeScaling
from jaxrl_agents.models.decoder import KVCache, Transformer, init_cache
from jaxrl_agents.models.hf_io import CheckpointError, export_pretrained, load_pretrained

__all__ = [
    "CheckpointError",
    "KVCache",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "Transformer",
    "export_pretrained",
    "init_cache",
    "load_pretrained",
]
