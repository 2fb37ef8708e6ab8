"""Tool-call parsing of sampled assistant text, with a registry of formats.

The built-in ``hermes`` format is the Qwen2.5 / Hermes one::

    Some content.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37*12"}}
    </tool_call>

Several blocks per turn are allowed. Parsing never raises on model output: a block that is not a
valid call (bad JSON, JSON nested too deeply or with an integer past Python's digit limit, no
``name``, ``arguments`` not an object, a ``<tool_call>`` never closed) becomes a ``ToolCall`` with
``error`` set (a readable reason), ``raw`` the block text, ``arguments`` ``{}`` and ``name`` a best
guess (``""`` when none), so the environment can answer with a ``MALFORMED`` tool error the model
sees. Parsing is linear in the text's length (each opener and closer is searched for once, from the
last position), whatever the number of blocks.

At most ``max_calls`` calls per turn (default :data:`MAX_TOOL_CALLS`) are kept as parsed; every
later block becomes a call with ``error`` naming the cap, so the environment answers it with a tool
error instead of executing it.

Leniencies (documented deviations from the strictest reading): ``arguments`` may be a JSON *string*
holding an object (OpenAI wire style), ``parameters`` is accepted for ``arguments`` (Llama style),
and a call without ``arguments`` means ``{}``. A ``</tool_call>`` with no opener before it is an
error call (from its JSON object's ``{``, if any, to the closer; the text before stays content):
a policy that drops the opener has attempted a call, which must not be taken for its answer.

The ``llama3_json`` format is Llama 3.1-3.3's custom-tool one: the whole assistant turn is one JSON
object ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``; several
objects separated by ``;`` are accepted too). A turn that does not start with ``{`` is plain
content; one that starts with ``{`` and names a ``"name"`` but does not decode is a malformed call;
a JSON object
without ``"name"`` is content (e.g. a JSON answer).

Other formats plug in with :func:`register_tool_parser`; ``detect`` tells ``tool_parser=auto``
(:func:`detect_tool_parser`) which chat templates render that format.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Any

from jaxrl_agents.facts import decode_arguments, json_error
from jaxrl_agents.types import ToolCall

ToolParser = Callable[[str], tuple[str, list[ToolCall]]]
"""``text -> (content without the call markup, calls in order)``. Ids and the per-turn cap are
applied by :func:`parse_tool_calls`, so a parser leaves ``ToolCall.id`` empty and returns every
call it found. A parser may also take a keyword ``max_calls`` (then it is passed) to skip decoding
the blocks past the cap, as the built-in one does; it returns them as calls all the same."""

TOOL_CALL_PARSERS: dict[str, ToolParser] = {}
TOOL_PARSER_DETECTORS: dict[str, Callable[[str], bool]] = {}
"""``name -> (chat template text -> whether the template renders this format)``, for ``auto``."""

MAX_TOOL_CALLS = 16
"""Default cap on the tool calls of one assistant turn (later ones become error calls)."""

_NAME_GUESS = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_NAME_GUESS_MAX = 64  # tool names are at most 64 characters (envs.tools.derive_tool)


def register_tool_parser(
    name: str,
    parser: ToolParser | None = None,
    *,
    overwrite: bool = False,
    detect: Callable[[str], bool] | None = None,
) -> Any:
    """Register ``parser`` under ``name``; without ``parser`` it returns a decorator.

    ``detect(template_text) -> bool``: whether a chat template renders calls in this format, so
    ``tool_parser=auto`` can pick it (optional; without it ``auto`` never picks this parser)."""
    if name == "auto":
        raise ValueError("'auto' is reserved (it detects the parser from the chat template)")

    def add(fn: ToolParser) -> ToolParser:
        if name in TOOL_CALL_PARSERS and not overwrite:
            raise ValueError(
                f"tool-call parser {name!r} is already registered; "
                "pass overwrite=True to replace it"
            )
        TOOL_CALL_PARSERS[name] = fn
        if detect is not None:
            TOOL_PARSER_DETECTORS[name] = detect
        else:
            TOOL_PARSER_DETECTORS.pop(name, None)
        return fn

    return add if parser is None else add(parser)


def parse_tool_calls(
    text: str, *, format: str = "hermes", max_calls: int | None = MAX_TOOL_CALLS
) -> tuple[str, list[ToolCall]]:
    """Split assistant ``text`` into its content and its calls, ids ``call_0``, ``call_1``, ...

    Never raises on model output (an unknown ``format`` or a negative ``max_calls`` is a caller
    error and does raise). Calls past the first ``max_calls`` (``None``: no cap) get ``error`` set
    and ``arguments`` ``{}``; a parser plugin that raises yields the text as content and one error
    call.
    """
    try:
        parser = TOOL_CALL_PARSERS[format]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {format!r}; registered: {sorted(TOOL_CALL_PARSERS)}"
        ) from None
    if max_calls is not None and max_calls < 0:
        raise ValueError(f"max_calls must be >= 0 or None, got {max_calls}")
    takes_cap = _takes_max_calls(parser)
    try:
        if takes_cap:
            content, calls = parser(text, max_calls=max_calls)
        else:
            content, calls = parser(text)
    except Exception as e:  # noqa: BLE001 - a parser bug must not crash the episode
        reason = f"the {format!r} tool-call parser failed: {type(e).__name__}: {e}"
        content, calls = text, [ToolCall(name="", arguments={}, raw=text, error=reason)]
    if max_calls is not None:
        for k in range(max_calls, len(calls)):
            calls[k].arguments, calls[k].error = {}, _over_cap(k, max_calls)
    for i, call in enumerate(calls):
        call.id = f"call_{i}"
    return content, calls


def _takes_max_calls(parser: ToolParser) -> bool:
    try:
        return "max_calls" in inspect.signature(parser).parameters
    except (TypeError, ValueError):
        return False


def _over_cap(index: int, max_calls: int) -> str:
    return (
        f"too many tool calls in one turn: only the first {max_calls} are run; "
        f"call {index + 1} was not run"
    )


def _guess_name(body: str) -> str:
    m = _NAME_GUESS.search(body)
    return m.group(1).strip()[:_NAME_GUESS_MAX] if m else ""


def call_from_json(body: str, *, raw: str) -> ToolCall:
    """One ``{"name": ..., "arguments": {...}}`` object -> ``ToolCall`` (``error`` set if invalid).

    Shared by JSON-bodied formats so they agree on what counts as malformed. Never raises: any
    failure of ``json.loads`` (including ``RecursionError`` on deep nesting and ``ValueError`` on
    integers past Python's digit limit) is an error call.
    """

    def bad(reason: str, name: str = "") -> ToolCall:
        return ToolCall(name=name or _guess_name(body), arguments={}, raw=raw, error=reason)

    try:
        obj = json.loads(body)
    except Exception as e:  # noqa: BLE001 - every decoding failure is a malformed call
        return bad(f"invalid JSON in tool call: {json_error(e)}")
    if not isinstance(obj, dict):
        return bad(f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return bad(f'tool call needs a non-empty string "name", got {name!r:.80}')
    args, error = decode_arguments(obj.get("arguments", obj.get("parameters", {})))
    if error is not None:
        return bad(error, name)
    return ToolCall(name=name, arguments=args, raw=raw)


def _tag_parser(open_tag: str, close_tag: str) -> ToolParser:
    """Parser for JSON calls wrapped in ``open_tag ... close_tag`` blocks (linear time)."""

    orphan = f"{close_tag} without an opening {open_tag}: the call was not run"

    def outside(piece: str, pieces: list[str], calls: list[ToolCall]) -> None:
        """Text between blocks: a closer there ends a call whose opener is missing (a model that
        drops the opener must not have its call taken for a final answer) -> an error call."""
        p = 0
        while (c := piece.find(close_tag, p)) != -1:
            brace = piece.find("{", p, c)  # the call's body starts at its JSON object, if any
            body_start = c if brace == -1 else brace
            pieces.append(piece[p:body_start])
            raw = piece[body_start : c + len(close_tag)]
            calls.append(ToolCall(_guess_name(raw), arguments={}, raw=raw, error=orphan))
            p = c + len(close_tag)
        pieces.append(piece[p:])

    def parse(text: str, *, max_calls: int | None = None) -> tuple[str, list[ToolCall]]:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        # Each search starts past the previous one's result, so the text is scanned O(1) times.
        start = text.find(open_tag)
        close = -2  # the first closer after the previous block (-1: none left)
        while start != -1:
            outside(text[pos:start], pieces, calls)
            body_start = start + len(open_tag)
            reopen = text.find(open_tag, body_start)
            if close != -1 and close < body_start:
                close = text.find(close_tag, body_start)
            if close == -1 or (reopen != -1 and reopen < close):
                stop = len(text) if reopen == -1 else reopen
                reason = f"unterminated {open_tag}: no {close_tag} before " + (
                    "the end of the turn" if reopen == -1 else f"the next {open_tag}"
                )
                name = _guess_name(text[body_start:stop])
                calls.append(ToolCall(name=name, arguments={}, raw=text[start:stop], error=reason))
                pos, start = stop, reopen
                continue
            stop = close + len(close_tag)
            if max_calls is not None and len(calls) >= max_calls:  # not decoded: over the cap
                body = text[body_start:close]
                error = _over_cap(len(calls), max_calls)
                calls.append(ToolCall(_guess_name(body), {}, raw=text[start:stop], error=error))
            else:
                calls.append(call_from_json(text[body_start:close].strip(), raw=text[start:stop]))
            pos = stop
            start = reopen if reopen == -1 or reopen >= stop else text.find(open_tag, stop)
        outside(text[pos:], pieces, calls)
        if not calls:
            return text, []
        # The newlines around blocks are markup; the template re-inserts them.
        return "".join(pieces).strip(), calls

    return parse


def _llama3_json(text: str) -> tuple[str, list[ToolCall]]:
    """Llama 3.x custom tool calls: the turn is ``[<|python_tag|>]{json}[; {json}...]``."""
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):
        return text, []
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(body) and body[pos] == "{":
        try:
            obj, end = decoder.raw_decode(body, pos)
        except Exception:  # noqa: BLE001 - every decoding failure is a malformed call or content
            if calls or _NAME_GUESS.search(body, pos):
                calls.append(call_from_json(body[pos:].strip(), raw=body[pos:]))
                pos = len(body)
            break
        if not isinstance(obj, dict) or "name" not in obj:
            break  # a JSON value that is not a call: content
        calls.append(call_from_json(body[pos:end], raw=body[pos:end]))
        pos = end
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
    if not calls:
        return text, []
    return body[pos:].strip(), calls


_PYTHON_TAG = "<|python_tag|>"


def _is_hermes(template: str) -> bool:
    return "<tool_call>" in template


def _is_llama3_json(template: str) -> bool:
    return '"parameters"' in template and ("ipython" in template or _PYTHON_TAG in template)


def detect_tool_parser(template: str) -> str:
    """The one registered format whose detector matches ``template``; ``ValueError`` naming the
    candidates when none or several do (then the config must name the parser)."""
    hits = sorted(
        n for n, fn in TOOL_PARSER_DETECTORS.items() if n in TOOL_CALL_PARSERS and fn(template)
    )
    if len(hits) == 1:
        return hits[0]
    what = "matches none" if not hits else f"matches several ({', '.join(hits)})"
    raise ValueError(
        f"tool_parser=auto cannot tell the chat template's tool-call format: it {what} of the "
        f"detectable formats {sorted(TOOL_PARSER_DETECTORS)}; name one of "
        f"{sorted(TOOL_CALL_PARSERS)}"
    )


register_tool_parser("hermes", _tag_parser("<tool_call>", "</tool_call>"), detect=_is_hermes)
register_tool_parser("llama3_json", _llama3_json, detect=_is_llama3_json)
