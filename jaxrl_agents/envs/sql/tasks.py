"""The ``sql`` env's questions: the question bank and its ground truth from the database."""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from jaxrl_agents.envs.sql.database import CATEGORIES, CITIES, MONTHS, database_path, generate_rows
from jaxrl_agents.envs.sql.sandbox import connect_readonly

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
