"""Composable reward terms over host-side trajectories (plain Python; never imports jax).

``REWARD_TERMS`` is the registry (extend it with ``register_reward_term``); ``RewardComposer``
turns a ``RewardConfig`` into a callable that writes ``traj.reward`` and per-term, per-turn logs.
"""

from jaxrl_agents.rewards.compose import ComposedReward, RewardComposer, RewardConfig, TermConfig
from jaxrl_agents.rewards.judge import JUDGE_FAILURES, JUDGES, register_judge, resolve_judge
from jaxrl_agents.rewards.terms import REWARD_TERMS, TermSpec, register_reward_term

__all__ = [
    "JUDGES",
    "JUDGE_FAILURES",
    "REWARD_TERMS",
    "ComposedReward",
    "RewardComposer",
    "RewardConfig",
    "TermConfig",
    "TermSpec",
    "register_judge",
    "register_reward_term",
    "resolve_judge",
]
