"""Tasks of the ``mcp`` env from a JSONL file, and the answer checks.

A row of ``tasks_file``: ``{"id", "prompt", "answer"}`` plus optionally ``"split"`` (``train``,
``validation`` or ``heldout``; without it the split is ``base.split_of(id)``, so a task always
lands in the same split) and ``"oracle"``: the tool calls that solve it, ``[{"name",
"arguments"}, ...]``, replayed by the ``oracle`` scripted policy before it answers ``answer``.

Checks (``check``): ``exact`` (the final answer, stripped, equals ``answer``), ``contains``
(``answer`` occurs in the final answer as whole words, ignoring case and punctuation), ``number``
(the final answer's last number equals ``answer`` to 1e-6 relative), or the import path of a
function ``pkg.mod:fn(answer: str, task: Task) -> bool``.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxrl_agents.envs.base import SPLITS, check_split, last_number, mentions, split_of
from jaxrl_agents.types import Task

CHECKS = ("exact", "contains", "number")
"""Built-in answer checks; any other value of ``check`` is an import path ``pkg.mod:fn``."""
_ROW_KEYS = {"id", "prompt", "answer", "split", "oracle"}


def _exact(answer: str, task: Task) -> bool:
    return answer.strip() == str(task.data["answer"]).strip()


def _contains(answer: str, task: Task) -> bool:
    return mentions(answer, str(task.data["answer"]))


def _number(answer: str, task: Task) -> bool:
    got, expected = last_number(answer), last_number(str(task.data["answer"]))
    if got is None or expected is None:
        return False
    return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)


_BUILTIN: dict[str, Callable[[str, Task], bool]] = {
    "exact": _exact,
    "contains": _contains,
    "number": _number,
}


@functools.cache
def resolve_check(check: str) -> Callable[[str, Task], bool]:
    """The check function of ``check`` (a built-in name or ``pkg.mod:fn``); ``ValueError``
    naming the bad value and what is valid."""
    if check in _BUILTIN:
        return _BUILTIN[check]
    valid = f"use one of {', '.join(CHECKS)} or an import path pkg.mod:fn(answer, task) -> bool"
    module, sep, attr = str(check).partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"check={check!r}: unknown check; {valid}")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"check={check!r}: cannot import it ({type(e).__name__}: {e}); {valid}"
        ) from None
    if not callable(fn):
        raise ValueError(f"check={check!r}: {fn!r} is not callable; {valid}")
    return fn


@functools.cache
def _read_rows(path: str, mtime: float) -> tuple[dict[str, Any], ...]:
    """The checked rows of a tasks file (cached per path and modification time)."""
    rows, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"tasks_file={path}, line {i}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            rows.append(_check_row(row, where))
            if row["id"] in seen:
                raise ValueError(f"{where}: duplicate id {row['id']!r}")
            seen.add(row["id"])
    if not rows:
        raise ValueError(f"tasks_file={path}: no tasks (one JSON object a line)")
    return tuple(rows)


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("id", "prompt", "answer") if k not in row]
    unknown = sorted(set(row) - _ROW_KEYS)
    if missing or unknown:
        raise ValueError(
            f"{where}: missing {missing} / unknown {unknown} keys; a row holds "
            f"id, prompt, answer and optionally split, oracle"
        )
    row = {**row, "id": str(row["id"])}
    if row.get("split") is not None and row["split"] not in SPLITS:
        raise ValueError(f"{where}: split={row['split']!r}; valid: {', '.join(SPLITS)}")
    calls = row.get("oracle") or []
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and set(c) <= {"name", "arguments"}
        for c in calls
    ):
        raise ValueError(f'{where}: oracle must be a list of {{"name", "arguments"}} objects')
    return row


def load_rows(tasks_file: str | Path) -> tuple[dict[str, Any], ...]:
    """The rows of ``tasks_file``; ``ValueError`` naming the file when it is missing or bad."""
    path = Path(tasks_file).expanduser()
    if not path.is_file():
        raise ValueError(
            f"tasks_file={str(tasks_file)!r}: no such file (a JSONL file of "
            "{id, prompt, answer} rows)"
        )
    return _read_rows(str(path.resolve()), path.stat().st_mtime)


def make_tasks(
    env_name: str,
    rows: tuple[dict[str, Any], ...],
    split: str,
    n: int,
    *,
    seed: int,
    check: str,
    heldout_frac: float,
    origin: str,
) -> list[Task]:
    """``n`` tasks of ``split`` from ``rows``: the split's rows in a seeded order, repeated in
    further seeded orders when ``n`` exceeds them (a repeat's id gets ``#<pass>``)."""
    check_split(split)
    resolve_check(check)  # a bad check stops here, not in the first verdict
    pool = [
        r for r in rows if (r.get("split") or split_of(r["id"], heldout_frac=heldout_frac)) == split
    ]
    if not pool:
        have = sorted(
            {r.get("split") or split_of(r["id"], heldout_frac=heldout_frac) for r in rows}
        )
        raise ValueError(
            f"{origin}: no tasks of split {split!r} (its rows are {have}); give rows "
            f'a "split" or pick another split'
        )
    rng = random.Random(f"{env_name}/{seed}/{split}")
    tasks: list[Task] = []
    rounds = 0
    while len(tasks) < n:
        order = list(pool)
        rng.shuffle(order)
        for row in order[: n - len(tasks)]:
            tid = row["id"] if rounds == 0 else f"{row['id']}#{rounds}"
            data = {
                "question": str(row["prompt"]),
                "answer": row["answer"],
                "oracle": list(row.get("oracle") or []),
                "check": check,
                "source_id": row["id"],
            }
            tasks.append(Task(id=tid, env=env_name, split=split, data=data))
        rounds += 1
    return tasks
