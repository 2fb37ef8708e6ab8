"""Trajectory-level summaries: success with a confidence interval, effort, failure-mode counts.

Used by the trainer for held-out checks during a run and by ``jaxrl-eval`` reports. The failure
modes are read from the trajectory itself and the environment's standard annotations
(:class:`~jaxrl_agents.types.Ann`), never from the final answer alone. A missing annotation means
"no information": the mode is reported as absent, never guessed.

Two views of the taxonomy:

* :func:`failure_modes` — multi-label flags (a premature answer usually also skips a required
  step; both are true and both are counted);
* :func:`primary_failure` — one cause per *failed* trajectory, the first flag in
  :data:`PRIMARY_ORDER` (most specific / most actionable first), falling back to
  ``wrong_answer`` (answered after doing every step, still wrong). These sum to the failures.

The facts behind the flags — a repeated call, the answer turn, a premature answer, an invalid
call — are defined once in :mod:`jaxrl_agents.facts`, the module the reward terms (``loop``,
``premature``, ``tool_validity``) and the environments' ``repeated_calls`` annotation use too, so
what RL penalises is exactly what this taxonomy counts. A loop is any valid call equal, up to case,
whitespace and number spelling (``facts.call_key``), to an earlier call of the episode; ``37*12``
vs ``37*13`` is not one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.facts import (
    INVALID_CALL_KINDS,
    evidence_gathered,
    has_loop,
    invalid_calls,
    is_premature,
    repeated_calls,
)
from jaxrl_agents.facts import call_key as normalized_signature
from jaxrl_agents.types import Ann, EndReason, ToolErrorKind, Trajectory

INVALID_KINDS = INVALID_CALL_KINDS
"""Alias of :data:`jaxrl_agents.facts.INVALID_CALL_KINDS`."""

__all__ = [
    "FAILURE_MODES",
    "INVALID_KINDS",
    "PRIMARY_ORDER",
    "failure_modes",
    "has_loop",
    "is_context_loss",
    "is_premature",
    "normalized_signature",
    "primary_failure",
    "repeated_calls",
    "summarize",
    "wilson_interval",
]

FAILURE_MODES = (
    "loop",
    "premature",
    "skipped_step",
    "invalid_call",
    "tool_error",
    "tool_timeout",
    "context_loss",
    "constraint_drift",
    "episode_timeout",
    "no_answer",
)
"""Every flag :func:`failure_modes` reports, in report order."""

PRIMARY_ORDER = (
    "env_error",
    "episode_timeout",
    "loop",
    "invalid_call",
    "premature",
    "skipped_step",
    "context_loss",
    "constraint_drift",
    "tool_timeout",
    "tool_error",
    "no_answer",
)
"""Precedence of :func:`primary_failure`; ``wrong_answer`` is the fallback."""


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0% / 100%, small n)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def is_context_loss(traj: Trajectory) -> bool:
    """Evidence was retrieved (a tool call succeeded) and the episode answered, but the env says
    the answer does not use it. An answer given without retrieving anything is premature, not
    context loss."""
    if traj.info.get(Ann.EVIDENCE_IN_ANSWER) is not False or traj.end_reason != EndReason.ANSWERED:
        return False
    return evidence_gathered(traj)


def failure_modes(traj: Trajectory) -> dict[str, bool]:
    """Which step-level failure modes this trajectory shows (several can hold at once)."""
    info = traj.info
    return {
        "loop": has_loop(traj),
        "premature": is_premature(traj),
        "skipped_step": bool(info.get(Ann.MISSING_STEPS)),
        "invalid_call": invalid_calls(traj) > 0,
        "tool_error": traj.count_errors(ToolErrorKind.TOOL_ERROR) > 0,
        "tool_timeout": traj.count_errors(ToolErrorKind.TIMEOUT) > 0,
        "context_loss": is_context_loss(traj),
        "constraint_drift": _constraint_drift(traj),
        "episode_timeout": traj.end_reason == EndReason.EPISODE_TIMEOUT,
        "no_answer": traj.end_reason != EndReason.ANSWERED,
    }


def primary_failure(traj: Trajectory) -> str | None:
    """The one most actionable cause of a failed trajectory (None when it succeeded)."""
    if traj.success:
        return None
    if traj.end_reason == EndReason.ENV_ERROR:
        return "env_error"
    modes = failure_modes(traj)
    return next((m for m in PRIMARY_ORDER[1:] if modes[m]), "wrong_answer")


def _constraint_drift(traj: Trajectory) -> bool:
    """Constraints held at some turn and were broken at a later one."""
    seen_ok = False
    for turn in traj.turns:
        v = turn.annotations.get(Ann.CONSTRAINT_VIOLATIONS)
        if v is None:
            continue
        if not v:
            seen_ok = True
        elif seen_ok:
            return True
    return False


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Aggregate metrics over trajectories (one per task for greedy held-out evaluation).

    Counts (``failure_modes``, ``primary_failures``, ``end_reasons``) are numbers of trajectories.
    """
    n = len(trajs)
    wins = sum(t.success for t in trajs)
    lo, hi = wilson_interval(wins, n)
    modes: Counter[str] = Counter()
    primary: Counter[str] = Counter()
    for t in trajs:
        modes.update(k for k, v in failure_modes(t).items() if v)
        cause = primary_failure(t)
        if cause is not None:
            primary[cause] += 1
    ends = Counter(t.end_reason.value for t in trajs)
    terms: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.reward_terms.items():
            terms.setdefault(k, []).append(v)
    return {
        "n": n,
        "success": wins / n if n else 0.0,
        "success_ci95": [lo, hi],
        "mean_turns": _mean([len(t.turns) for t in trajs]),
        "mean_tool_calls": _mean([len(t.tool_calls) for t in trajs]),
        "mean_generated_tokens": _mean([t.num_generated_tokens for t in trajs]),
        "mean_total_tokens": _mean([len(t.token_ids) for t in trajs]),
        "mean_reward": _mean([t.reward for t in trajs]),
        "reward_terms": {k: _mean(v) for k, v in sorted(terms.items())},
        "failure_modes": {k: modes.get(k, 0) for k in FAILURE_MODES} if n else {},
        "primary_failures": dict(sorted(primary.items())),
        "end_reasons": dict(sorted(ends.items())),
    }
