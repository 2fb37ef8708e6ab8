"""``sql``: data questions over a real SQLite shop database, answered with read-only SQL.

The database (``customers``, ``products``, ``orders``; deterministic in ``db_seed``) is written once
per process per seed to ``$JAXRL_AGENTS_CACHE/sql`` (default ``~/.cache/jaxrl_agents/sql``), via a
temp file and an atomic rename, then chmod 0444. Each question's ground truth is computed from that
data when the task is made (``tests/envs/test_env_sql.py`` recomputes it with plain Python loops).

Tools: ``list_tables()``, ``describe_table(name)``, ``run_sql(query)``. The connection cannot write,
by three independent layers: ``file:...?mode=ro`` URI, ``PRAGMA query_only=ON``, and an authorizer
that allows only reads, functions and the read-only schema pragmas (no ATTACH, no PRAGMA writes).
Results are capped at ``max_rows`` rows.

Runaway queries. A progress handler stops a statement at its tool call's deadline
(:func:`~jaxrl_agents.envs.tools.tool_deadline`) or when the env closes, so a huge cross join ends
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

Required step ``query_answer``: a successful ``run_sql`` whose result has the answer in a cell.
Verdict: numbers within 0.01 (2-decimal questions) or exactly; names must be mentioned and no
other name of the same table may be (listing every customer does not pass).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import math
import os
import random
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.envs.base import (
    Env,
    EnvConfig,
    check_kinds,
    check_split,
    last_number,
    mentions,
    split_of,
)
from jaxrl_agents.envs.tools import ToolError, tool, tool_deadline
from jaxrl_agents.types import Ann, Message, Task, ToolCallDict, Verdict

SCHEMA_VERSION = 1
CITIES = ("Avalon", "Brixton", "Corvel", "Dunmore", "Elston", "Fairhaven")
CATEGORIES = ("books", "garden", "kitchen", "toys", "sports")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_FIRST = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena")
_LAST = ("Stone", "Reyes", "Okafor", "Lind", "Moreau", "Tanaka", "Novak", "Quinn", "Hale", "Park")
_ADJ = ("Classic", "Compact", "Deluxe", "Eco", "Pro", "Smart")
_NOUN = {
    "books": ("Atlas", "Novel", "Cookbook"),
    "garden": ("Hose", "Rake", "Planter"),
    "kitchen": ("Kettle", "Blender", "Skillet"),
    "toys": ("Robot", "Puzzle", "Kite"),
    "sports": ("Racket", "Helmet", "Ball"),
}
_DDL = """
CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
                        signup_year INTEGER NOT NULL);
CREATE TABLE products (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       price REAL NOT NULL);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY,
                     customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
                     product_id INTEGER NOT NULL REFERENCES products(product_id),
                     quantity INTEGER NOT NULL, order_date TEXT NOT NULL);
"""
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


# -- the database --------------------------------------------------------------------------------


def generate_rows(db_seed: int) -> dict[str, list[tuple]]:
    """The database content: ``{table: rows}``, a pure function of ``db_seed``."""
    rng = random.Random(f"sql-db/{db_seed}")
    names = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], 60)
    customers = [
        (i + 1, n, rng.choice(CITIES), rng.randint(2018, 2023)) for i, n in enumerate(names)
    ]
    pnames = rng.sample([(f"{a} {n}", c) for c in CATEGORIES for n in _NOUN[c] for a in _ADJ], 30)
    products = [(i + 1, n, c, round(rng.uniform(3, 250), 2)) for i, (n, c) in enumerate(pnames)]
    orders = []
    for i in range(600):
        month, day = rng.randint(1, 12), rng.randint(1, 28)
        orders.append(
            (
                i + 1,
                rng.randint(1, 60),
                rng.randint(1, 30),
                rng.randint(1, 5),
                f"2023-{month:02d}-{day:02d}",
            )
        )
    return {"customers": customers, "products": products, "orders": orders}


_built: dict[int, Path] = {}
_build_lock = threading.Lock()


def cache_dir() -> Path:
    root = os.environ.get("JAXRL_AGENTS_CACHE") or Path.home() / ".cache" / "jaxrl_agents"
    return Path(root) / "sql"


def database_path(db_seed: int = 0) -> Path:
    """Path of the seed's database file, writing it on the first call in this process."""
    with _build_lock:
        if db_seed in _built:
            return _built[db_seed]
        out = cache_dir()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"shop-v{SCHEMA_VERSION}-seed{db_seed}.sqlite"
        fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
        os.close(fd)
        try:
            conn = sqlite3.connect(tmp)
            conn.executescript(_DDL)
            for table, rows in generate_rows(db_seed).items():
                conn.executemany(
                    f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows
                )
            conn.commit()
            conn.close()
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)  # atomic: concurrent processes never see a partial file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _built[db_seed] = path
        return path


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


