"""Tools: plain Python functions with a JSON schema derived from their signature, executed safely.

``@tool`` turns a sync or async function (or an ``Env`` method) into a tool whose OpenAI
function-calling schema comes from the type hints (``str int float bool``, ``Literal[...]``,
``list[...]``, ``X | None``, defaults) and the Google-style docstring (summary = description,
``Args:`` = parameter descriptions). :class:`ToolBox` executes :class:`~jaxrl_agents.types.ToolCall`
objects and never raises: every failure becomes a :class:`~jaxrl_agents.types.ToolResult` whose
``content`` is an ``Error: ...`` message the model reads and whose ``error_kind`` says why.

Sync tools run in the bounded, process-wide worker pool of :mod:`jaxrl_agents.envs.workers`,
awaited with the call's timeout; :func:`~jaxrl_agents.envs.workers.tool_deadline` tells a running
tool when its call times out (the SQL env stops its query there).

    from jaxrl_agents.envs.tools import tool, ToolBox

    @tool
    def add(a: int, b: int = 1) -> int:
        '''Add two numbers.

        Args:
            a: first addend.
            b: second addend.
        '''
        return a + b

    box = ToolBox([add]);  box.schemas()  # -> [{"type": "function", "function": {...}}]
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from jaxrl_agents.envs.workers import (
    DEADLINE,
    DEFAULT_TOOL_THREADS,
    run_in_pool,
    set_tool_threads,
    tool_deadline,
)
from jaxrl_agents.types import ToolCall, ToolErrorKind, ToolResult

_TOOL_ATTR = "__jaxrl_tool__"
_PRIMITIVES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTIONS = (
    "args:",
    "arguments:",
    "returns:",
    "return:",
    "raises:",
    "yields:",
    "example:",
    "examples:",
    "note:",
    "notes:",
)


class ToolError(Exception):
    """Raise inside a tool to show the model ``Error: <message>`` (no exception type prefix)."""


class ArgumentError(ValueError):
    """Arguments do not match a tool's schema."""


