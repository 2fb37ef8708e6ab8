"""Trajectory metrics for evaluation reports: pass@k, per-task outcomes, reward terms, effort.

:func:`evaluation_metrics` extends :func:`~jaxrl_agents.evaluation.summary.summarize` (which the
trainer also uses) with what a held-out report needs when each task is sampled ``G`` times:

* ``pass@k`` for every requested ``k <= G``, with the unbiased estimator of Chen et al. (2021,
  "Evaluating Large Language Models Trained on Code", eq. 1): per task with ``n`` samples of
  which ``c`` succeed, ``pass@k = 1 - C(n-c, k) / C(n, k)``, averaged over tasks. With ``G = 1``
  ``pass@1`` is the success rate.
* per-term reward statistics (mean, std, min, max) as written by the reward composer;
* effort distributions (turns, tool calls, generated / total tokens: mean, median, p90, max);
* termination reasons and tool-error kinds as counts;
* success per report slice the env names (``Ann.SLICES``), with 95% Wilson intervals;
* what the policy does after a tool result (:func:`after_tool_results`): calls again, answers,
  or the episode ends; by the result's kind. A policy that never calls after an error never
  retries, and RL has no retry to reinforce.

Every number is a plain Python float/int/list, so the dict is the report's JSON as it is.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.evaluation.summary import summarize, wilson_interval
from jaxrl_agents.types import Ann, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples with ``c`` successes (needs ``k <= n``)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must be in [1, n={n}] (samples per task)")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the ratio of binomials without big integers.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def group_by_task(trajs: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories per task id, in first-seen task order, samples sorted by ``sample_index``."""
    out: dict[str, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(t.task.id, []).append(t)
    return {k: sorted(v, key=lambda t: t.sample_index) for k, v in out.items()}


def pass_at_ks(trajs: Sequence[Trajectory], ks: Sequence[int]) -> dict[str, float]:
    """``{"pass@k": mean over tasks}`` for each ``k`` (every task needs at least ``k`` samples)."""
    groups = group_by_task(trajs)
    if not groups:
        return {}
    fewest = min(len(g) for g in groups.values())
    out = {}
    for k in ks:
        if k > fewest:
            raise ValueError(
                f"pass@{k} needs >= {k} samples per task; the fewest any task has is {fewest} "
                f"(raise samples= or drop k={k})"
            )
        vals = [pass_at_k(len(g), sum(t.success for t in g), k) for g in groups.values()]
        out[f"pass@{k}"] = sum(vals) / len(vals)
    return out


def _dist(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, "median": 0.0, "p90": 0.0, "max": 0.0}
    s = sorted(xs)
    # Nearest-rank percentile: an observed value, no interpolation.
    p90 = s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]
    return {
        "mean": float(statistics.fmean(s)),
        "median": float(statistics.median(s)),
        "p90": float(p90),
        "max": float(s[-1]),
    }


def reward_term_stats(trajs: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
    """Per reward term over trajectories: mean, std (population), min, max."""
    terms: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.reward_terms.items():
            terms.setdefault(k, []).append(float(v))
    terms["total"] = [float(t.reward) for t in trajs]
    return {
        k: {
            "mean": statistics.fmean(v),
            "std": statistics.pstdev(v),
            "min": min(v),
            "max": max(v),
        }
        for k, v in sorted(terms.items())
        if v
    }


def task_outcomes(trajs: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    """Per task: samples, successes, success rate and the majority outcome ``solved``."""
    out = {}
    for task_id, g in group_by_task(trajs).items():
        wins = sum(t.success for t in g)
        out[task_id] = {
            "samples": len(g),
            "successes": wins,
            "success_rate": wins / len(g),
            # Strict majority: with G = 1 this is the trajectory's success.
            "solved": wins * 2 > len(g),
        }
    return out


def slice_metrics(trajs: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    """Success per report slice (``Ann.SLICES`` of the verdict, e.g. calculator's ``two-step``,
    ``fault-hit``): episodes, successes, rate and its 95% Wilson interval. An episode counts in
    every slice it names; one without a verdict in none."""
    counts: dict[str, list[int]] = {}
    for t in trajs:
        for name in t.info.get(Ann.SLICES) or ():
            c = counts.setdefault(str(name), [0, 0])
            c[0] += 1
            c[1] += bool(t.success)
    return {
        name: {
            "episodes": n,
            "successes": wins,
            "success": wins / n,
            "ci95": list(wilson_interval(wins, n)),
        }
        for name, (n, wins) in sorted(counts.items())
    }


NEXT_MOVES = ("call", "answer", "ended")


def after_tool_results(trajs: Sequence[Trajectory]) -> dict[str, dict[str, int]]:
    """What the turn after each tool-calling turn did, by that turn's results.

    Keys: ``ok`` when every result of the turn succeeded, else the first error's kind
    (``tool_error``, ``bad_arguments``, ...). Values count the next move: ``call`` (the next
    turn calls a tool, a retry or the next step), ``answer`` (it replies without a call) or
    ``ended`` (no next turn: the episode hit its turn, token or time limit first)."""
    out: dict[str, dict[str, int]] = {}
    for t in trajs:
        for i, turn in enumerate(t.turns):
            if not turn.tool_results:
                continue
            bad = next((r.error_kind.value for r in turn.tool_results if not r.ok), None)
            if i + 1 == len(t.turns):
                move = "ended"
            else:
                move = "call" if t.turns[i + 1].tool_calls else "answer"
            counts = out.setdefault(bad or "ok", dict.fromkeys(NEXT_MOVES, 0))
            counts[move] += 1
    return dict(sorted(out.items()))


def evaluation_metrics(trajs: Sequence[Trajectory], *, ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """Everything a report shows about one policy's trajectories (JSON-serialisable)."""
    if not trajs:
        raise ValueError("evaluation_metrics: no trajectories")
    base = summarize(trajs)
    errors = Counter(r.error_kind.value for t in trajs for r in t.tool_results if not r.ok)
    outcomes = task_outcomes(trajs)
    return {
        **base,
        "tasks": len(outcomes),
        "samples_per_task": max(o["samples"] for o in outcomes.values()),
        "tasks_solved": sum(o["solved"] for o in outcomes.values()),
        **pass_at_ks(trajs, ks),
        "turns": _dist([len(t.turns) for t in trajs]),
        "tool_calls": _dist([len(t.tool_calls) for t in trajs]),
        "generated_tokens": _dist([t.num_generated_tokens for t in trajs]),
        "total_tokens": _dist([len(t.token_ids) for t in trajs]),
        "reward_term_stats": reward_term_stats(trajs),
        "tool_errors": dict(sorted(errors.items())),
        "slices": slice_metrics(trajs),
        "after_tool_results": after_tool_results(trajs),
    }