# -- questions -----------------------------------------------------------------------------------

# (kind, question template, SQL with :params, answer type)
_QUESTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "city_orders",
        "How many orders were placed by customers from {city}?",
        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id "
        "WHERE c.city = :city",
        "int",
    ),
    (
        "city_month_orders",
        "How many orders did customers from {city} place in {month} 2023?",
        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id "
        "WHERE c.city = :city AND strftime('%m', o.order_date) = :mm",
        "int",
    ),
    (
        "category_revenue",
        "What was the total revenue (quantity times price) from {category} products? "
        "Round to 2 decimals.",
        "SELECT ROUND(SUM(o.quantity * p.price), 2) FROM orders o JOIN products p "
        "ON p.product_id = o.product_id WHERE p.category = :category",
        "float",
    ),
    (
        "category_avg_price",
        "What is the average price of products in the {category} category? Round to 2 decimals.",
        "SELECT ROUND(AVG(price), 2) FROM products WHERE category = :category",
        "float",
    ),
    (
        "product_buyers",
        "How many different customers bought the product '{product}'?",
        "SELECT COUNT(DISTINCT o.customer_id) FROM orders o JOIN products p "
        "ON p.product_id = o.product_id WHERE p.name = :product",
        "int",
    ),
    (
        "month_top_customer",
        "Which customer placed the most orders in {month} 2023?",
        "SELECT c.name, COUNT(*) AS n FROM orders o "
        "JOIN customers c ON c.customer_id = o.customer_id "
        "WHERE strftime('%m', o.order_date) = :mm GROUP BY c.customer_id ORDER BY n DESC LIMIT 2",
        "customers",
    ),
    (
        "city_top_product",
        "Which product sold the largest total quantity to customers in {city}?",
        "SELECT p.name, SUM(o.quantity) AS q FROM orders o JOIN customers c "
        "ON c.customer_id = o.customer_id JOIN products p ON p.product_id = o.product_id "
        "WHERE c.city = :city GROUP BY p.product_id ORDER BY q DESC LIMIT 2",
        "products",
    ),
)


# Opt-in kinds (``make_tasks(kinds=[...])`` only, not in the default mix): variants for a small
# policy. ``city_ym_orders`` is ``city_month_orders`` with the month as the number the SQL needs
# (``2023-09``), so the query is filled by copying from the question, not by a lookup; its 72
# questions are few enough to memorize. ``city_range_orders`` draws a date range per question
# (RANGE_QUESTIONS of them), so only copying the dates answers the held-out ones.
_EXTRA_QUESTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "city_ym_orders",
        "How many orders did customers from {city} place in 2023-{mm}?",
        _QUESTIONS[1][2],
        "int",
    ),
    (
        "city_range_orders",
        "How many orders did customers from {city} place between {d1} and {d2}?",
        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.customer_id = o.customer_id "
        "WHERE c.city = :city AND o.order_date BETWEEN :d1 AND :d2",
        "int",
    ),
)
RANGE_QUESTIONS = 5000
"""``city_range_orders`` draws this many (city, date range) questions per ``db_seed``, too many
to memorize, so a policy that answers held-out ones must copy the dates into its query."""
DEFAULT_KINDS: tuple[str, ...] = tuple(q[0] for q in _QUESTIONS)
QUESTION_KINDS: tuple[str, ...] = DEFAULT_KINDS + tuple(q[0] for q in _EXTRA_QUESTIONS)


def _date_ranges(db_seed: int, n: int) -> list[tuple[str, str]]:
    """``n`` (start, end) date pairs in 2023, start <= end (deterministic in ``db_seed``)."""
    rng = random.Random(f"sql-ranges/{db_seed}")
    out = []
    for _ in range(n):
        a, b = sorted((rng.randint(1, 12), rng.randint(1, 28)) for _ in range(2))
        out.append((f"2023-{a[0]:02d}-{a[1]:02d}", f"2023-{b[0]:02d}-{b[1]:02d}"))
    return out


