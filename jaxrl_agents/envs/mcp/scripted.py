"""Scripted policies of the ``mcp`` env: the oracle replays a task's ``oracle`` calls, one a turn,
then answers with the task's answer; ``wrong`` answers at once with something else."""

from __future__ import annotations

from collections.abc import Callable

from jaxrl_agents.types import Message, Task

Policy = Callable[[list[Message]], Message]


def oracle_policy(task: Task) -> Policy:
    """Replays ``task.data["oracle"]`` (``[{"name", "arguments"}, ...]``; names as the model sees
    them), one call a turn whatever the results say, then answers ``task.data["answer"]``."""
    calls = list(task.data.get("oracle") or [])

    def policy(messages: list[Message]) -> Message:
        k = sum(m["role"] == "tool" for m in messages)
        if k < len(calls):
            fn = {"name": calls[k]["name"], "arguments": dict(calls[k].get("arguments") or {})}
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"call_{k}", "type": "function", "function": fn}],
            }
        return {"role": "assistant", "content": str(task.data["answer"])}

    return policy


def wrong_policy(task: Task) -> Policy:
    """Answers at once, with a reply no check accepts for a non-empty answer."""
    return lambda messages: {"role": "assistant", "content": "I do not know."}
