"""Flax NNX decoder family (Llama 3.x, Qwen2/2.5, Qwen3) with exact Hugging Face load/export
(and GGUF files read through a converted Hugging Face folder)."""

from jaxrl_agents.models.config import ModelConfig, ModelConfigError, RopeScaling
from jaxrl_agents.models.decoder import KVCache, Transformer, init_cache
from jaxrl_agents.models.gguf import GGUFError, gguf_to_folder, smollm2_path
from jaxrl_agents.models.hf_io import CheckpointError, export_pretrained, load_pretrained

__all__ = [
    "CheckpointError",
    "GGUFError",
    "KVCache",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "Transformer",
    "export_pretrained",
    "gguf_to_folder",
    "init_cache",
    "load_pretrained",
    "smollm2_path",
]