@functools.lru_cache(maxsize=8)
def _question_pool(db_seed: int, kinds: tuple[str, ...] = DEFAULT_KINDS) -> list[dict[str, Any]]:
    """Every question of ``kinds`` with its ground truth; ambiguous argmax questions (ties) are
    dropped."""
    products = [r[1] for r in generate_rows(db_seed)["products"]]
    conn = connect_readonly(database_path(db_seed))
    pool = []
    try:
        for kind, text, sql, answer_type in _QUESTIONS + _EXTRA_QUESTIONS:
            if kind not in kinds:
                continue
            fields = set(re.findall(r"{(\w+)}", text))
            grid: list[dict[str, Any]] = [{}]
            if "city" in fields:
                grid = [{**g, "city": c} for g in grid for c in CITIES]
            if fields & {"month", "mm"}:
                grid = [
                    {**g, "month": m, "mm": f"{i + 1:02d}"}
                    for g in grid
                    for i, m in enumerate(MONTHS)
                ]
            if "category" in fields:
                grid = [{**g, "category": c} for g in grid for c in CATEGORIES]
            if "product" in fields:
                grid = [{**g, "product": p} for g in grid for p in products]
            if "d1" in fields:  # sampled, not gridded: one range per question
                ranges = _date_ranges(db_seed, RANGE_QUESTIONS)
                grid = [
                    {**grid[i % len(grid)], "d1": a, "d2": b} for i, (a, b) in enumerate(ranges)
                ]
            for params in grid:
                rows = conn.execute(sql, params).fetchall()
                if answer_type in ("customers", "products"):
                    if not rows or (len(rows) > 1 and rows[0][1] == rows[1][1]):
                        continue
                answer = rows[0][0]
                if answer is None:
                    continue
                literal = sql
                for k, v in params.items():
                    literal = literal.replace(f":{k}", f"'{v}'")
                pool.append(
                    {
                        "key": f"sql/{db_seed}/{kind}/"
                        + "/".join(f"{params[k]}" for k in sorted(params)),
                        "question": text.format(**params),
                        "sql": literal,
                        "answer": answer,
                        "answer_type": answer_type,
                        "db_seed": db_seed,
                        "required_steps": ["query_answer"],
                    }
                )
    finally:
        conn.close()
    return pool


@functools.lru_cache(maxsize=8)
def _names(db_seed: int, table: str) -> tuple[str, ...]:
    """The ``name`` column of ``customers``/``products`` (from the generating rows, not the
    connection, so judging never touches a connection a runaway statement may hold)."""
    return tuple(r[1] for r in generate_rows(db_seed)[table])


def _cells(output: str) -> list[str]:
    return [c.strip() for line in output.splitlines() for c in line.split("|")]


# -- environment ---------------------------------------------------------------------------------


