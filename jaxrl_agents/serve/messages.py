"""OpenAI chat messages in and out: the canonical form histories are compared in, the form the chat
template renders, and the assistant message a sampled turn is served as.

A client echoes the assistant messages it was served back in its next request, but not byte for
byte: the openai SDK sends ``content: null`` where the server sent ``""`` (or the reverse), keeps
or drops tool-call ids, re-serialises argument JSON with other spacing, adds fields of its own
(``refusal``, ``audio``, ``annotations``) and may drop unknown ones (``reasoning_content``).
:func:`canonical` maps a message to what matters for the conversation — role, text content,
tool calls as (name, arguments decoded and re-encoded with sorted keys), and a tool message's
``tool_call_id`` / ``name`` — so an echoed history compares equal to the served one, while an
edited or trimmed history does not.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from jaxrl_agents.chat.render import split_reasoning
from jaxrl_agents.facts import decode_arguments
from jaxrl_agents.types import Message, ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(ValueError):
    """A request the server refuses (HTTP 4xx); ``param`` names the offending field."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


def text_of(content: Any, *, where: str = "content") -> str:
    """A message's content as text: ``None`` -> ``""``; a list of ``{"type": "text"}`` parts ->
    their texts joined; other part types are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text") or ""))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: content part of type {kind!r} is not supported")
        return "".join(out)
    raise BadRequest(f"{where}: content must be a string, a list of text parts or null")


def _calls_key(calls: Any) -> tuple[tuple[str, str], ...]:
    out = []
    for c in calls or []:
        fn = c.get("function", c) if isinstance(c, dict) else {}
        args, _ = decode_arguments(fn.get("arguments"))
        out.append((str(fn.get("name") or ""), json.dumps(args, sort_keys=True)))
    return tuple(out)


def canonical(m: Message) -> tuple:
    """What two messages must share to count as the same message of a history (see module
    docstring). Tool-call ids and reasoning are left out; assistant content is compared
    without surrounding whitespace."""
    role = m.get("role")
    content = text_of(m.get("content"))
    if role == "assistant":
        return (role, content.strip(), _calls_key(m.get("tool_calls")))
    if role == "tool":
        return (role, content, str(m.get("tool_call_id") or ""), str(m.get("name") or ""))
    return (role, content)


def template_message(m: Any, index: int) -> Message:
    """A request message in the form the chat template renders (only the fields it knows;
    arguments decoded to dicts; ``developer`` rendered as ``system``). Raises
    :class:`BadRequest` for a malformed message."""
    where = f"messages[{index}]"
    if not isinstance(m, dict):
        raise BadRequest(f"{where} must be an object", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role={role!r} is not one of {list(ROLES)}", param=where)
    out: Message = {
        "role": "system" if role == "developer" else role,
        "content": text_of(m.get("content"), where=where),
    }
    if role == "assistant" and m.get("tool_calls"):
        calls = []
        for k, c in enumerate(m["tool_calls"]):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not fn.get("name"):
                raise BadRequest(f"{where}.tool_calls[{k}] has no function name", param=where)
            args, error = decode_arguments(fn.get("arguments"))
            if error is not None:
                raise BadRequest(f"{where}.tool_calls[{k}]: {error}", param=where)
            calls.append(
                {
                    "id": str(c.get("id") or f"call_{k}"),
                    "type": "function",
                    "function": {"name": str(fn["name"]), "arguments": args},
                }
            )
        out["tool_calls"] = calls
    if role == "assistant" and isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
    if role == "tool" and m.get("name"):
        out["name"] = str(m["name"])
    return out


def served_message(parsed: Message, calls: list[ToolCall], *, tools_on: bool, raw: str) -> Message:
    """The canonical assistant message of a sampled turn (what the record keeps and the history
    is compared against): the chat format's parse with fresh unique tool-call ids and arguments
    as dicts. ``tools_on`` False (``tool_choice="none"``): the visible text is the content and
    nothing is parsed as a call."""
    if not tools_on:
        reasoning = parsed.get("reasoning_content")
        msg: Message = {"role": "assistant", "content": raw}
        if reasoning is not None:
            msg = {**msg, "content": split_reasoning(raw)[1], "reasoning_content": reasoning}
        return msg
    msg = {"role": "assistant", "content": parsed.get("content") or ""}
    if parsed.get("reasoning_content") is not None:
        msg["reasoning_content"] = parsed["reasoning_content"]
    valid = [c for c in calls if c.error is None]
    for c in valid:  # unique across the episode (the parser numbers each turn's from 0)
        c.id = f"call_{uuid.uuid4().hex[:24]}"
    if valid:
        msg["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in valid
        ]
    return msg


def openai_message(msg: Message) -> dict[str, Any]:
    """The served message in OpenAI's wire form: arguments as a JSON string, ``content`` null
    for a turn that only calls tools."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or None}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(c["function"]["arguments"]),
                },
            }
            for c in msg["tool_calls"]
        ]
    elif out["content"] is None:
        out["content"] = ""
    if msg.get("reasoning_content") is not None:
        out["reasoning_content"] = msg["reasoning_content"]
    return out
