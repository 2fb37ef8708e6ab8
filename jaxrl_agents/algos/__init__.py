"""Advantage estimators, policy losses, KL estimators and batch shaping: pure array functions.

Everything is selected by name from a registry that user code can extend
(``register_advantage``, ``register_policy_loss``); configs validate against those registries.
"""

from jaxrl_agents.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageInputs,
    AdvantageOutput,
    compute_advantages,
    discounted_gae,
    group_stats,
    register_advantage,
    whiten,
)
from jaxrl_agents.algos.aggregation import (
    AGG_MODES,
    aggregate,
    aggregation_denominator,
    sequence_sum,
)
from jaxrl_agents.algos.batch_shaping import (
    DynamicSampler,
    ShapingStats,
    filter_zero_variance_groups,
    mask_rows,
    overlong_rows,
    zero_variance_mask,
)
from jaxrl_agents.algos.kl import KL_ESTIMATORS, kl_penalty, kl_reward
from jaxrl_agents.algos.losses import (
    POLICY_LOSSES,
    LossConfig,
    TokenLoss,
    policy_loss,
    register_policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageConfig",
    "AdvantageInputs",
    "AdvantageOutput",
    "DynamicSampler",
    "LossConfig",
    "ShapingStats",
    "TokenLoss",
    "aggregate",
    "aggregation_denominator",
    "compute_advantages",
    "discounted_gae",
    "filter_zero_variance_groups",
    "group_stats",
    "kl_penalty",
    "kl_reward",
    "mask_rows",
    "overlong_rows",
    "policy_loss",
    "register_advantage",
    "register_policy_loss",
    "sequence_sum",
    "value_loss",
    "whiten",
    "zero_variance_mask",
]
