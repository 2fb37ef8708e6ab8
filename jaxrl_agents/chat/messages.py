"""Message normalisation: what a chat template is handed, and the reasoning split of a turn.

Messages from rollouts and datasets follow the OpenAI format, with tool-call arguments as dicts or
JSON strings and ``None`` contents; templates want dicts and strings. An assistant turn of a
thinking model holds a ``<think>...</think>`` block, kept as ``reasoning_content`` apart from the
content that is parsed for tool calls.
"""

from __future__ import annotations

import copy
from typing import Any

from jaxrl_agents.facts import decode_arguments
from jaxrl_agents.types import Message

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, rest)`` of a sampled turn: the ``<think>...</think>`` block's inside (``None``
    when there is none; everything after an unclosed ``<think>`` when the turn was cut off) and
    the text after it, which alone is parsed for tool calls and handed to the environment."""
    close = text.find(THINK_CLOSE)
    if close < 0:
        open_ = text.find(THINK_OPEN)
        if open_ < 0 or text[:open_].strip():
            return None, text
        return text[open_ + len(THINK_OPEN) :].strip("\n"), ""
    head = text[:close]
    open_ = head.find(THINK_OPEN)
    reasoning = head[open_ + len(THINK_OPEN) :] if open_ >= 0 else head
    return reasoning.strip("\n"), text[close + len(THINK_CLOSE) :].lstrip("\n")


def call_pair(call: dict[str, Any]) -> tuple[str, Any]:
    """``(name, arguments as a dict)`` of an OpenAI tool call (or of its ``function``); arguments
    that do not decode give ``{}``."""
    fn = call.get("function", call)
    args = fn.get("arguments")
    if isinstance(args, str):
        args, _ = decode_arguments(args)
    return fn.get("name"), args or {}


def normalize(message: Message) -> Message:
    """Copy of ``message`` safe for any template: ``None`` content -> ``""``, OpenAI-style JSON
    string arguments -> dicts (templates ``tojson`` them)."""
    m = dict(message)
    if m.get("content") is None:
        m["content"] = ""
    if m.get("tool_calls"):
        calls = copy.deepcopy(m["tool_calls"])
        for c in calls:
            fn = c.get("function", c)
            if isinstance(fn.get("arguments"), str):
                args, error = decode_arguments(fn["arguments"])
                if error is not None:
                    raise ValueError(
                        f"tool call {fn.get('name')!r} has arguments {fn['arguments']!r}: {error}"
                    )
                fn["arguments"] = args
        m["tool_calls"] = calls
    return m


def has_inline_reasoning(m: Message) -> bool:
    """Whether ``m`` is an assistant message with its reasoning inline: a ``</think>`` in its
    content and no ``reasoning_content``."""
    content = m.get("content")
    return (
        m.get("role") == "assistant"
        and m.get("reasoning_content") is None
        and isinstance(content, str)
        and THINK_CLOSE in content
    )


def split_inline_reasoning(m: Message) -> Message:
    """``m`` with an inline ``<think>...</think>`` block moved to ``reasoning_content``, split the
    way the Qwen3 template splits it (reasoning: before the first close tag, after the last open
    tag before it; content: after the last close tag)."""
    if not has_inline_reasoning(m):
        return m
    content = m["content"]
    parts = content.split(THINK_CLOSE)
    reasoning = parts[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return {**m, "content": parts[-1].lstrip("\n"), "reasoning_content": reasoning}
