"""Reward terms: plain-Python functions of a :class:`~jaxrl_agents.types.Trajectory` (no jax).

A term is ``fn(traj, **params) -> float | list[float]``: a ``float`` is a trajectory-level value
(it lands on the last turn), a list has one value per turn (the turn that earned it). Values are
in reward units with their sign (penalties are negative), so ``weight=1.0`` gives the recommended
defaults: outcome +1/-1 dominates, -0.05 per step, -0.2 per invalid tool call.
``RewardComposer`` applies weight, clipping, gating and assignment on top.

Register your own with ``@register_reward_term("name")``; its keyword parameters (with defaults)
are the ``params`` a config may set, and unknown params are rejected at config time. An ``async``
term (e.g. the judge hook in ``rewards.judge``) is awaited by ``RewardComposer.acompute``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from jaxrl_agents import facts
from jaxrl_agents.types import Ann, ToolErrorKind, Trajectory, Turn

TermValue = float | list[float]


class TermSpec(NamedTuple):
    fn: Callable[..., Any]
    params: dict[str, Any]  # parameter name -> default
    is_async: bool


REWARD_TERMS: dict[str, TermSpec] = {}


def register_reward_term(name: str):
    """Decorator registering ``fn(traj, **params) -> float | list[float]`` (or an async one)."""

    def deco(fn):
        if name in REWARD_TERMS:
            raise ValueError(f"reward term {name!r} is already registered")
        sig = inspect.signature(fn)
        params = {
            p.name: p.default
            for p in list(sig.parameters.values())[1:]
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        REWARD_TERMS[name] = TermSpec(fn, params, inspect.iscoroutinefunction(fn))
        return fn

    return deco


def _per_turn(traj: Trajectory, f: Callable[[int, Turn], float]) -> list[float]:
    return [float(f(i, t)) for i, t in enumerate(traj.turns)]


@register_reward_term("outcome")
def outcome(
    traj: Trajectory, *, success: float = 1.0, failure: float = -1.0, use_score: bool = False
) -> float:
    """``success`` / ``failure`` from the verdict (no verdict: failure). ``use_score`` maps the
    verdict's partial credit ``score in [0, 1]`` linearly onto ``[failure, success]``."""
    if traj.verdict is None:
        return failure
    if use_score:
        return failure + (success - failure) * float(traj.verdict.score)
    return success if traj.verdict.success else failure


@register_reward_term("step_penalty")
def step_penalty(traj: Trajectory, *, per_step: float = -0.05, free_steps: int = 0) -> list[float]:
    """``per_step`` on every assistant turn after the first ``free_steps``."""
    return _per_turn(traj, lambda i, _: per_step if i >= free_steps else 0.0)


@register_reward_term("tool_validity")
def tool_validity(
    traj: Trajectory,
    *,
    per_invalid: float = -0.2,
    count_tool_errors: bool = False,
    count_timeouts: bool = False,
) -> list[float]:
    """``per_invalid`` per tool call the policy got wrong (``facts.INVALID_CALL_KINDS``: malformed,
    unknown tool, bad arguments); a tool that raised or timed out is the environment's fault unless
    opted in."""
    kinds = set(facts.INVALID_CALL_KINDS)
    if count_tool_errors:
        kinds.add(ToolErrorKind.TOOL_ERROR)
    if count_timeouts:
        kinds.add(ToolErrorKind.TIMEOUT)
    return _per_turn(traj, lambda _, t: per_invalid * facts.invalid_calls(t, kinds=kinds))


@register_reward_term("format")
def format_(
    traj: Trajectory,
    *,
    per_violation: float = -0.1,
    pattern: str | None = None,
    penalize_truncated: bool = True,
) -> list[float]:
    """``per_violation`` per turn that stopped on the length limit (``finish_reason`` length /
    cache_full) or whose text does not match the regex ``pattern`` (``re.search``)."""
    import re

    rx = re.compile(pattern, re.DOTALL) if pattern else None

    def bad(t: Turn) -> bool:
        truncated = penalize_truncated and t.finish_reason in ("length", "cache_full")
        return truncated or (rx is not None and rx.search(t.text) is None)

    return _per_turn(traj, lambda _, t: per_violation if bad(t) else 0.0)