class InvalidCall(ValueError):
    """A tool call that is the policy's fault before anything runs (``kind``: malformed, unknown
    tool or bad arguments); ``message`` is what the model is shown after ``Error: ``."""

    def __init__(self, kind: ToolErrorKind, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable plus its OpenAI function schema. ``fn`` is bound (methods via :meth:`bind`)."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    is_async: bool

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def bind(self, obj: Any) -> Tool:
        return dataclasses.replace(self, fn=self.fn.__get__(obj, type(obj)))


# -- schema derivation ---------------------------------------------------------------------------


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Declare a tool. Use bare (``@tool``) or with overrides (``@tool(name="search")``).

    The function is returned unchanged (methods stay methods); its :class:`Tool` is attached and
    found by :class:`ToolBox` and by ``Env`` subclasses. Schema errors raise at decoration time.
    """

    def wrap(f: Callable) -> Callable:
        setattr(f, _TOOL_ATTR, derive_tool(f, name=name, description=description))
        return f

    return wrap(fn) if fn is not None else wrap


def derive_tool(fn: Callable, *, name: str | None = None, description: str | None = None) -> Tool:
    """Build the :class:`Tool` of ``fn`` (a leading ``self``/``cls`` parameter is skipped)."""
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", tool_name):
        raise ValueError(f"tool name {tool_name!r} must match [A-Za-z_][A-Za-z0-9_-]{{0,63}}")
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args/**kwargs ({p.name}) have no JSON schema")
        if p.name not in hints:
            raise TypeError(f"tool {tool_name!r}: parameter {p.name!r} needs a type hint")
        try:
            prop, nullable = _type_schema(hints[p.name])
        except TypeError as e:
            raise TypeError(f"tool {tool_name!r}, parameter {p.name!r}: {e}") from None
        if nullable:
            prop["type"] = [prop["type"], "null"]
        if p.name in arg_docs:
            prop["description"] = arg_docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        elif p.default is not None:
            prop["default"] = p.default
        props[p.name] = prop
    parameters = {"type": "object", "properties": props, "required": required}
    return Tool(
        name=tool_name,
        description=description or summary,
        parameters=parameters,
        fn=fn,
        is_async=inspect.iscoroutinefunction(fn),
    )


def _type_schema(tp: Any) -> tuple[dict[str, Any], bool]:
    """JSON schema of a type hint and whether it admits ``None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unions other than `X | None` are not supported: {tp}")
        return _type_schema(rest[0])[0], len(rest) < len(args)
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}, False
    if origin is Literal:
        kinds = {_PRIMITIVES.get(type(a)) for a in args}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"Literal values must share one of str/int/float/bool: {tp}")
        return {"type": kinds.pop(), "enum": list(args)}, False
    if origin is list or tp is list:
        return {"type": "array", "items": _type_schema(args[0])[0] if args else {}}, False
    if origin is dict or tp is dict:
        return {"type": "object"}, False
    raise TypeError(
        f"unsupported type {tp!r}; use str, int, float, bool, Literal, list, dict, X|None"
    )


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Google-style docstring -> (description before the first section, {param: description})."""
    lines = doc.expandtabs().splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section, base_indent, current = None, None, None
    for line in lines:
        stripped = line.strip()
        if stripped.lower() in _SECTIONS:
            section, base_indent, current = stripped.lower(), None, None
            continue
        if section is None:
            desc.append(stripped)
            continue
        if section not in ("args:", "arguments:") or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent is None:
            base_indent = indent
        m = re.match(r"^\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
        if indent <= base_indent and m:
            current = m.group(1)
            args[current] = m.group(3).strip()
        elif current is not None:
            args[current] = (args[current] + " " + stripped).strip()
    summary = " ".join(" ".join(desc).split())
    return summary, args


# -- argument validation -------------------------------------------------------------------------


def validate_arguments(parameters: dict[str, Any], args: Any) -> dict[str, Any]:
    """Check ``args`` against an object schema of the subset :func:`derive_tool` generates
    (top-level names, required ones, and each value's JSON type, enum and list items). Keywords
    beyond the subset (``anyOf``, nested properties, formats) pass here, for the tool to check.

    Returns the arguments with JSON-integral floats for ``integer`` params converted to ``int``.
    Raises :class:`ArgumentError` naming the offending parameter and what would be valid.
    """
    if not isinstance(args, dict):
        raise ArgumentError(f"arguments must be a JSON object, got {type(args).__name__}")
    props = parameters.get("properties", {})
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise ArgumentError(f"unknown argument(s) {unknown}; expected {sorted(props) or 'none'}")
    missing = [k for k in parameters.get("required", []) if k not in args]
    if missing:
        raise ArgumentError(f"missing required argument(s) {missing}")
    return {k: _check(v, props[k], k) for k, v in args.items()}


def _check(value: Any, schema: dict[str, Any], path: str) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):  # ``[T, "null"]`` from an ``X | None`` hint
        if value is None:
            return None
        kind = kind[0]
    ok = {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }.get(kind, lambda v: True)  # no type, or one beyond this subset (an MCP server's schema)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not ok(value):
        raise ArgumentError(f"{path!r} must be {kind}, got {type(value).__name__} {value!r:.40}")
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(f"{path!r} must be one of {schema['enum']}, got {value!r}")
    if kind == "array" and schema.get("items"):
        value = [_check(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def check_call(call: ToolCall, parameters: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """``call``'s validated arguments (:func:`validate_arguments`) against the object schemas of
    the tools on offer (``parameters``: name -> its ``parameters`` schema); :class:`InvalidCall`
    for a call that could not be parsed, names no tool on offer or has bad arguments. The one
    check of both the built-in tools (:class:`ToolBox`) and an agent's own (the server)."""
    if call.error is not None:
        raise InvalidCall(ToolErrorKind.MALFORMED, f"could not parse tool call: {call.error}")
    if call.name not in parameters:
        avail = ", ".join(parameters) or "none"
        raise InvalidCall(
            ToolErrorKind.UNKNOWN_TOOL, f"unknown tool {call.name!r}. Available: {avail}"
        )
    try:
        return validate_arguments(parameters[call.name], call.arguments)
    except ArgumentError as e:
        raise InvalidCall(ToolErrorKind.BAD_ARGUMENTS, f"bad arguments for {call.name}: {e}") from e


def invalid_call_results(
    calls: Iterable[ToolCall], parameters: Mapping[str, dict[str, Any]]
) -> list[ToolResult]:
    """A tool error of its kind (``Error: <why>``) for each of ``calls`` that
    :func:`check_call` rejects against ``parameters``: how a call that never runs is recorded."""
    out = []
    for call in calls:
        try:
            check_call(call, parameters)
        except InvalidCall as e:
            out.append(ToolResult(call, "Error: " + e.message, e.kind))
    return out


# -- execution -----------------------------------------------------------------------------------


def _format_output(out: Any) -> str:
    if out is None:
        return ""
    if isinstance(out, str):
        return out
    try:
        return json.dumps(out, default=str)
    except (TypeError, ValueError):
        return str(out)


def truncate(text: str, max_chars: int) -> str:
    """Cap ``text`` at ``max_chars`` characters, marking how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n...[truncated {len(text) - max_chars} chars]"


class ToolBox:
    """A name -> :class:`Tool` table that executes calls (``await box.execute(call, ...)``)."""

    def __init__(self, tools: Iterable[Tool | Callable] = ()):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            t = t if isinstance(t, Tool) else getattr(t, _TOOL_ATTR, None) or derive_tool(t)
            if t.name in self.tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self.tools[t.name] = t

    @classmethod
    def from_object(cls, obj: Any, extra: Iterable[Tool | Callable] = ()) -> ToolBox:
        """Tools declared with ``@tool`` on ``obj``'s class (bound to ``obj``), plus ``extra``."""
        found = []
        for klass in reversed(type(obj).__mro__):
            for attr, value in vars(klass).items():
                spec = getattr(value, _TOOL_ATTR, None)
                if spec is not None:
                    found = [t for t in found if t[0] != attr] + [(attr, spec.bind(obj))]
        return cls([t for _, t in found] + list(extra))

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    async def execute(self, call: ToolCall, *, timeout_s: float, max_chars: int) -> ToolResult:
        """Run one call; failures come back as results (``error_kind`` set), never exceptions."""
        t0 = time.perf_counter()

        def fail(kind: ToolErrorKind, message: str) -> ToolResult:
            content = truncate("Error: " + message, max_chars)
            return ToolResult(call, content, kind, time.perf_counter() - t0)

        try:
            args = check_call(call, {name: t.parameters for name, t in self.tools.items()})
        except InvalidCall as e:
            return fail(e.kind, e.message)
        t = self.tools[call.name]
        token = DEADLINE.set(time.monotonic() + timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                if t.is_async:
                    out = await t.fn(**args)
                else:
                    out = await run_in_pool(t.fn, args)
        except TimeoutError:
            return fail(ToolErrorKind.TIMEOUT, f"{t.name} timed out after {timeout_s:g} s")
        except ToolError as e:
            return fail(ToolErrorKind.TOOL_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - a failing tool is a message, not a crash
            return fail(ToolErrorKind.TOOL_ERROR, f"{t.name} failed: {type(e).__name__}: {e}")
        finally:
            DEADLINE.reset(token)
        return ToolResult(
            call, truncate(_format_output(out), max_chars), None, time.perf_counter() - t0
        )


__all__ = [
    "DEFAULT_TOOL_THREADS",
    "ArgumentError",
    "InvalidCall",
    "Tool",
    "ToolBox",
    "ToolError",
    "check_call",
    "derive_tool",
    "invalid_call_results",
    "parse_docstring",
    "set_tool_threads",
    "tool",
    "tool_deadline",
    "truncate",
    "validate_arguments",
]
