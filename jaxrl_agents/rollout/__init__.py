"""Rollouts: the multi-turn orchestrator, the collector (tasks -> episodes -> device batches), a
model-free scripted engine and scripted policies, and packing into fixed-shape device batches."""

from jaxrl_agents.rollout.collector import Collector, DeviceBatch, Rollout
from jaxrl_agents.rollout.orchestrator import (
    Orchestrator,
    RolloutConfig,
    episode_seed,
    turn_seed,
)
from jaxrl_agents.rollout.packing import Packed, pack, pack_sft
from jaxrl_agents.rollout.scripted import ScriptedEngine

__all__ = [
    "Collector",
    "DeviceBatch",
    "Rollout",
    "Orchestrator",
    "Packed",
    "RolloutConfig",
    "ScriptedEngine",
    "episode_seed",
    "turn_seed",
    "pack",
    "pack_sft",
]
