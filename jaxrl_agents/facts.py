"""Trajectory facts: the one definition of each behaviour that rewards, envs and evaluation read.

What the RL reward penalises, what an environment annotates and what the evaluation taxonomy counts
are the same facts, defined once here (layer 1: only ``jaxrl_agents.types`` and the standard
library):

* **invalid call** — a tool result whose error is one of :data:`INVALID_CALL_KINDS` (the policy's
  fault: malformed, unknown tool, bad arguments; a tool that raised or timed out is the env's);
* **repeated call** — a *valid* call (``ToolCall.error is None``) whose :func:`call_key` already
  appeared earlier in the episode, the same turn included. The key is the call up to case and
  whitespace of string arguments and number spelling (``12`` vs ``12.0``), so
  ``calculator("37 * 12")`` repeats ``calculator("37*12")`` while ``37*13`` and ``12-37`` do not
  (word order is kept: it changes what is asked). A loop is any repeat: deterministic tools return
  the same result, so a repeat buys nothing new;
* **answer turn** — the first turn annotated ``Ann.ANSWERED``; without any such annotation, the last
  turn of an ``ANSWERED`` episode when it made no tool call;
* **premature answer** — the answer turn's ``Ann.EVIDENCE_COMPLETE`` is ``False`` (measured before
  that turn; a missing key means "no information", never premature);
* **tool-call arguments** — :func:`decode_arguments` turns a JSON string or dict into the
  arguments object, or a readable error; it never raises (JSON nested past
  :data:`MAX_ARGUMENT_DEPTH` levels, integers past Python's digit limit and any other decoding
  failure are errors, not exceptions).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from jaxrl_agents.types import (
    Ann,
    EndReason,
    ToolCall,
    ToolErrorKind,
    ToolResult,
    Trajectory,
    Turn,
)

INVALID_CALL_KINDS: tuple[ToolErrorKind, ...] = (
    ToolErrorKind.MALFORMED,
    ToolErrorKind.UNKNOWN_TOOL,
    ToolErrorKind.BAD_ARGUMENTS,
)
"""Tool-error kinds that are the policy's fault (an invalid call)."""

_WORD = re.compile(r"\w+|[^\w\s]")


# -- invalid calls --------------------------------------------------------------------------------


def invalid_calls(
    source: Turn | Trajectory, *, kinds: Iterable[ToolErrorKind] = INVALID_CALL_KINDS
) -> int:
    """Tool results of a turn or a whole trajectory whose error kind is in ``kinds``."""
    kinds = frozenset(kinds)
    return sum(r.error_kind in kinds for r in source.tool_results)


# -- repeated calls -------------------------------------------------------------------------------


