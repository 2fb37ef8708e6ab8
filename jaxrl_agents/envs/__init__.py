"""Async tool environments: the ``Env`` base class, ``@tool`` and the built-in environments
(calculator, sql, research, travel, and ``mcp``: the tools of MCP servers).

``make_env("calculator")`` or ``make_env("my_pkg.envs.MyEnv", tool_timeout_s=5)`` builds one
episode's environment; ``ENVIRONMENTS`` maps registered names to classes and ``register_env``
adds user classes by name (Hydra configs may also point ``_target_`` at any class path).
``register_scripted`` gives an env class its scripted policies (``oracle``: the scripted solver
behind SFT's golden data; ``wrong``) and ``scripted_policies`` lists them
(``jaxrl_agents.envs.registry``).
"""

from __future__ import annotations

import importlib
from typing import Any

from jaxrl_agents.envs.base import REPEATED_CALLS, Env, EnvConfig
from jaxrl_agents.envs.calculator import CalculatorEnv
from jaxrl_agents.envs.mcp import McpEnv
from jaxrl_agents.envs.registry import register_scripted, scripted_policies, scripted_policy
from jaxrl_agents.envs.research import ResearchEnv
from jaxrl_agents.envs.sql import SqlEnv
from jaxrl_agents.envs.tools import Tool, ToolBox, ToolError, derive_tool, tool
from jaxrl_agents.envs.travel import TravelEnv

ENVIRONMENTS: dict[str, type[Env]] = {
    cls.name: cls for cls in (CalculatorEnv, SqlEnv, ResearchEnv, TravelEnv, McpEnv)
}


def register_env(cls: type[Env]) -> type[Env]:
    """Class decorator: make ``cls`` constructible by ``make_env(cls.name)``."""
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"register_env expects an Env subclass, got {cls!r}")
    if cls.name in ENVIRONMENTS and ENVIRONMENTS[cls.name] is not cls:
        raise ValueError(f"env name {cls.name!r} is already registered to {ENVIRONMENTS[cls.name]}")
    ENVIRONMENTS[cls.name] = cls
    return cls


def resolve_env_class(name_or_target: str) -> type[Env]:
    """A registered name (``"sql"``) or a class path (``"pkg.mod.Class"`` / ``"pkg.mod:Class"``)."""
    if name_or_target in ENVIRONMENTS:
        return ENVIRONMENTS[name_or_target]
    module, sep, attr = name_or_target.replace(":", ".").rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr) if sep else None
    except (ImportError, AttributeError, ValueError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ValueError(
            f"unknown environment {name_or_target!r}: use one of {sorted(ENVIRONMENTS)} "
            "or the import path of an Env subclass (e.g. 'my_pkg.envs.MyEnv')"
        )
    return cls


def make_env(name_or_target: str, **kw: Any) -> Env:
    """Build one episode's environment; ``kw`` go to the class (``EnvConfig`` fields included)."""
    return resolve_env_class(name_or_target)(**kw)


__all__ = [
    "ENVIRONMENTS",
    "REPEATED_CALLS",
    "CalculatorEnv",
    "Env",
    "EnvConfig",
    "McpEnv",
    "ResearchEnv",
    "SqlEnv",
    "Tool",
    "ToolBox",
    "ToolError",
    "TravelEnv",
    "derive_tool",
    "make_env",
    "register_env",
    "register_scripted",
    "resolve_env_class",
    "scripted_policies",
    "scripted_policy",
    "tool",
]
