"""Scripted policies of the ``calculator`` env: the oracle (SFT's golden data, with an
annotator's habits) and a wrong one."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.base import last_number
from jaxrl_agents.envs.calculator.arithmetic import format_number
from jaxrl_agents.types import Message, Task

Policy = Callable[[list[Message]], Message]


def _rand(rng: Any) -> float:
    return rng.random() if rng is not None else random.random()


def premature_guess(task: Task, u: float) -> int:
    """A plausible but wrong answer, as a model that skips the tool would give (``u`` in [0, 1))."""
    steps, answer = task.data["steps"], task.data["answer"]
    first = steps[0]["value"]
    a, b = (int(x) for x in re.findall(r"\d+", steps[0]["expression"])[:2])
    options = [answer + 10, answer - 10, a + b if first != a + b else a * b]
    if answer >= 100:
        options.append(int(str(answer)[:2]))  # the product's leading digits only
    if len(steps) > 1:
        options.append(first)  # forgot the second step
    options = [o for o in options if o != answer and o > 0] or [answer + 1]
    return options[int(u * len(options)) % len(options)]


def oracle_policy(
    task: Task,
    *,
    premature_prob: float = 0.0,
    premature_ops: str | None = None,
    premature_below: int | None = None,
    premature_words: Sequence[str] | None = None,
    rng: Any = None,
    combined: bool = False,
) -> Callable[[list[Message]], Message]:
    """Scripted solver: one calculator call per step, then the number alone.

    With probability ``premature_prob`` (drawn once per episode from ``rng``, a ``random.Random``
    or ``numpy.random.Generator``) it answers at once with :func:`premature_guess`; with
    ``premature_ops`` (e.g. ``"+"``), ``premature_below`` (e.g. 50: the first number is below it)
    and/or ``premature_words`` (e.g. ``["coins"]``: the question mentions one) only the matching
    problems are answered early — golden data whose author did those in their head, a habit a
    policy can learn (the demo's premature-completion failure). ``combined`` does all steps in
    one call (``37*12-5``). A call answered with an error (a transient fault) is made again.
    """
    first_expr = task.data["steps"][0]["expression"]
    first_number = int(re.match(r"\d+", first_expr).group())
    question = task.data["question"]
    applies = (
        (premature_ops is None or any(op in first_expr for op in premature_ops))
        and (premature_below is None or first_number < premature_below)
        and (premature_words is None or any(w in question.split() for w in premature_words))
    )
    premature = applies and premature_prob > 0 and _rand(rng) < premature_prob
    guess = premature_guess(task, _rand(rng)) if premature else None
    steps = task.data["steps"]
    plan = [task.data["expression"]] if combined else [s["expression"] for s in steps]

    def policy(messages: list[Message]) -> Message:
        if guess is not None:
            return {"role": "assistant", "content": str(guess)}
        # Successful results only: after an error (a transient fault) the same call is retried.
        results = [
            m["content"]
            for m in messages
            if m["role"] == "tool" and not str(m["content"]).startswith("Error")
        ]
        k = len(results)
        if k < len(plan):
            expr = plan[k]
            if k > 0 and not combined:
                # Chain the previous result as read from the tool, as a model would.
                prev = last_number(results[-1])
                if prev is not None:
                    prev_s = format_number(int(prev) if prev.is_integer() else prev)
                    expr = expr.replace(str(steps[k - 1]["value"]), prev_s, 1)
            call = {"name": "calculator", "arguments": {"expression": expr}}
            n = sum(m["role"] == "tool" for m in messages)
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
            }
        return {"role": "assistant", "content": format_number(task.data["answer"])}

    return policy


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Always answers immediately with a plausible wrong number (fails every task)."""
    return oracle_policy(task, premature_prob=1.0, rng=random.Random(task.id))
