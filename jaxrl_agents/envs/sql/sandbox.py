"""Read-only SQLite connections for the ``sql`` env's tools, safe against runaway queries.

A connection cannot write, by three independent layers: ``file:...?mode=ro`` URI,
``PRAGMA query_only=ON``, and an authorizer that allows only reads, functions and the read-only
schema pragmas (no ATTACH, no PRAGMA writes).

Runaway queries. A progress handler stops a statement at its tool call's deadline
(:func:`~jaxrl_agents.envs.workers.tool_deadline`) or when the env closes, so a huge cross join ends
with an ``interrupted`` error at the tool timeout. The string/blob length limit
(:data:`MAX_STRING_BYTES`) makes ``randomblob(1e9)``-style memory bombs fail at once with "string or
blob too big", and bounds ``instr``/``replace`` work. SQLite checks for interrupts only between VM
instructions, so a single function call cannot be stopped. The one found to run long whatever the
length limit, ``printf('%.*c', 2147483647, 'x')`` (~11 s on SQLite 3.40: it appends one character
at a time past the limit, then returns NULL), is refused up front by a checked ``printf`` /
``format`` that otherwise delegates to SQLite's own. Anything else that cannot be interrupted only
pins its tool worker thread: the episode gets its ``timeout`` error on time, and no connection is
ever waited on. Each connection is used by one thread at a time (:class:`ReadOnlyConnections`): a
call that finds the env's connection still held by an abandoned statement opens another, the
abandoned statement's thread closes its connection when it returns, and ``close()`` only
interrupts busy connections and closes the idle one, so it never blocks the event loop.
"""

from __future__ import annotations

import contextlib
import math
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jaxrl_agents.envs.tools import ToolError

MAX_STRING_BYTES = 100_000
"""``SQLITE_LIMIT_LENGTH`` of the env's connections: no string, blob or row may be longer (results
are shown capped at ``tool_output_max_chars`` anyway)."""
MAX_LIKE_PATTERN = 1_000
"""``SQLITE_LIMIT_LIKE_PATTERN_LENGTH`` of the env's connections."""
PROGRESS_OPS = 1_000
"""VM instructions between two checks of the deadline."""
_READ_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"}
_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}


def _authorizer(action: int, arg1: Any, arg2: Any, db: Any, trigger: Any) -> int:
    if action in _ALLOWED:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and str(arg1).lower() in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot modify ``path`` (see module docstring for the three layers), with
    the length limits and the checked ``printf``/``format``."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_STRING_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
    for name in ("printf", "format"):
        conn.create_function(name, -1, _checked_printf, deterministic=True)
    conn.set_authorizer(_authorizer)
    return conn


# -- printf without the uninterruptible repeat -----------------------------------------------------

# A ``%c`` conversion, flags/width/precision included (SQLite reads these chars in any order).
# ``%%`` is not skipped: a literal "%%.*c" is refused too, which only errs on the safe side.
_CHAR_SPEC = re.compile(r"%[-+ #!0,0-9.*l]*c")
_INT_PREFIX = re.compile(r"\s*([+-]?\d{1,25})")
_FLOAT_PREFIX = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,5})?)")
_printf_local = threading.local()  # per worker thread: a helper connection, the last refusal


def _int32_magnitudes(value: Any) -> list[int]:
    """Every |precision| SQLite could read from ``value`` as a ``*`` argument (int64, then cast to
    a C int), taking each plausible conversion of text so that none is missed."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    ints: list[int] = []
    if isinstance(value, int):
        ints = [value]
    elif isinstance(value, float):
        ints = [int(value)] if math.isfinite(value) else [2**63 - 1]
    elif isinstance(value, str):
        if m := _INT_PREFIX.match(value):
            ints.append(int(m.group(1)))
        if m := _FLOAT_PREFIX.match(value):
            f = float(m.group(1))
            ints.append(int(f) if math.isfinite(f) else 2**63 - 1)
        if re.match(r"\s*[+-]?\d{26}", value):
            ints.append(2**63 - 1)
    out = []
    for v in ints:
        v = max(-(2**63), min(2**63 - 1, v))
        v = (v + 2**31) % 2**32 - 2**31  # (int) cast
        out.append(abs(v))
    return out


def _printf_refusal(fmt: Any, args: tuple[Any, ...]) -> str | None:
    """Why ``printf(fmt, *args)`` is refused: a ``%c`` whose precision exceeds the length limit
    (SQLite repeats the character one append at a time, uninterruptibly)."""
    if not isinstance(fmt, str | bytes):
        return None
    text = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else fmt
    for m in _CHAR_SPEC.finditer(text):
        spec = m.group(0)
        if "." not in spec:  # a width is padded in one step; only precision repeats
            continue
        for digits in re.findall(r"\d+", spec):
            if len(digits) > 20 or (int(digits) % 2**32) & 0x7FFFFFFF > MAX_STRING_BYTES:
                return f"printf: {spec!r} repeats a character more than {MAX_STRING_BYTES} times"
        if "*" in spec and any(n > MAX_STRING_BYTES for a in args for n in _int32_magnitudes(a)):
            return f"printf: {spec!r} repeats a character more than {MAX_STRING_BYTES} times"
    return None


def _checked_printf(*args: Any) -> Any:
    """SQLite's ``printf``/``format``, refusing only a ``%c`` precision above the length limit."""
    if args and (reason := _printf_refusal(args[0], args[1:])):
        _printf_local.refused = reason
        raise ValueError(reason)
    helper = getattr(_printf_local, "conn", None)
    if helper is None:
        helper = _printf_local.conn = sqlite3.connect(":memory:")
        helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_STRING_BYTES)
    sql = "SELECT printf(" + ",".join("?" * len(args)) + ")"
    return helper.execute(sql, args).fetchone()[0]


class ReadOnlyConnections:
    """One env's read-only connections to ``path``; each is used by one thread at a time and no
    thread ever waits on one.

    :meth:`use` (on a tool's worker thread) takes the idle connection, or opens a new one when
    there is none (the last one is still held by an abandoned statement), and gives it back
    afterwards; a connection given back when one is already idle, or after :meth:`close`, is
    closed by that thread. :meth:`close` interrupts the busy connections (their threads close them
    when their statements return) and closes the idle one, which no thread holds: it never blocks.
    """

    def __init__(self, path: Path, connect: Callable[[Path], sqlite3.Connection]):
        self.path = path
        self._connect = connect
        self._lock = threading.Lock()
        self._idle: sqlite3.Connection | None = None
        self._busy: set[sqlite3.Connection] = set()
        self.closed = False

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._busy) + (self._idle is not None)

    @contextlib.contextmanager
    def use(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self.closed:
                raise ToolError("the environment is closed")
            conn, self._idle = self._idle, None
        if conn is None:
            conn = self._connect(self.path)
        with self._lock:
            closed = self.closed
            if not closed:
                self._busy.add(conn)
        if closed:
            conn.close()
            raise ToolError("the environment is closed")
        try:
            yield conn
        finally:
            with self._lock:
                self._busy.discard(conn)
                keep = not self.closed and self._idle is None
                if keep:
                    self._idle = conn
            if not keep:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, None
            for conn in self._busy:
                conn.interrupt()  # sqlite3_interrupt: takes no lock, safe from any thread
        if idle is not None:
            idle.close()
