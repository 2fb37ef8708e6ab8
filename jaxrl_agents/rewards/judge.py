"""The async judge hook: a rubric score from a callable or a model endpoint, as a reward term.

A judge is ``async (traj: Trajectory) -> float`` (a plain function returning a float is accepted
too). The ``judge`` term's ``name`` param picks one of:

* a judge registered with :func:`register_judge` (or passed as ``RewardComposer(cfg, judges=...)``);
* an import path ``"package.module:attribute"`` resolved on first use.

Wrap an HTTP model endpoint in such a callable (this package makes no network calls itself).
``timeout_s`` bounds each call; ``on_error='zero'`` scores a failed or timed-out call 0 and counts
it in ``JUDGE_FAILURES`` instead of failing the training step.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable

from jaxrl_agents.rewards.terms import register_reward_term
from jaxrl_agents.types import Trajectory

Judge = Callable[[Trajectory], Awaitable[float] | float]
JUDGES: dict[str, Judge] = {}
JUDGE_FAILURES: dict[str, int] = {}


def register_judge(name: str, fn: Judge | None = None):
    """``register_judge("rubric", fn)`` or as a decorator ``@register_judge("rubric")``."""

    def add(f: Judge) -> Judge:
        JUDGES[name] = f
        return f

    return add(fn) if fn is not None else add


def resolve_judge(name: str, extra: dict[str, Judge] | None = None) -> Judge:
    """A registered judge (``extra`` first) or an ``module:attr`` import path."""
    if extra and name in extra:
        return extra[name]
    if name in JUDGES:
        return JUDGES[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot import judge {name!r}: {e}") from e
    known = sorted({*JUDGES, *(extra or {})})
    raise ValueError(
        f"unknown judge {name!r}; registered: {', '.join(known) or '(none)'}, "
        "or give an import path 'package.module:callable'"
    )


async def call_judge(fn: Judge, traj: Trajectory, *, timeout_s: float | None) -> float:
    out = fn(traj)
    if inspect.isawaitable(out):
        out = await asyncio.wait_for(out, timeout_s) if timeout_s else await out
    return float(out)


@register_reward_term("judge")
async def judge(
    traj: Trajectory,
    *,
    name: str = "",
    timeout_s: float | None = 60.0,
    on_error: str = "raise",
    _judges: dict[str, Judge] | None = None,
) -> float:
    """Trajectory-level rubric score from judge ``name`` (see the module docstring)."""
    if on_error not in ("raise", "zero"):
        raise ValueError(f"judge on_error {on_error!r} is not one of: raise, zero")
    fn = resolve_judge(name, _judges)
    try:
        return await call_judge(fn, traj, timeout_s=timeout_s)
    except Exception:
        if on_error == "raise":
            raise
        JUDGE_FAILURES[name] = JUDGE_FAILURES.get(name, 0) + 1
        return 0.0
