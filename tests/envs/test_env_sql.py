"""SQL env: ground truth vs plain-Python loops, oracle/wrong policies, splits, read-only safety."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter

import pytest

from jaxrl_agents.envs.base import drive
from jaxrl_agents.envs.sql import (
    MAX_STRING_BYTES,
    MONTHS,
    SqlEnv,
    database_path,
    file_sha256,
    generate_rows,
    oracle_policy,
    wrong_policy,
)
from jaxrl_agents.types import Ann, Task, ToolCall, ToolErrorKind


def _reference(data) -> object:
    """Recompute a question's answer from the generated rows with plain Python."""
    rows = generate_rows(data["db_seed"])
    cust = {c[0]: c for c in rows["customers"]}
    prod = {p[0]: p for p in rows["products"]}
    orders = rows["orders"]
    kind, q = data["key"].split("/")[2], data["question"]
    city = next((c for c in {c[2] for c in cust.values()} if c in q), None)
    month = next((i + 1 for i, m in enumerate(MONTHS) if f" {m} " in q), None)
    cat = next((c for c in {p[2] for p in prod.values()} if f" {c} " in q), None)
    if kind == "city_orders":
        return sum(cust[o[1]][2] == city for o in orders)
    if kind == "city_ym_orders":  # "... in 2023-09?"
        month = int(q.rsplit("-", 1)[1].rstrip("?"))
    if kind == "city_range_orders":  # "... between 2023-03-05 and 2023-06-21?"
        d1, d2 = q.rstrip("?").split(" between ")[1].split(" and ")
        return sum(cust[o[1]][2] == city and d1 <= o[4] <= d2 for o in orders)
    if kind in ("city_month_orders", "city_ym_orders"):
        return sum(cust[o[1]][2] == city and int(o[4][5:7]) == month for o in orders)
    if kind == "category_revenue":
        return round(sum(o[3] * prod[o[2]][3] for o in orders if prod[o[2]][2] == cat), 2)
    if kind == "category_avg_price":
        prices = [p[3] for p in prod.values() if p[2] == cat]
        return round(sum(prices) / len(prices), 2)
    if kind == "product_buyers":
        name = q.split("'")[1]
        return len({o[1] for o in orders if prod[o[2]][1] == name})
    if kind == "month_top_customer":
        counts = Counter(o[1] for o in orders if int(o[4][5:7]) == month)
        return cust[counts.most_common(1)[0][0]][1]
    if kind == "city_top_product":
        qty = Counter()
        for o in orders:
            if cust[o[1]][2] == city:
                qty[o[2]] += o[3]
        return prod[qty.most_common(1)[0][0]][1]
    raise AssertionError(kind)


def test_ground_truth_matches_python_reference():
    tasks = SqlEnv.make_tasks("train", 100) + SqlEnv.make_tasks("heldout", 30)
    kinds = Counter(t.data["key"].split("/")[2] for t in tasks)
    assert len(kinds) == 7, kinds  # every default question kind is covered
    tasks += SqlEnv.make_tasks("train", 20, kinds=["city_ym_orders", "city_range_orders"])
    for t in tasks:
        ref = _reference(t.data)
        if isinstance(ref, float):
            assert t.data["answer"] == pytest.approx(ref, abs=0.006), t.data
        else:
            assert t.data["answer"] == ref, t.data


def test_kinds_selects_question_kinds_and_names_bad_ones():
    tasks = SqlEnv.make_tasks("heldout", 40, kinds=["city_orders", "city_month_orders"])
    assert {t.data["key"].split("/")[2] for t in tasks} == {"city_orders", "city_month_orders"}
    train = SqlEnv.make_tasks("train", 200, kinds=["city_month_orders"])
    keys = {t.data["key"] for t in train}
    assert not keys & {t.data["key"] for t in SqlEnv.make_tasks("heldout", 200)}  # splits hold
    assert len(keys) == len({t.data["key"] for t in train[: len(keys)]})  # every one before repeats
    with pytest.raises(ValueError, match=r"unknown \['city_count'\].*valid kinds: \['city_orders'"):
        SqlEnv.make_tasks("train", 4, kinds=["city_count"])
    ranges = {t.data["key"] for t in SqlEnv.make_tasks("train", 3000, kinds=["city_range_orders"])}
    assert len(ranges) > 2900  # sampled: too many distinct questions to memorize
    with pytest.raises(ValueError, match="empty list"):
        SqlEnv.make_tasks("train", 4, kinds=[])


def test_oracle_solves_and_wrong_policy_fails():
    for task in SqlEnv.make_tasks("heldout", 25, seed=3):
        verdict, messages, anns = asyncio.run(drive(SqlEnv(), task, oracle_policy(task)))
        assert verdict.success, messages
        assert verdict.info[Ann.MISSING_STEPS] == [] and anns[-1][Ann.EVIDENCE_COMPLETE]
        verdict, _, anns = asyncio.run(drive(SqlEnv(), task, wrong_policy(task)))
        assert not verdict.success and not anns[-1][Ann.EVIDENCE_COMPLETE]


