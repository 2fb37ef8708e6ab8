"""Scripted policies of the ``sql`` env: the oracle (SFT's golden data) and a wrong one."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.registry import retry_timed_out_calls
from jaxrl_agents.types import Message, Task, ToolCallDict


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

    return retry_timed_out_calls(policy)


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Counts rows instead of answering the question: runs ``SELECT COUNT(*) FROM orders``."""

    def policy(messages: list[Message]) -> Message:
        if not any(m["role"] == "tool" for m in messages):
            call = _call(0, "run_sql", query="SELECT COUNT(*) FROM orders")
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": messages[-1]["content"].splitlines()[1]}

    return policy