class SqlEnv(Env):
    """Answer questions about the shop database with SQL; success iff the answer matches."""

    name = "sql"

    def __init__(self, *, max_rows: int = 20, config: EnvConfig | None = None, **env_kwargs: Any):
        super().__init__(config=config, **env_kwargs)
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._db: ReadOnlyConnections | None = None
        self._db_seed: int | None = None
        self._inspected: set[str] = set()  # tables listed/described (state_digest)

    @classmethod
    def make_tasks(
        cls,
        split: str,
        n: int,
        *,
        seed: int = 0,
        db_seed: int = 0,
        heldout_frac: float = 0.2,
        kinds: Sequence[str] | None = None,
    ) -> list[Task]:
        """``n`` questions of ``split``, round-robin over question kinds (``seed``-shuffled);
        questions repeat once ``n`` exceeds the split's pool (about 130 questions in all).
        ``kinds``: only these question kinds (``QUESTION_KINDS``; default ``DEFAULT_KINDS``, all
        but the opt-in ``city_ym_orders`` and ``city_range_orders``)."""
        check_split(split)
        check_kinds("kinds", kinds, QUESTION_KINDS, allow_empty=False)
        pool = [
            dict(q)
            for q in _question_pool(db_seed, DEFAULT_KINDS if kinds is None else tuple(kinds))
            if split_of(q["key"], heldout_frac=heldout_frac) == split
        ]
        if not pool:
            raise ValueError(
                f"split {split!r} has no questions for heldout_frac={heldout_frac}"
                + (f" and kinds={list(kinds)}" if kinds is not None else "")
            )
        # Round-robin over question kinds (72 of the ~130 are per-city-per-month counts).
        rng = random.Random(f"sql/{seed}/{split}")
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for q in pool:
            by_kind.setdefault(q["key"].split("/")[2], []).append(q)
        for qs in by_kind.values():
            rng.shuffle(qs)
        kinds = sorted(by_kind)
        rng.shuffle(kinds)
        pool = [
            by_kind[k][i // len(kinds) % len(by_kind[k])]
            for i, k in zip(range(n), itertools.cycle(kinds))
        ]
        return [
            Task(id=f"sql-{split}-{seed}-{i:05d}", env=cls.name, split=split, data=pool[i])
            for i in range(n)
        ]

    def system_prompt(self, task: Task) -> str:
        return (
            "You answer questions about a shop's SQLite database. Inspect the schema, query it "
            "with run_sql (read-only), then reply with the answer only."
        )

    def setup(self, task: Task, seed: int) -> None:
        self._inspected = set()
        db_seed = int(task.data.get("db_seed", 0))
        if self._db is None or self._db.closed or self._db_seed != db_seed:
            if self._db is not None:
                self._db.close()
            self._db = ReadOnlyConnections(database_path(db_seed), self.connect)
            self._db_seed = db_seed

    def connect(self, path: Path) -> sqlite3.Connection:
        """A new connection for this env's tools (called on a tool worker thread)."""
        return connect_readonly(path)

    def _query(self, sql: str, n: int | None = None) -> tuple[list[str], list[tuple]]:
        """Run ``sql`` on a connection of this env until the tool call's deadline (or the env's
        close): (column names, the first ``n`` rows, all when ``None``). Runs on the tool's
        worker thread."""
        if self._db is None:
            raise ToolError("no episode: reset() was not called")
        db = self._db
        deadline = tool_deadline() or time.monotonic() + self.config.tool_timeout_s
        _printf_local.refused = None
        with db.use() as conn:
            conn.set_progress_handler(
                lambda: int(db.closed or time.monotonic() > deadline), PROGRESS_OPS
            )
            try:
                cur = conn.execute(sql)
                rows = cur.fetchall() if n is None else cur.fetchmany(n)
                names = [d[0] for d in cur.description or []]
                cur.close()
            finally:
                conn.set_progress_handler(None, 0)
        return names, rows

    def _tables(self) -> list[str]:
        _, rows = self._query("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        return [r[0] for r in rows]

    # -- tools -------------------------------------------------------------------------------------
    @tool
    def list_tables(self) -> str:
        """List the database's tables."""
        self._inspected.add("*")
        return ", ".join(self._tables())

    @tool
    def describe_table(self, name: str) -> str:
        """Show a table's columns and types.

        Args:
            name: the table name, e.g. orders.
        """
        tables = self._tables()
        if name not in tables:
            raise ToolError(f"unknown table {name!r}. Tables: {', '.join(tables)}")
        self._inspected.add(name)
        _, cols = self._query(f"PRAGMA table_info({name})")
        return f"{name}(" + ", ".join(f"{c[1]} {c[2]}" for c in cols) + ")"

    @tool
    def run_sql(self, query: str) -> str:
        """Run one read-only SQL query (SQLite) and return the rows.

        Args:
            query: a single SELECT statement.
        """
        try:
            names, rows = self._query(query, self.max_rows + 1)
        except sqlite3.DatabaseError as e:
            msg = str(e)
            if "interrupted" in msg:
                msg = f"query interrupted after {self.config.tool_timeout_s:g} s"
            elif "user-defined function raised exception" in msg and _printf_local.refused:
                msg = _printf_local.refused
            elif "not authorized" in msg or "readonly" in msg or "read-only" in msg:
                msg = f"{msg} (the database is read-only: only SELECT queries are allowed)"
            raise ToolError(f"SQL error: {msg}") from None
        except sqlite3.Warning as e:  # e.g. "You can only execute one statement at a time."
            raise ToolError(f"SQL error: {e}") from None
        header = " | ".join(names)
        lines = [
            " | ".join("NULL" if v is None else str(v) for v in r) for r in rows[: self.max_rows]
        ]
        more = len(rows) > self.max_rows
        if self._has_answer(lines):
            self._completed.add("query_answer")
        tail = f"(first {self.max_rows} rows; more omitted)" if more else f"({len(lines)} rows)"
        return "\n".join([header, *lines, tail])

    def state_digest(self) -> Any:
        """Privileged anchors (``EnvConfig.privileged_anchors``): the tables listed or described
        (observed) and ``completed_steps()``, whose ``query_answer`` is ground truth: set when a
        ``run_sql`` result holds the expected answer, checked on the rows before the output is
        cut at ``tool_output_max_chars``, so also when the policy never saw it."""
        return [sorted(self._inspected), sorted(self.completed_steps())]

    # -- judgement ---------------------------------------------------------------------------------
    def _matches(self, text: str) -> bool:
        d = self.task.data
        if d["answer_type"] in ("int", "float"):
            got = last_number(text)
            tol = 0.01 if d["answer_type"] == "float" else 1e-9
            return got is not None and abs(got - float(d["answer"])) <= tol + 1e-9
        return mentions(text, d["answer"])

    def _has_answer(self, lines: list[str]) -> bool:
        return any(self._matches(c) for c in _cells("\n".join(lines)) if c)

    def judge(self, answer: str | None) -> Verdict:
        d = self.task.data
        ok = answer is not None and self._matches(answer)
        if ok and d["answer_type"] in ("customers", "products"):
            names = _names(int(d.get("db_seed", 0)), d["answer_type"])
            ok = not any(mentions(answer, n) for n in names if n != d["answer"])
        return Verdict(
            success=ok,
            score=float(ok),
            info={
                Ann.EXPECTED: d["answer"],
                Ann.ANSWER: answer,
                Ann.EVIDENCE_IN_ANSWER: ok and "query_answer" in self._completed,
            },
        )

    async def close(self) -> None:
        """Never blocks the event loop: a statement still running (abandoned at its timeout) is
        interrupted and its worker thread closes its connection when it returns."""
        if self._db is not None:
            self._db.close()
            self._db = None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- scripted policies ---------------------------------------------------------------------------


def _call(k: int, fn_name: str, **arguments: Any) -> ToolCallDict:
    function = {"name": fn_name, "arguments": arguments}
    return {"id": f"call_{k}", "type": "function", "function": function}


def oracle_policy(
    task: Task,
    *,
    premature_prob: float = 0.0,
    premature_words: Sequence[str] | None = None,
    answer_prefix: str = "",
    rng: Any = None,
) -> Callable[[list[Message]], Message]:
    """Scripted solver: list tables, describe them, run the reference SQL, answer its first cell.

    ``premature_prob`` (drawn once per episode from ``rng``): an annotator who answers before the
    evidence is in — after describing the tables it writes the (right) answer without running
    the query. Such golden data teaches answering without the query (``premature`` in the failure
    taxonomy); a policy that imitates it must guess the number. ``premature_words`` (e.g.
    ``["Elston", "Fairhaven"]``): the habit only on questions that mention one of these words,
    as an annotator who thinks they know those cities' numbers; a policy imitating it skips the
    query on exactly those questions, even when decoding greedily. ``answer_prefix`` (e.g.
    ``"Answer: "``): the reply is the prefix then the answer (the judge reads the reply's last
    number, so both forms are right). A small model trained from scratch copies a number's
    first digit from a position whose only role is to start it; at the bare reply's first
    position (the assistant header's newline, which also starts tool calls) the 2 x 128 model
    guesses it (EXPERIMENTS.md, ninth session)."""
    tables = [t for t in ("customers", "orders", "products") if t in task.data["sql"]]
    words = set(re.findall(r"[\w']+", task.data["question"]))
    early = (
        premature_prob > 0
        and (premature_words is None or any(w in words for w in premature_words))
        and (rng.random() if rng is not None else random.random()) < premature_prob
    )

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        n_turns = sum(m["role"] == "assistant" for m in messages)
        if n_turns == 0:
            return {"role": "assistant", "content": "", "tool_calls": [_call(0, "list_tables")]}
        if n_turns == 1:
            calls = [_call(i + 1, "describe_table", name=t) for i, t in enumerate(tables)]
            return {"role": "assistant", "content": "", "tool_calls": calls}
        if n_turns == 2 and not early:
            call = _call(len(tool_msgs), "run_sql", query=task.data["sql"])
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        if early:
            return {"role": "assistant", "content": answer_prefix + str(task.data["answer"])}
        first_row = tool_msgs[-1]["content"].splitlines()[1]
        return {"role": "assistant", "content": answer_prefix + first_row.split(" | ")[0]}

    return policy


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Counts rows instead of answering the question: runs ``SELECT COUNT(*) FROM orders``."""

    def policy(messages: list[Message]) -> Message:
        if not any(m["role"] == "tool" for m in messages):
            call = _call(0, "run_sql", query="SELECT COUNT(*) FROM orders")
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": messages[-1]["content"].splitlines()[1]}

    return policy
