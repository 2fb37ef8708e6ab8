"""Sampler: KV cache, sampling, jitted prefill/decode, the continuous-batching engine."""

from jaxrl_agents.generation.config import (
    EngineConfig,
    GenerationResult,
    Sampling,
    SamplingParams,
)
from jaxrl_agents.generation.engine import Engine
from jaxrl_agents.generation.session import Session

__all__ = ["Engine", "EngineConfig", "GenerationResult", "Sampling", "SamplingParams", "Session"]
