"""``SqlEnv``: answer questions about the shop database with read-only SQL.

Tools: ``list_tables()``, ``describe_table(name)``, ``run_sql(query)``, on read-only connections
(:mod:`jaxrl_agents.envs.sql.sandbox`). Results are capped at ``max_rows`` rows.

Required step ``query_answer``: a successful ``run_sql`` whose result has the answer in a cell.
Verdict: numbers within 0.01 (2-decimal questions) or exactly; names must be mentioned and no
other name of the same table may be (listing every customer does not pass).
"""

from __future__ import annotations

import functools
import itertools
import random
import sqlite3
import time
from collections.abc import Sequence
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
from jaxrl_agents.envs.sql.database import database_path, generate_rows
from jaxrl_agents.envs.sql.sandbox import (
    PROGRESS_OPS,
    ReadOnlyConnections,
    _printf_local,
    connect_readonly,
)
from jaxrl_agents.envs.sql.tasks import DEFAULT_KINDS, QUESTION_KINDS, _question_pool
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.envs.workers import tool_deadline
from jaxrl_agents.types import Ann, Task, Verdict


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
