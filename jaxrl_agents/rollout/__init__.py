"""Rollouts: the multi-turn orchestrator, a model-free scripted engine, and packing of
trajectories into fixed-shape device batches."""

from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig, episode_seed
from jaxrl_agents.rollout.packing import EpisodeArrays, Packed, TrainBatch, pack, pack_sft
from jaxrl_agents.rollout.scripted import ScriptedEngine

__all__ = [
    "EpisodeArrays",
    "Orchestrator",
    "Packed",
    "RolloutConfig",
    "ScriptedEngine",
    "TrainBatch",
    "episode_seed",
    "pack",
    "pack_sft",
]
