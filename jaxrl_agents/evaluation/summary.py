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

Deviation from the ``loop`` reward term: that term may use a ``difflib`` ratio for near-duplicate
calls; here a near-duplicate is an equal *normalised* call (case and whitespace of string arguments,
``12.0`` vs ``12``), because a ratio threshold flags distinct short calls such as
``37*12`` vs ``37*13`` as loops.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.types import Ann, EndReason, ToolCall, ToolErrorKind, Trajectory

INVALID_KINDS = (ToolErrorKind.MALFORMED, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.BAD_ARGUMENTS)

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

_WORD = re.compile(r"\w+|[^\w\s]")


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0% / 100%, small n)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _norm_value(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        # Case and spacing do not change what a query/expression asks for; word order can
        # ("37-12" vs "12-37"), so it is kept.
        return " ".join(_WORD.findall(v.lower()))
    if isinstance(v, list | tuple):
        return [_norm_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _norm_value(x) for k, x in v.items()}
    return str(v)


def normalized_signature(call: ToolCall) -> str:
    """``ToolCall.signature()`` up to case, whitespace and number spelling (``12`` vs ``12.0``):
    ``calculator("37 * 12")`` and ``calculator("37*12")`` are the same call."""
    return call.name.strip().lower() + json.dumps(
        _norm_value(call.arguments), sort_keys=True, default=str
    )


def repeated_calls(traj: Trajectory, *, normalize: bool = True) -> int:
    """Valid tool calls that repeat an earlier call of the episode (exact or normalised)."""
    key = normalized_signature if normalize else ToolCall.signature
    counts = Counter(key(c) for c in traj.tool_calls if c.error is None)
    return sum(n - 1 for n in counts.values())


def has_loop(traj: Trajectory, *, min_repeats: int = 2, normalize: bool = True) -> bool:
    """The same tool call (name + arguments, normalised unless ``normalize=False``) issued
    ``min_repeats`` or more times: deterministic tools return the same result, so a repeat buys
    nothing new."""
    key = normalized_signature if normalize else ToolCall.signature
    counts = Counter(key(c) for c in traj.tool_calls if c.error is None)
    return any(n >= min_repeats for n in counts.values())


def is_premature(traj: Trajectory) -> bool:
    """Answered before the evidence the answer needs was gathered."""
    for turn in traj.turns:
        if (
            turn.annotations.get(Ann.ANSWERED)
            and turn.annotations.get(Ann.EVIDENCE_COMPLETE) is False
        ):
            return True
    return False


def is_context_loss(traj: Trajectory) -> bool:
    """Evidence was retrieved (a tool call succeeded) and the episode answered, but the env says
    the answer does not use it. An answer given without retrieving anything is premature, not
    context loss."""
    if traj.info.get(Ann.EVIDENCE_IN_ANSWER) is not False or traj.end_reason != EndReason.ANSWERED:
        return False
    return any(r.ok for r in traj.tool_results)


def failure_modes(traj: Trajectory) -> dict[str, bool]:
    """Which step-level failure modes this trajectory shows (several can hold at once)."""
    info = traj.info
    return {
        "loop": has_loop(traj),
        "premature": is_premature(traj),
        "skipped_step": bool(info.get(Ann.MISSING_STEPS)),
        "invalid_call": any(traj.count_errors(k) for k in INVALID_KINDS),
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
