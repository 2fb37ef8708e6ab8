"""``sql``: data questions over a real SQLite shop database, answered with read-only SQL.

The database (``customers``, ``products``, ``orders``; deterministic in ``db_seed``) is written once
per process per seed to ``$JAXRL_AGENTS_CACHE/sql`` (default ``~/.cache/jaxrl_agents/sql``), via a
temp file and an atomic rename, then chmod 0444. Each question's ground truth is computed from that
data when the task is made (``tests/envs/test_env_sql.py`` recomputes it with plain Python loops).

Tools: ``list_tables()``, ``describe_table(name)``, ``run_sql(query)``. The connection cannot write,
by three independent layers: ``file:...?mode=ro`` URI, ``PRAGMA query_only=ON``, and an authorizer
that allows only reads, functions and the read-only schema pragmas (no ATTACH, no PRAGMA writes).
Results are capped at ``max_rows`` rows; a progress handler interrupts queries that run past the
tool timeout (a SQLite call cannot otherwise be cancelled); the blob/string length limit stops
``randomblob(1e9)``-style memory bombs.

Required step ``query_answer``: a successful ``run_sql`` whose result has the answer in a cell.
Verdict: numbers within 0.01 (2-decimal questions) or exactly; names must be mentioned and no
other name of the same table may be (listing every customer does not pass).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import random
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, last_number, mentions, split_of
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.types import Ann, Message, Task, Verdict

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
    """A connection that cannot modify ``path`` (see module docstring for the three layers)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
    conn.set_authorizer(_authorizer)
    return conn


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


@functools.lru_cache(maxsize=4)
def _question_pool(db_seed: int) -> list[dict[str, Any]]:
    """Every question with its ground truth; ambiguous argmax questions (ties) are dropped."""
    products = [r[1] for r in generate_rows(db_seed)["products"]]
    conn = connect_readonly(database_path(db_seed))
    pool = []
    try:
        for kind, text, sql, answer_type in _QUESTIONS:
            fields = set(re.findall(r"{(\w+)}", text))
            grid: list[dict[str, Any]] = [{}]
            if "city" in fields:
                grid = [{**g, "city": c} for g in grid for c in CITIES]
            if "month" in fields:
                grid = [
                    {**g, "month": m, "mm": f"{i + 1:02d}"}
                    for g in grid
                    for i, m in enumerate(MONTHS)
                ]
            if "category" in fields:
                grid = [{**g, "category": c} for g in grid for c in CATEGORIES]
            if "product" in fields:
                grid = [{**g, "product": p} for g in grid for p in products]
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
        self._conn: sqlite3.Connection | None = None
        self._db_seed: int | None = None
        self._inspected: set[str] = set()  # tables listed/described: part of STATE_KEY

    @classmethod
    def make_tasks(
        cls, split: str, n: int, *, seed: int = 0, db_seed: int = 0, heldout_frac: float = 0.2
    ) -> list[Task]:
        """``n`` questions of ``split``, round-robin over question kinds (``seed``-shuffled);
        questions repeat once ``n`` exceeds the split's pool (about 130 questions in all)."""
        check_split(split)
        pool = [
            dict(q)
            for q in _question_pool(db_seed)
            if split_of(q["key"], heldout_frac=heldout_frac) == split
        ]
        if not pool:
            raise ValueError(f"split {split!r} has no questions for heldout_frac={heldout_frac}")
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
        if self._conn is None or self._db_seed != db_seed:
            if self._conn is not None:
                self._conn.close()
            self._conn, self._db_seed = connect_readonly(database_path(db_seed)), db_seed

    def _tables(self) -> list[str]:
        rows = self._conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
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
        cols = self._conn.execute(f"PRAGMA table_info({name})").fetchall()
        return f"{name}(" + ", ".join(f"{c[1]} {c[2]}" for c in cols) + ")"

    @tool
    def run_sql(self, query: str) -> str:
        """Run one read-only SQL query (SQLite) and return the rows.

        Args:
            query: a single SELECT statement.
        """
        deadline = time.monotonic() + self.config.tool_timeout_s
        self._conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = self._conn.execute(query)
            rows = cur.fetchmany(self.max_rows + 1)
        except sqlite3.DatabaseError as e:
            msg = str(e)
            if "interrupted" in msg:
                msg = f"query interrupted after {self.config.tool_timeout_s:g} s"
            elif "not authorized" in msg or "readonly" in msg or "read-only" in msg:
                msg = f"{msg} (the database is read-only: only SELECT queries are allowed)"
            raise ToolError(f"SQL error: {msg}") from None
        except sqlite3.Warning as e:  # e.g. "You can only execute one statement at a time."
            raise ToolError(f"SQL error: {e}") from None
        finally:
            self._conn.set_progress_handler(None, 0)
        header = " | ".join(d[0] for d in cur.description or [])
        lines = [
            " | ".join("NULL" if v is None else str(v) for v in r) for r in rows[: self.max_rows]
        ]
        more = len(rows) > self.max_rows
        if self._has_answer(lines):
            self._completed.add("query_answer")
        tail = f"(first {self.max_rows} rows; more omitted)" if more else f"({len(lines)} rows)"
        return "\n".join([header, *lines, tail])

    def state_digest(self) -> Any:
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
            names = [r[0] for r in self._conn.execute(f"SELECT name FROM {d['answer_type']}")]
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
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- scripted policies ---------------------------------------------------------------------------


def _call(k: int, fn_name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": fn_name, "arguments": arguments}
    return {"id": f"call_{k}", "type": "function", "function": function}


def oracle_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Scripted solver: list tables, describe them, run the reference SQL, answer its first cell."""
    tables = [t for t in ("customers", "orders", "products") if t in task.data["sql"]]

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        n_turns = sum(m["role"] == "assistant" for m in messages)
        if n_turns == 0:
            return {"role": "assistant", "content": "", "tool_calls": [_call(0, "list_tables")]}
        if n_turns == 1:
            calls = [_call(i + 1, "describe_table", name=t) for i, t in enumerate(tables)]
            return {"role": "assistant", "content": "", "tool_calls": calls}
        if n_turns == 2:
            call = _call(len(tool_msgs), "run_sql", query=task.data["sql"])
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        first_row = tool_msgs[-1]["content"].splitlines()[1]
        return {"role": "assistant", "content": first_row.split(" | ")[0]}

    return policy


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Counts rows instead of answering the question: runs ``SELECT COUNT(*) FROM orders``."""

    def policy(messages: list[Message]) -> Message:
        if not any(m["role"] == "tool" for m in messages):
            call = _call(0, "run_sql", query="SELECT COUNT(*) FROM orders")
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": messages[-1]["content"].splitlines()[1]}

    return policy