def test_name_answers_must_not_list_other_candidates():
    task = next(t for t in SqlEnv.make_tasks("train", 60) if t.data["answer_type"] == "customers")
    names = ", ".join(r[1] for r in generate_rows(0)["customers"])
    verdict, _, _ = asyncio.run(
        drive(SqlEnv(), task, lambda m: {"role": "assistant", "content": names})
    )
    assert not verdict.success
    answer = task.data["answer"]
    verdict, _, _ = asyncio.run(
        drive(SqlEnv(), task, lambda m: {"role": "assistant", "content": answer})
    )
    assert verdict.success


def test_splits_disjoint_and_deterministic():
    train = {t.data["key"] for t in SqlEnv.make_tasks("train", 500)}
    held = {t.data["key"] for t in SqlEnv.make_tasks("heldout", 200)}
    assert train.isdisjoint(held) and len(train) > 80 and len(held) > 15
    assert [t.data for t in SqlEnv.make_tasks("train", 20)] == [
        t.data for t in SqlEnv.make_tasks("train", 20)
    ]


WRITES = [
    "DROP TABLE orders",
    "INSERT INTO customers VALUES (999, 'Eve', 'Avalon', 2020)",
    "UPDATE products SET price = 0",
    "DELETE FROM orders",
    "CREATE TABLE t (x INTEGER)",
    "ATTACH DATABASE ':memory:' AS other",
    "ATTACH DATABASE '/tmp/jaxrl_sql_attack.sqlite' AS other",
    "PRAGMA user_version = 7",
    "PRAGMA journal_mode = WAL",
    "PRAGMA query_only = OFF",
    "SELECT 1; DROP TABLE orders",
    "BEGIN IMMEDIATE",
    "SELECT randomblob(100000000)",
]


def test_sql_cannot_change_the_database():
    path = database_path(0)
    before = file_sha256(path)
    env = SqlEnv(max_rows=3)
    task = SqlEnv.make_tasks("train", 1)[0]

    async def go():
        await env.reset(task)
        calls = [ToolCall("run_sql", {"query": q}, id=str(i)) for i, q in enumerate(WRITES)]
        calls += [ToolCall("run_sql", {"query": "SELECT name FROM customers"}, id="ok")]
        step = await env.step({"role": "assistant", "content": ""}, calls)
        await env.close()
        return step

    step = asyncio.run(go())
    *bad, ok = step.tool_results
    for q, r in zip(WRITES, bad, strict=True):
        assert r.error_kind is ToolErrorKind.TOOL_ERROR, (q, r.content)
        assert r.content.startswith("Error: SQL error:"), r.content
    assert "read-only" in bad[0].content
    assert ok.ok and ok.content.endswith("(first 3 rows; more omitted)")
    assert len(ok.content.splitlines()) == 5  # header + 3 rows + note
    assert file_sha256(path) == before
    conn = __import__("sqlite3").connect(f"file:{path}?mode=ro", uri=True)
    assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 600
    conn.close()


def test_schema_tools_and_unknown_table():
    env = SqlEnv()
    task = Task(id="x", env="sql", split="train", data=SqlEnv.make_tasks("train", 1)[0].data)

    async def go():
        await env.reset(task)
        calls = [
            ToolCall("list_tables", {}),
            ToolCall("describe_table", {"name": "ordrs"}),
            ToolCall("describe_table", {"name": "orders"}),
        ]
        return await env.step({"role": "assistant"}, calls)

    step = asyncio.run(go())
    assert step.messages[0]["content"] == "customers, orders, products"
    assert step.messages[1]["content"] == (
        "Error: unknown table 'ordrs'. Tables: customers, orders, products"
    )
    assert step.messages[2]["content"].startswith("orders(order_id INTEGER, customer_id INTEGER")


# -- runaway statements: stopped on time, never stalling the event loop ---------------------

RUNAWAYS = {
    "printf": "SELECT printf('%.*c', 2147483647, 'x')",  # one uninterruptible call (~11 s)
    "printf_literal": "SELECT format('%.4294967295c', 'x')",
    "cross_join": "SELECT COUNT(*) FROM orders a, orders b, orders c",  # 216M rows
    "recursive": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT MAX(i) FROM r",
}


class SlowSqlEnv(SqlEnv):
    """Its connections have ``sleep(s)``: a statement SQLite cannot interrupt."""

    def connect(self, path):
        conn = super().connect(path)
        conn.create_function("sleep", 1, lambda s: time.sleep(s) or 1)
        self.opened.append(conn)
        return conn

    opened: list = []


def _ticker():
    gaps = [0.0]

    async def tick():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now

    return gaps, tick