@register_reward_term("efficiency")
def efficiency(traj: Trajectory, *, per_call: float = -0.02, per_token: float = 0.0) -> list[float]:
    """``per_call`` per tool call plus ``per_token`` per *sampled* token (``turn.end - turn.start``;
    tool-result and template tokens are not the policy's and never count). Usually gated on
    success so that a cheap failure never beats an expensive success."""
    return _per_turn(
        traj, lambda _, t: per_call * len(t.tool_calls) + per_token * (t.end - t.start)
    )


@register_reward_term("loop")
def loop(traj: Trajectory, *, per_repeat: float = -0.1) -> list[float]:
    """``per_repeat`` per valid tool call that repeats an earlier call of the episode, on the turn
    that made it (``facts.repeated_call_counts``: equal up to case, whitespace and number spelling,
    the same count as the env's ``repeated_calls`` annotation and the evaluation's ``loop``; a
    call again after its execution failed is a retry, not a repeat)."""
    return [per_repeat * n for n in facts.repeated_call_counts(traj.turns)]


@register_reward_term("premature")
def premature(traj: Trajectory, *, penalty: float = -0.5) -> list[float]:
    """``penalty`` on the answer turn (``facts.answer_turn``: ``Ann.ANSWERED``, else a final
    tool-free turn of an ANSWERED episode) when its ``Ann.EVIDENCE_COMPLETE`` is False (a missing
    key: no penalty); ``facts.premature_turn``."""
    k = facts.premature_turn(traj)
    out = [0.0] * len(traj.turns)
    if k is not None:
        out[k] = penalty
    return out


@register_reward_term("constraint")
def constraint(
    traj: Trajectory, *, per_turn: float = -0.1, per_violation: float = 0.0
) -> list[float]:
    """Constraint adherence across turns (drift): ``per_turn`` on each turn whose
    ``Ann.CONSTRAINT_VIOLATIONS`` is non-empty, plus ``per_violation`` per listed violation."""

    def f(_, t: Turn) -> float:
        v = t.annotations.get(Ann.CONSTRAINT_VIOLATIONS) or []
        return (per_turn if v else 0.0) + per_violation * len(v)

    return _per_turn(traj, f)


@register_reward_term("progress")
def progress(
    traj: Trajectory, *, scale: float = 1.0, mode: str = "delta", use_env_reward: bool = True
) -> list[float]:
    """Env-provided shaping. ``mode='delta'``: ``scale * (p_n - p_{n-1})`` of ``Ann.PROGRESS``
    (potential-based, Ng et al. 1999: the sum telescopes to the final progress, so it cannot
    reward going in circles); ``'absolute'``: ``scale * p_n``. Plus ``Turn.env_reward`` if set and
    ``use_env_reward``. A turn without ``Ann.PROGRESS`` keeps the previous progress."""
    if mode not in ("delta", "absolute"):
        raise ValueError(f"progress mode {mode!r} is not one of: delta, absolute")
    out, prev = [], 0.0
    for t in traj.turns:
        p = float(t.annotations.get(Ann.PROGRESS, prev))
        v = scale * (p - prev if mode == "delta" else p)
        if use_env_reward and t.env_reward is not None:
            v += float(t.env_reward)
        out.append(v)
        prev = p
    return out


@register_reward_term("partial_credit")
def partial_credit(
    traj: Trajectory, *, per_valid_call: float = 0.1, per_hit: float = 0.2
) -> list[float]:
    """Dense partial rewards (the shaping the articles warn about, for the reward-design
    experiment): ``per_valid_call`` for every call that ran without an error, and ``per_hit`` for
    every required step (a retrieval hit: an evidence document opened, a needed table read, ...)
    newly completed in the turn. The hits read env annotations (``Ann.PROGRESS``, the fraction of
    the verdict's ``required_steps`` done), i.e. privileged knowledge of what the task needs; the
    valid-call credit needs none and pays for tool spam."""
    n_req = len((traj.verdict.info if traj.verdict else {}).get(Ann.REQUIRED_STEPS, []) or [])
    out, prev = [], 0.0
    for t in traj.turns:
        ok = sum(1 for r in t.tool_results if getattr(r, "ok", False))
        p = float(t.annotations.get(Ann.PROGRESS, prev))
        hits = round((p - prev) * n_req) if n_req else 0
        out.append(per_valid_call * ok + per_hit * max(hits, 0))
        prev = p
    return out
