"""Held-out evaluation: trajectory metrics, the step-level failure taxonomy, side-by-side
comparisons, HTML/JSON reports (``evaluation.report``) and policy/snapshot evaluation
(``evaluation.runner``, behind ``jaxrl-eval``). Report and runner are imported explicitly: they
pull in matplotlib and the engine, which the trainer's per-step summaries do not need."""

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