def _is_closed(conn) -> bool:
    """Only for a connection no thread is using."""
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def test_runaway_queries_end_within_the_timeout_and_close_never_blocks():
    task = SqlEnv.make_tasks("train", 1)[0]
    gaps, tick = _ticker()

    async def one(query):
        env = SqlEnv(tool_timeout_s=0.5)
        await env.reset(task)
        t0 = time.perf_counter()
        step = await env.step({"role": "assistant"}, [ToolCall("run_sql", {"query": query})])
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        db = env._db
        await env.close()
        return step.tool_results[0], elapsed, time.perf_counter() - t1, db

    async def main():
        ticker = asyncio.get_running_loop().create_task(tick())
        out = await asyncio.gather(*[one(q) for q in RUNAWAYS.values()])
        ticker.cancel()
        return out

    results = dict(zip(RUNAWAYS, asyncio.run(main()), strict=True))
    for name, (result, elapsed, close_s, _) in results.items():
        assert not result.ok, (name, result.content)
        assert elapsed < 0.5 + 0.4, (name, elapsed)
        assert close_s < 0.5, (name, close_s)
    for name in ("printf", "printf_literal"):  # refused up front, not left running
        result, elapsed, _, _ = results[name]
        assert result.error_kind is ToolErrorKind.TOOL_ERROR and elapsed < 0.2, (name, elapsed)
        assert f"repeats a character more than {MAX_STRING_BYTES} times" in result.content
    for name in ("cross_join", "recursive"):  # interrupted by the deadline
        result, elapsed, _, db = results[name]
        assert result.error_kind in (ToolErrorKind.TIMEOUT, ToolErrorKind.TOOL_ERROR), name
        assert "timed out" in result.content or "interrupted" in result.content, result.content
        assert elapsed > 0.4, (name, elapsed)
        deadline = time.monotonic() + 1.0  # really stopped, not left running in its thread
        while db.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert db.open_connections == 0, name
    assert gaps[0] < 1.0, gaps[0]


def test_uninterruptible_statement_cannot_stall_the_loop_or_the_env():
    task = SqlEnv.make_tasks("train", 1)[0]
    SlowSqlEnv.opened = []
    env = SlowSqlEnv(tool_timeout_s=0.5)
    gaps, tick = _ticker()

    async def main():
        ticker = asyncio.get_running_loop().create_task(tick())
        await env.reset(task)
        t0 = time.perf_counter()
        slow = await env.step(
            {"role": "assistant"}, [ToolCall("run_sql", {"query": "SELECT sleep(3)"})]
        )
        slow_s = time.perf_counter() - t0
        # The first connection is still held by the abandoned statement: the env opens another.
        ok = await env.step(
            {"role": "assistant"}, [ToolCall("run_sql", {"query": "SELECT COUNT(*) FROM orders"})]
        )
        verdict = await env.verify()  # judging never touches a connection
        db = env._db
        t1 = time.perf_counter()
        await env.close()
        close_s = time.perf_counter() - t1
        ticker.cancel()
        return slow, slow_s, ok, verdict, close_s, db

    slow, slow_s, ok, verdict, close_s, db = asyncio.run(main())
    assert slow.tool_results[0].error_kind is ToolErrorKind.TIMEOUT and slow_s < 0.9, slow_s
    assert ok.tool_results[0].ok and "600" in ok.messages[0]["content"]
    assert not verdict.success
    assert close_s < 0.5, close_s
    assert gaps[0] < 1.0, gaps[0]
    first, second = SlowSqlEnv.opened
    assert _is_closed(second)  # the idle one: closed by close()
    # The first is still busy in its worker thread (touching it from here would wait on it; with
    # a Python function running in it, that deadlocks): the worker closes it when it returns.
    assert db.closed and db.open_connections == 1
    deadline = time.monotonic() + 5
    while db.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert db.open_connections == 0 and _is_closed(first)
    assert sum(t.name.startswith("tool-") for t in threading.enumerate()) <= 32


def test_printf_still_works_and_refusals_are_readable():
    task = SqlEnv.make_tasks("train", 1)[0]
    env = SqlEnv()

    async def go():
        await env.reset(task)
        queries = [
            "SELECT printf('%.2f|%5s|%.*c', 3.14159, 'ab', 3, 'x')",
            "SELECT printf('%.*c', '2147483647', 'x')",
            "SELECT length(randomblob(2000000000))",
        ]
        calls = [ToolCall("run_sql", {"query": q}) for q in queries]
        step = await env.step({"role": "assistant"}, calls)
        await env.close()
        return [m["content"] for m in step.messages]

    fmt, refused, blob = asyncio.run(go())
    assert fmt.splitlines()[1] == "3.14|   ab|xxx"
    assert refused.startswith("Error: SQL error: printf:") and "more than" in refused
    assert blob == "Error: SQL error: string or blob too big"
