"""SFT data from the user: a JSONL file of OpenAI-style tool-calling conversations
(``trainer.sft.data``).

One conversation per line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0",
                   "type": "function", "function": {"name": "calculator",
                   "arguments": "{\\"expression\\": \\"2+2\\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_0", "content": "4"},
                  {"role": "assistant", "content": "4"}],
     "tools": [{"type": "function", "function": {"name": "calculator", "description": "...",
                "parameters": {...}}}]}

``tools`` is optional; other keys are ignored, so the trajectory files the package writes
(``jaxrl_agents.types.write_jsonl``) are accepted as they are. Roles are system, user, assistant
and tool; an assistant's ``tool_calls`` are OpenAI dicts whose ``arguments`` are a JSON object or
a string holding one; a tool message has string ``content`` and optional ``tool_call_id`` /
``name``.

Every line is checked and rendered at start-up, before anything is written or compiled, through
the policy's chat format: :meth:`~jaxrl_agents.chat.render.ChatFormat.encode_conversation`, the
incremental token-in/token-out path whose ids a rollout of the same conversation produces (the
loss mask covers the assistant turns). A problem stops the run with one line naming the file, the
line number and what is wrong (and how many other lines have problems): :class:`SftDataError`,
which the train job reports as its configuration error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from jaxrl_agents.facts import decode_arguments, json_error

if TYPE_CHECKING:
    from jaxrl_agents.chat import ChatFormat

ROLES = ("system", "user", "assistant", "tool")
_KEY = "trainer.sft.data"


class SftDataError(ValueError):
    """The file is missing, empty, or has a bad line: one line naming the file, the line number
    and what is wrong."""


class _Bad(Exception):
    """What is wrong with one line (the message names the place inside the record)."""


@dataclasses.dataclass
class SftFile:
    """A checked ``trainer.sft.data`` file: one golden ``(ids, loss_mask)`` row per conversation,
    in file order."""

    path: Path
    """The resolved file."""
    rows: list[tuple[list[int], list[int]]]
    lines: list[int]
    """The (1-based) line number of each row."""
    sha256: str
    """Of the file's bytes."""

    def record(self) -> dict[str, Any]:
        """What the run record notes about the file (``stages.json``'s ``sft_data``)."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "conversations": len(self.rows),
            "tokens": sum(len(ids) for ids, _ in self.rows),
            "assistant_tokens": sum(sum(mask) for _, mask in self.rows),
        }


def resolve(spec: str) -> Path:
    """``trainer.sft.data`` as a path: relative ones against the current working directory (the
    jobs run with Hydra's ``chdir: false``)."""
    path = Path(spec).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def load(spec: str, chat: ChatFormat, *, max_positions: int, hint: str = "") -> SftFile:
    """Check and encode every conversation of the JSONL file ``spec``; a conversation of ``n``
    tokens trains ``n - 1`` positions, which must fit ``max_positions`` (the largest training
    sequence bucket; ``hint`` says which key sets it)."""
    path = resolve(spec)
    if not path.exists():
        raise SftDataError(f"{_KEY}={spec!r}: no such file ({path})")
    if not path.is_file():
        raise SftDataError(f"{_KEY}={spec!r}: not a file ({path})")
    data = path.read_bytes()
    rows: list[tuple[list[int], list[int]]] = []
    lines: list[int] = []
    problems: list[tuple[int, str]] = []
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            messages, tools = _check_record(_parse(raw))
            enc = _encode(chat, messages, tools)
            if len(enc.ids) - 1 > max_positions:
                raise _Bad(
                    f"the conversation is {len(enc.ids)} tokens ({len(enc.ids) - 1} training "
                    f"positions), longer than the largest training sequence bucket "
                    f"({max_positions})" + (f"; {hint}" if hint else "")
                )
        except _Bad as e:
            problems.append((n, _one_line(str(e))))
            continue
        rows.append((list(enc.ids), list(enc.loss_mask)))
        lines.append(n)
    if problems:
        n, what = problems[0]
        more = ""
        if len(problems) > 1:
            shown = ", ".join(str(k) for k, _ in problems[1:6])
            etc = ", ..." if len(problems) > 6 else ""
            more = f" (and {len(problems) - 1} more bad line(s): {shown}{etc})"
        raise SftDataError(f"{_KEY}={spec}: line {n}: {what}{more}")
    if not rows:
        raise SftDataError(f"{_KEY}={spec}: the file holds no conversations ({path})")
    return SftFile(path, rows, lines, hashlib.sha256(data).hexdigest())


# -- one record -----------------------------------------------------------------------------------


def _parse(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except Exception as e:  # noqa: BLE001 - RecursionError, int digit limit, ...: all bad JSON
        raise _Bad(f"not valid JSON: {json_error(e)}") from None


def _check_record(obj: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` of one parsed line, or :class:`_Bad` naming what is wrong."""
    if not isinstance(obj, dict):
        raise _Bad(f'not a JSON object (got {_kind(obj)}); expected {{"messages": [...]}}')
    if "messages" not in obj:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        raise _Bad(f'no "messages" list (keys: {keys})')
    messages = obj["messages"]
    if not isinstance(messages, list):
        raise _Bad(f'"messages" is not a list (got {_kind(messages)})')
    if not messages:
        raise _Bad('"messages" is empty')
    tools = obj.get("tools")
    if tools is not None:
        _check_tools(tools)
    for i, m in enumerate(messages):
        _check_message(i, m)
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise _Bad("no assistant message (nothing to train on)")
    if roles[0] == "assistant":
        raise _Bad(
            "messages[0] is an assistant message: a conversation opens with a system or user "
            "message (the prompt)"
        )
    return messages, tools or None


def _check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise _Bad(f'"tools" is not a list (got {_kind(tools)})')
    schema = '{"type": "function", "function": {"name", "description", "parameters"}}'
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function":
            raise _Bad(f"tools[{i}] is not an OpenAI function schema {schema}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _Bad(f"tools[{i}].function.name is not a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _Bad(f"tools[{i}].function.parameters is not a JSON schema object")


def _check_message(i: int, m: Any) -> None:
    at = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _Bad(f"{at} is not an object (got {_kind(m)})")
    role = m.get("role")
    if role not in ROLES:
        what = "has no role" if role is None else f"has an unknown role {role!r}"
        raise _Bad(f"{at} {what}; roles: {', '.join(ROLES)}")
    content = m.get("content")
    if role == "assistant":
        if content is not None and not isinstance(content, str):
            raise _Bad(f"{at}.content is not a string or null (got {_kind(content)})")
        if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
            raise _Bad(f"{at}.reasoning_content is not a string")
        _check_calls(at, m.get("tool_calls"))
        return
    if "content" not in m:
        raise _Bad(f"{at} ({role}) has no content")
    if not isinstance(content, str):
        raise _Bad(f"{at}.content is not a string (got {_kind(content)})")
    if m.get("tool_calls"):
        raise _Bad(f"{at} is a {role} message with tool_calls (only assistant messages call tools)")
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise _Bad(f"{at}.{key} is not a string (got {_kind(m[key])})")


def _check_calls(at: str, calls: Any) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _Bad(f"{at}.tool_calls is not a list (got {_kind(calls)})")
    for j, c in enumerate(calls):
        where = f"{at}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise _Bad(f"{where} is not an object (got {_kind(c)})")
        if c.get("type", "function") != "function":
            raise _Bad(f"{where}.type is {c['type']!r}, not 'function'")
        if c.get("id") is not None and not isinstance(c["id"], str):
            raise _Bad(f"{where}.id is not a string (got {_kind(c['id'])})")
        fn = c.get("function")
        if not isinstance(fn, dict):
            raise _Bad(
                f'{where} has no "function" object (OpenAI form: {{"type": "function", '
                '"function": {"name": ..., "arguments": ...}})'
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _Bad(f"{where}.function.name is not a non-empty string")
        if "arguments" not in fn:
            raise _Bad(f"{where}.function has no arguments")
        _, error = decode_arguments(fn["arguments"])
        if error is not None:
            raise _Bad(f"{where}.function.arguments is not a JSON object: {error}")


def _encode(chat: ChatFormat, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
    """``chat.encode_conversation``, its template's errors as :class:`_Bad`."""
    try:
        return chat.encode_conversation(messages, tools)
    except (ValueError, TypeError, KeyError, IndexError, jinja2.TemplateError) as e:
        raise _Bad(f"the chat template cannot render it: {type(e).__name__}: {e}") from None


def _kind(x: Any) -> str:
    if x is None:
        return "null"
    for tp, name in ((bool, "a boolean"), (dict, "an object"), (list, "a list"), (str, "a string")):
        if isinstance(x, tp):
            return name
    return "a number" if isinstance(x, int | float) else type(x).__name__


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
