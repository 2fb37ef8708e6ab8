"""Tools: plain Python functions with a JSON schema derived from their signature, executed safely.

``@tool`` turns a sync or async function (or an ``Env`` method) into a tool whose OpenAI
function-calling schema comes from the type hints (``str int float bool``, ``Literal[...]``,
``list[...]``, ``X | None``, defaults) and the Google-style docstring (summary = description,
``Args:`` = parameter descriptions). :class:`ToolBox` executes :class:`~jaxrl_agents.types.ToolCall`
objects and never raises: every failure becomes a :class:`~jaxrl_agents.types.ToolResult` whose
``content`` is an ``Error: ...`` message the model reads and whose ``error_kind`` says why.

Sync tools run in one bounded, process-wide worker pool (:func:`tool_pool`; ``max_workers``
from :func:`set_tool_threads`, else ``$JAXRL_AGENTS_TOOL_THREADS``, else
:data:`DEFAULT_TOOL_THREADS`), awaited with the call's timeout, so they never block the event loop
and the thread count stays bounded. A sync call that outlives its timeout is abandoned: the episode
gets the ``timeout`` tool error at once, while the call keeps its worker until it returns (a Python
thread cannot be killed). So a tool that can hang must bound its own work: hung calls pin workers,
and once all are pinned later sync calls wait in the queue and time out (calls still queued at
their timeout are cancelled, never run). The workers are daemon threads (unlike
``ThreadPoolExecutor``'s, which interpreter exit joins), so a hung call cannot block exit. A
CPU-heavy pure-Python tool still holds the GIL: bound its work (the calculator bounds powers).
:func:`tool_deadline` tells a running tool when its call times out (the SQL env stops its query
there).

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
import concurrent.futures
import contextvars
import dataclasses
import inspect
import json
import os
import queue
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal

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
    """Check ``args`` against an object schema of the subset :func:`derive_tool` generates.

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
        None: lambda v: True,
    }[kind]
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not ok(value):
        raise ArgumentError(f"{path!r} must be {kind}, got {type(value).__name__} {value!r:.40}")
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(f"{path!r} must be one of {schema['enum']}, got {value!r}")
    if kind == "array" and schema.get("items"):
        value = [_check(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
    return value


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


DEFAULT_TOOL_THREADS = 32
"""Default size of the sync-tool worker pool."""


class WorkerPool(concurrent.futures.Executor):
    """A bounded pool of daemon worker threads, started lazily (at most ``max_workers``).

    Like ``ThreadPoolExecutor`` (idle workers are reused before a new one starts), except that the
    workers are daemon threads that interpreter exit does not join: an abandoned hung call must not
    block exit. ``shutdown`` lets each worker finish its current call and exit.
    """

    def __init__(self, max_workers: int, *, name: str = "tool"):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a WorkerPool after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                t = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():  # False: cancelled while queued
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - delivered to the awaiting coroutine
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()

    @property
    def threads(self) -> int:
        """Worker threads started so far (never more than ``max_workers``)."""
        return len(self._threads)


_pool: WorkerPool | None = None
_pool_size: int | None = None
_pool_lock = threading.Lock()


def set_tool_threads(n: int) -> None:
    """Size of the sync-tool pool. A running pool of another size is replaced: its workers finish
    their current calls and exit, later calls go to a new pool of ``n`` workers."""
    global _pool, _pool_size
    if n < 1:
        raise ValueError(f"tool threads must be >= 1, got {n}")
    with _pool_lock:
        old = _pool if _pool is not None and _pool.max_workers != n else None
        if old is not None:
            _pool = None
        _pool_size = n
    if old is not None:
        old.shutdown(wait=False)


def tool_pool() -> WorkerPool:
    """The process-wide pool sync tools run in, created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            n = _pool_size or int(os.environ.get("JAXRL_AGENTS_TOOL_THREADS") or 0)
            _pool = WorkerPool(n or DEFAULT_TOOL_THREADS, name="tool")
        return _pool


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "jaxrl_tool_deadline", default=None
)


def tool_deadline() -> float | None:
    """``time.monotonic()`` at which the tool call running in this context times out (``None``
    outside a :meth:`ToolBox.execute`). Sync tools see it on their worker thread too."""
    return _DEADLINE.get()


async def _run_in_pool(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()  # carries the deadline to the worker thread
    return await loop.run_in_executor(tool_pool(), lambda: ctx.run(fn, **kwargs))


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

        if call.error is not None:
            return fail(ToolErrorKind.MALFORMED, f"could not parse tool call: {call.error}")
        t = self.tools.get(call.name)
        if t is None:
            avail = ", ".join(self.tools) or "none"
            return fail(
                ToolErrorKind.UNKNOWN_TOOL, f"unknown tool {call.name!r}. Available: {avail}"
            )
        try:
            args = validate_arguments(t.parameters, call.arguments)
        except ArgumentError as e:
            return fail(ToolErrorKind.BAD_ARGUMENTS, f"bad arguments for {t.name}: {e}")
        token = _DEADLINE.set(time.monotonic() + timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                if t.is_async:
                    out = await t.fn(**args)
                else:
                    out = await _run_in_pool(t.fn, args)
        except TimeoutError:
            return fail(ToolErrorKind.TIMEOUT, f"{t.name} timed out after {timeout_s:g} s")
        except ToolError as e:
            return fail(ToolErrorKind.TOOL_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - a failing tool is a message, not a crash
            return fail(ToolErrorKind.TOOL_ERROR, f"{t.name} failed: {type(e).__name__}: {e}")
        finally:
            _DEADLINE.reset(token)
        return ToolResult(
            call, truncate(_format_output(out), max_chars), None, time.perf_counter() - t0
        )
