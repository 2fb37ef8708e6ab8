"""Trajectory-level summaries: success with a confidence interval, effort, failure-mode counts.

Used by the trainer for held-out checks during a run and by ``jaxrl-eval`` reports. The failure
modes are read from the trajectory itself and the environment's standard annotations
(:class:`~jaxrl_agents.types.Ann`), never from the final answer alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.types import Ann, EndReason, ToolErrorKind, Trajectory

INVALID_KINDS = (ToolErrorKind.MALFORMED, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.BAD_ARGUMENTS)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0% / 100%, small n)."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def has_loop(traj: Trajectory, *, min_repeats: int = 2) -> bool:
    """The same tool call (name + arguments) issued ``min_repeats`` or more times."""
    counts = Counter(c.signature() for c in traj.tool_calls if c.error is None)
    return any(n >= min_repeats for n in counts.values())


def is_premature(traj: Trajectory) -> bool:
    """Answered before the evidence the answer needs was gathered."""
    for turn in traj.turns:
        if turn.annotations.get(Ann.ANSWERED) and turn.annotations.get(Ann.EVIDENCE_COMPLETE) is False:
            return True
    return False


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
        "context_loss": info.get(Ann.EVIDENCE_IN_ANSWER) is False,
        "constraint_drift": _constraint_drift(traj),
        "episode_timeout": traj.end_reason == EndReason.EPISODE_TIMEOUT,
        "no_answer": traj.end_reason != EndReason.ANSWERED,
    }


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


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Aggregate metrics over trajectories (one per task for greedy held-out evaluation)."""
    n = len(trajs)
    wins = sum(t.success for t in trajs)
    lo, hi = wilson_interval(wins, n)
    modes = Counter()
    for t in trajs:
        modes.update(k for k, v in failure_modes(t).items() if v)
    ends = Counter(t.end_reason.value for t in trajs)
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else 0.0
    terms: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.reward_terms.items():
            terms.setdefault(k, []).append(v)
    return {
        "n": n,
        "success": wins / n if n else 0.0,
        "success_ci95": [lo, hi],
        "mean_turns": mean([len(t.turns) for t in trajs]),
        "mean_tool_calls": mean([len(t.tool_calls) for t in trajs]),
        "mean_generated_tokens": mean([t.num_generated_tokens for t in trajs]),
        "mean_reward": mean([t.reward for t in trajs]),
        "reward_terms": {k: mean(v) for k, v in sorted(terms.items())},
        "failure_modes": {k: modes.get(k, 0) for k in failure_modes(trajs[0])} if n else {},
        "end_reasons": dict(sorted(ends.items())),
    }
