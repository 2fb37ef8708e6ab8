"""Held-out evaluation: trajectory metrics, the step-level failure taxonomy, side-by-side
comparisons, HTML/JSON reports (``evaluation.report``) and policy specs
(``evaluation.policies``). The evaluation layer receives trajectories; running policies to get
them is the eval job's (``jobs.evaluate``, behind ``jaxrl-eval``). The report module is imported
explicitly: it pulls in matplotlib, which per-step summaries do not need."""

from jaxrl_agents.evaluation.compare import Comparison, compare, mcnemar_exact
from jaxrl_agents.evaluation.metrics import evaluation_metrics, pass_at_k, pass_at_ks
from jaxrl_agents.evaluation.summary import (
    FAILURE_MODES,
    failure_modes,
    primary_failure,
    summarize,
    wilson_interval,
)

__all__ = [
    "FAILURE_MODES",
    "Comparison",
    "compare",
    "evaluation_metrics",
    "failure_modes",
    "mcnemar_exact",
    "pass_at_k",
    "pass_at_ks",
    "primary_failure",
    "summarize",
    "wilson_interval",
]
