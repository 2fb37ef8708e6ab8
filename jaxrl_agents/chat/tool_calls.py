"""Tool-call parsing of sampled assistant text, with a registry of formats.

The built-in ``hermes`` format is the Qwen2.5 / Hermes one::

    Some content.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37*12"}}
    </tool_call>

Several blocks per turn are allowed. Parsing never raises on model output: a block that is not a
valid call (bad JSON, no ``name``, ``arguments`` not an object, a ``<tool_call>`` never closed)
becomes a ``ToolCall`` with ``error`` set (a readable reason), ``raw`` the block text, ``arguments``
``{}`` and ``name`` a best guess (``""`` when none), so the environment can answer with a
``MALFORMED`` tool error the model sees.

Leniencies (documented deviations from the strictest reading): ``arguments`` may be a JSON *string*
holding an object (OpenAI wire style), ``parameters`` is accepted for ``arguments`` (Llama style),
and a call without ``arguments`` means ``{}``. A stray ``</tool_call>`` with no opener stays in the
content. Other formats plug in with :func:`register_tool_parser`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from jaxrl_agents.facts import decode_arguments
from jaxrl_agents.types import ToolCall

ToolParser = Callable[[str], tuple[str, list[ToolCall]]]
"""``text -> (content without the call markup, calls in order)``. Ids are assigned by
:func:`parse_tool_calls`, so a parser leaves ``ToolCall.id`` empty."""

TOOL_CALL_PARSERS: dict[str, ToolParser] = {}

_NAME_GUESS = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


def register_tool_parser(
    name: str, parser: ToolParser | None = None, *, overwrite: bool = False
) -> Any:
    """Register ``parser`` under ``name``; without ``parser`` it returns a decorator."""

    def add(fn: ToolParser) -> ToolParser:
        if name in TOOL_CALL_PARSERS and not overwrite:
            raise ValueError(
                f"tool-call parser {name!r} is already registered; "
                "pass overwrite=True to replace it"
            )
        TOOL_CALL_PARSERS[name] = fn
        return fn

    return add if parser is None else add(parser)


def parse_tool_calls(text: str, *, format: str = "hermes") -> tuple[str, list[ToolCall]]:
    """Split assistant ``text`` into its content and its calls, ids ``call_0``, ``call_1``, ..."""
    try:
        parser = TOOL_CALL_PARSERS[format]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {format!r}; registered: {sorted(TOOL_CALL_PARSERS)}"
        ) from None
    content, calls = parser(text)
    for i, call in enumerate(calls):
        call.id = f"call_{i}"
    return content, calls


def call_from_json(body: str, *, raw: str) -> ToolCall:
    """One ``{"name": ..., "arguments": {...}}`` object -> ``ToolCall`` (``error`` set if invalid).

    Shared by JSON-bodied formats so they agree on what counts as malformed.
    """

    def bad(reason: str, name: str = "") -> ToolCall:
        if not name:
            m = _NAME_GUESS.search(body)
            name = m.group(1).strip() if m else ""
        return ToolCall(name=name, arguments={}, raw=raw, error=reason)

    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return bad(f"invalid JSON in tool call: {e.msg} at char {e.pos}")
    if not isinstance(obj, dict):
        return bad(f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return bad(f'tool call needs a non-empty string "name", got {name!r}')
    args, error = decode_arguments(obj.get("arguments", obj.get("parameters", {})))
    if error is not None:
        return bad(error, name)
    return ToolCall(name=name, arguments=args, raw=raw)


def _tag_parser(open_tag: str, close_tag: str) -> ToolParser:
    """Parser for JSON calls wrapped in ``open_tag ... close_tag`` blocks."""

    def parse(text: str) -> tuple[str, list[ToolCall]]:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while (start := text.find(open_tag, pos)) != -1:
            pieces.append(text[pos:start])
            body_start = start + len(open_tag)
            end = text.find(close_tag, body_start)
            reopen = text.find(open_tag, body_start)
            if end == -1 or (reopen != -1 and reopen < end):
                stop = len(text) if reopen == -1 else reopen
                body = text[body_start:stop]
                call = call_from_json(body.strip(), raw=text[start:stop])
                reason = f"unterminated {open_tag}: no {close_tag} before " + (
                    "the end of the turn" if reopen == -1 else f"the next {open_tag}"
                )
                calls.append(ToolCall(name=call.name, arguments={}, raw=call.raw, error=reason))
                pos = stop
                continue
            stop = end + len(close_tag)
            calls.append(call_from_json(text[body_start:end].strip(), raw=text[start:stop]))
            pos = stop
        if not calls:
            return text, []
        pieces.append(text[pos:])
        # The newlines around blocks are markup; the template re-inserts them.
        return "".join(pieces).strip(), calls

    return parse


register_tool_parser("hermes", _tag_parser("<tool_call>", "</tool_call>"))
