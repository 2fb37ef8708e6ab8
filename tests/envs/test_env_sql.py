"""SQL env: ground truth vs plain-Python loops, oracle/wrong policies, splits, read-only safety."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from jaxrl_agents.envs.base import drive
from jaxrl_agents.envs.sql import (
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
    if kind == "city_month_orders":
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
    assert len(kinds) == 7, kinds  # every question kind is covered
    for t in tasks:
        ref = _reference(t.data)
        if isinstance(ref, float):
            assert t.data["answer"] == pytest.approx(ref, abs=0.006), t.data
        else:
            assert t.data["answer"] == ref, t.data


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