def _norm_value(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        try:
            return float(v)
        except OverflowError:  # an integer beyond float range is its own key
            return v
    if isinstance(v, str):
        # Case and spacing do not change what a query/expression asks for; word order can
        # ("37-12" vs "12-37"), so it is kept.
        return " ".join(_WORD.findall(v.lower()))
    if isinstance(v, list | tuple):
        return [_norm_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _norm_value(x) for k, x in v.items()}
    return str(v)


def call_key(call: ToolCall) -> str:
    """``ToolCall.signature()`` up to case, whitespace and number spelling (``12`` vs ``12.0``):
    ``calculator("37 * 12")`` and ``calculator("37*12")`` have the same key."""
    return call.name.strip().lower() + json.dumps(
        _norm_value(call.arguments), sort_keys=True, default=str
    )


def _key_fn(normalize: bool) -> Callable[[ToolCall], str]:
    return call_key if normalize else ToolCall.signature


class CallHistory:
    """The calls of one episode so far; :meth:`add` counts one turn's repeats. Environments keep
    one per episode, :func:`repeated_call_counts` replays a finished trajectory through one."""

    def __init__(self, *, normalize: bool = True):
        self._key = _key_fn(normalize)
        self._seen: set[str] = set()

    def add(self, calls: Iterable[ToolCall], results: Iterable[ToolResult] | None = None) -> int:
        """Record one turn's calls in order; return how many valid ones repeat an earlier call
        (of an earlier turn, or earlier in this one). Calls with ``error`` set are ignored.
        ``results``: the turn's tool results; a call whose execution failed (the tool raised or
        timed out) is forgotten, so calling it again is a retry, not a repeat (an invalid call's
        refusal, unknown tool or bad arguments, is remembered). A call without a result is
        remembered."""
        repeats, turn = 0, set()
        for call in calls:
            if call.error is not None:
                continue
            key = self._key(call)
            repeats += key in self._seen or key in turn
            turn.add(key)
        self._seen |= turn
        for r in results or ():
            if r.call.error is None and not r.ok and r.error_kind not in INVALID_CALL_KINDS:
                self._seen.discard(self._key(r.call))
        return repeats


def repeated_call_counts(turns: Iterable[Turn], *, normalize: bool = True) -> list[int]:
    """Per turn: valid calls whose key appeared earlier in the episode. ``normalize=False`` uses the
    exact ``ToolCall.signature()`` (diagnostics only; every consumer uses the default)."""
    history = CallHistory(normalize=normalize)
    return [history.add(t.tool_calls, t.tool_results) for t in turns]


def repeated_calls(traj: Trajectory, *, normalize: bool = True) -> int:
    """Valid tool calls of the episode that repeat an earlier call."""
    return sum(repeated_call_counts(traj.turns, normalize=normalize))


def has_loop(traj: Trajectory, *, normalize: bool = True) -> bool:
    """Some valid tool call repeats an earlier call of the episode."""
    return repeated_calls(traj, normalize=normalize) > 0


# -- answers and evidence -------------------------------------------------------------------------


def answer_turn(traj: Trajectory) -> int | None:
    """Index of the turn that gave the final answer: the first annotated ``Ann.ANSWERED``; failing
    that, the last turn of an ``ANSWERED`` episode if it made no tool call; else None."""
    for i, t in enumerate(traj.turns):
        if t.annotations.get(Ann.ANSWERED):
            return i
    if traj.turns and traj.end_reason == EndReason.ANSWERED and not traj.turns[-1].tool_calls:
        return len(traj.turns) - 1
    return None


def premature_turn(traj: Trajectory) -> int | None:
    """The answer turn when it answered before the evidence was complete
    (``Ann.EVIDENCE_COMPLETE is False`` on it), else None."""
    k = answer_turn(traj)
    if k is not None and traj.turns[k].annotations.get(Ann.EVIDENCE_COMPLETE) is False:
        return k
    return None


def is_premature(traj: Trajectory) -> bool:
    """Answered before the evidence the answer needs was gathered."""
    return premature_turn(traj) is not None


def evidence_gathered(traj: Trajectory) -> bool:
    """Some tool call succeeded before the answer turn (any turn when there is none)."""
    k = answer_turn(traj)
    turns = traj.turns if k is None else traj.turns[:k]
    return any(r.ok for t in turns for r in t.tool_results)


# -- tool-call arguments --------------------------------------------------------------------------


MAX_ARGUMENT_DEPTH = 32
"""Deepest nesting of tool-call arguments accepted (``{"a": [1]}`` has depth 2). Deeper arguments
are an error: real tools take shallow objects, and everything downstream (call keys, templates'
``tojson``, deep copies) recurses on them."""


def json_error(e: Exception) -> str:
    """A readable reason for a failed ``json.loads`` (any exception it may raise)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, ValueError) and "integer string conversion" in str(e):
        return "integer with too many digits"
    return f"{type(e).__name__}: {e}"


def nesting_depth(obj: Any, limit: int) -> int:
    """Nesting depth of lists/dicts in ``obj`` (a scalar has depth 0), iteratively and capped:
    stops at ``limit + 1`` as soon as that depth is reached (so cyclic objects terminate)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            children: Iterable[Any] = o.values()
        elif isinstance(o, list | tuple):
            children = o
        else:
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list | tuple))
    return deepest


def decode_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call ``arguments`` (a dict, or a JSON string holding an object, as OpenAI sends them)
    -> ``(arguments, None)``, or ``({}, reason)`` when they are not a JSON object, are nested deeper
    than :data:`MAX_ARGUMENT_DEPTH`, or cannot be decoded at all. An empty or blank string means
    ``{}``. Never raises."""
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        try:
            raw = json.loads(raw)
        except Exception as e:  # noqa: BLE001 - RecursionError, int digit limit, ...: all errors
            return {}, f'"arguments" is a string that is not JSON: {json_error(e)}'
    if not isinstance(raw, dict):
        return {}, f'"arguments" must be a JSON object, got {type(raw).__name__}'
    if nesting_depth(raw, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
        return {}, f'"arguments" are nested deeper than {MAX_ARGUMENT_DEPTH} levels'
    return raw, None
