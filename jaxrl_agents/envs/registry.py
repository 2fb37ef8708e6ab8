"""Scripted policies of environments, registered per env class.

A scripted policy factory takes a task (and keyword options) and returns a policy: a function
from the message history to the next assistant message. By name:

* ``oracle``: the scripted solver. SFT's golden data comes from it (``env.oracle`` holds its
  keyword arguments; a ``rng`` argument, if it takes one, gets a seeded generator) and
  ``jaxrl-eval policies=[scripted:oracle]`` runs it;
* ``wrong``: answers at once, wrongly (``scripted:wrong``);
* any other name a policy is registered under is ``scripted:<name>``.

The built-in environments register theirs when their package is imported. A user's env does the
same, as a call or a decorator::

    register_scripted(MyEnv, "oracle", oracle_policy)

    @register_scripted(MyEnv, "wrong")
    def wrong_policy(task): ...

A subclass inherits its bases' policies (the nearest class's wins). A class with nothing
registered under ``oracle`` / ``wrong`` may instead define an ``oracle_policy`` / ``wrong_policy``
attribute, or its module a function of that name.
"""

from __future__ import annotations

import re
import sys
import weakref
from collections.abc import Callable
from typing import Any

from jaxrl_agents.envs.base import Env

Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]
PolicyFactory = Callable[..., Policy]

CONVENTION = {"oracle": "oracle_policy", "wrong": "wrong_policy"}
"""Scripted policy names and the attribute / module function an unregistered env may define."""

_SCRIPTED: weakref.WeakKeyDictionary[type, dict[str, PolicyFactory]] = weakref.WeakKeyDictionary()


def register_scripted(env_cls: type[Env], name: str, fn: PolicyFactory | None = None) -> Any:
    """Register ``fn`` (``task, **kw -> policy``) as ``env_cls``'s scripted policy ``name``;
    without ``fn``, a decorator that registers the function it decorates. Returns ``fn``.
    Registering a name again replaces the earlier policy."""
    if not (isinstance(env_cls, type) and issubclass(env_cls, Env)):
        raise TypeError(f"register_scripted expects an Env subclass, got {env_cls!r}")
    if not name or "." in name:
        raise ValueError(f"scripted policy name {name!r}: a non-empty name without dots")

    def register(f: PolicyFactory) -> PolicyFactory:
        if not callable(f):
            raise TypeError(
                f"scripted policy {name!r} of {env_cls.__name__}: {f!r} is not callable"
            )
        _SCRIPTED.setdefault(env_cls, {})[name] = f
        return f

    return register if fn is None else register(fn)


TIMED_OUT = re.compile(r"Error: \S+ timed out after ")
"""How a tool result that passed its timeout reads (``envs.tools.ToolBox.execute``)."""


def retry_timed_out_calls(policy: Policy, max_retries: int = 2) -> Policy:
    """``policy`` (a scripted policy that reads its history by position: its turns, its tool
    results) with every tool call that timed out (:data:`TIMED_OUT`: on a loaded machine, a
    transient fault) issued again on its own, up to ``max_retries`` times, as an annotator would.
    The wrapped policy sees the history as if each call had succeeded the first time: the retry
    turns are left out and their results stand in the timed-out calls' places. Any other error
    (an unknown tool, bad arguments, a tool's own refusal) is the policy's to read, as is a call
    still timing out after its retries."""
    if max_retries < 0:
        raise ValueError(f"max_retries={max_retries}: expected >= 0")

    def wrapped(messages: list[dict[str, Any]]) -> dict[str, Any]:
        view: list[dict[str, Any]] = []
        failed: list[tuple[int, dict[str, Any], int]] = []  # (view index, call, tries so far)
        calls: list[tuple[dict[str, Any], int]] = []  # the open turn's calls, awaiting results
        retrying = False
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls") and failed:
                calls, retrying = [(c, tries) for _, c, tries in failed], True
                slots, failed = [i for i, _, _ in failed], []
                continue
            if m["role"] == "assistant":
                calls = [(c, 0) for c in m.get("tool_calls") or ()]
                retrying = False
            elif m["role"] == "tool" and calls:
                call, tries = calls.pop(0)
                if retrying:
                    i = slots.pop(0)
                    view[i] = {**m, "tool_call_id": view[i].get("tool_call_id")}
                else:
                    i = len(view)
                    view.append(m)
                if TIMED_OUT.match(str(m.get("content", ""))) and tries < max_retries:
                    failed.append((i, call, tries + 1))
                continue
            view.append(m)
        if failed and not calls:
            again = [{**c, "id": f"retry_{c.get('id', k)}"} for k, (_, c, _) in enumerate(failed)]
            return {"role": "assistant", "content": "", "tool_calls": again}
        return policy(view)

    return wrapped


def scripted_policies(env_cls: type) -> dict[str, PolicyFactory]:
    """Every scripted policy of ``env_cls`` by name, the nearest class in its MRO first: those
    registered for the class, then for ``oracle`` / ``wrong`` the ``oracle_policy`` /
    ``wrong_policy`` convention (an attribute the class defines, else a function of its
    module)."""
    found: dict[str, PolicyFactory] = {}
    for klass in env_cls.__mro__:
        for name, fn in _SCRIPTED.get(klass, {}).items():
            found.setdefault(name, fn)
        for name, attr in CONVENTION.items():
            if name in found:
                continue
            if attr in vars(klass):
                fn = getattr(klass, attr)
            else:
                fn = getattr(sys.modules.get(klass.__module__), attr, None)
            if fn is not None:
                found[name] = fn
    return found


def scripted_policy(env_cls: type, name: str) -> PolicyFactory:
    """``env_cls``'s scripted policy ``name``; ``ValueError`` naming the env and what it has."""
    found = scripted_policies(env_cls)
    if name not in found:
        have = ", ".join(sorted(found)) or "none"
        raise ValueError(
            f"{env_cls.__name__} has no scripted policy {name!r} (registered: {have}); register "
            f"one with jaxrl_agents.envs.register_scripted({env_cls.__name__}, {name!r}, fn)"
        )
    return found[name]
