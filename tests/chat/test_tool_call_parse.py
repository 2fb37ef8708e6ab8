"""Hermes tool-call parsing: several calls, every malformed variant becomes an error call (never an
exception), the parser registry, and render -> parse round trips through both templates."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jaxrl_agents.chat import (
    TOOL_CALL_PARSERS,
    ChatFormat,
    load_tiny_tokenizer,
    parse_tool_calls,
    register_tool_parser,
)
from jaxrl_agents.facts import MAX_ARGUMENT_DEPTH, call_key, decode_arguments
from jaxrl_agents.types import ToolCall


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_plain_text_has_no_calls_and_is_kept_verbatim():
    assert parse_tool_calls("  The answer is 42.\n") == ("  The answer is 42.\n", [])


def test_several_calls_in_order_with_ids_and_content():
    b1 = block('{"name": "search", "arguments": {"query": "river", "k": 3}}')
    b2 = block('{"name": "open", "arguments": {"doc_id": "doc_7"}}')
    content, calls = parse_tool_calls(f"Looking it up.\n{b1}\n{b2}")
    assert content == "Looking it up."
    assert [(c.id, c.name, c.arguments, c.error) for c in calls] == [
        ("call_0", "search", {"query": "river", "k": 3}, None),
        ("call_1", "open", {"doc_id": "doc_7"}, None),
    ]
    assert [c.raw for c in calls] == [b1, b2]


def test_lenient_forms_are_valid_calls():
    _, calls = parse_tool_calls(
        block('{"name": "run_sql", "arguments": "{\\"query\\": \\"SELECT 1\\"}"}')
        + block('{"name": "get_itinerary"}')
        + block('{"name": "book_flight", "parameters": {"id": "F1"}}')
    )
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("run_sql", {"query": "SELECT 1"}, None),
        ("get_itinerary", {}, None),
        ("book_flight", {"id": "F1"}, None),
    ]


@pytest.mark.parametrize(
    "body, name, reason",
    [
        ('{"name": "calculator", "arguments": {"expression": "1+"', "calculator", "invalid JSON"),
        ("calculator(1+2)", "", "invalid JSON"),
        ("", "", "invalid JSON"),
        ('["calculator", {"expression": "1"}]', "", "must be a JSON object"),
        ('{"arguments": {"expression": "1"}}', "", 'non-empty string "name"'),
        ('{"name": 7, "arguments": {}}', "", 'non-empty string "name"'),
        ('{"name": "  ", "arguments": {}}', "", 'non-empty string "name"'),
        (
            '{"name": "calculator", "arguments": [1, 2]}',
            "calculator",
            "must be a JSON object, got list",
        ),
        ('{"name": "calculator", "arguments": 12}', "calculator", "must be a JSON object, got int"),
        ('{"name": "calculator", "arguments": "1+2"}', "calculator", "string that is not JSON"),
        ('{"name": "calculator", "arguments": {}}}', "calculator", "invalid JSON"),
    ],
)
def test_malformed_block_becomes_an_error_call(body, name, reason):
    text = "I will compute.\n" + block(body)
    content, calls = parse_tool_calls(text)
    assert content == "I will compute."
    (call,) = calls
    assert call.error is not None and reason in call.error, call.error
    assert (call.name, call.arguments, call.raw, call.id) == (name, {}, block(body), "call_0")


def test_unterminated_blocks():
    good = block('{"name": "open", "arguments": {"doc_id": "d1"}}')
    cut = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n'
    content, calls = parse_tool_calls(f"Hm.\n{cut}{good}")
    assert content == "Hm."
    assert [c.name for c in calls] == ["search", "open"]
    assert "unterminated" in calls[0].error and "next <tool_call>" in calls[0].error
    assert calls[0].raw == cut and calls[0].arguments == {}
    assert calls[1].error is None

    _, (last,) = parse_tool_calls(f"{good}\n{cut}".replace(good, ""))
    assert "end of the turn" in last.error and last.name == "search"


def test_a_closer_without_its_opener_is_an_error_call_not_an_answer():
    """What a policy wrote after RL had taught it to drop the opener (experiments/sql): taken as
    content, the turn would end the episode as a final answer and dodge the invalid-call
    penalty; as an error call the env reports it and the episode goes on."""
    text = '{"name": "list_tables", "arguments": {}}\n</tool_call>'
    content, (call,) = parse_tool_calls(text)
    assert content == "" and call.name == "list_tables" and call.raw == text
    assert "</tool_call> without an opening <tool_call>" in call.error
    good = block('{"name": "calculator", "arguments": {"expression": "1+1"}}')
    text = f'Go. {{"name": "search"}}</tool_call> x</tool_call>{good} ok'
    content, calls = parse_tool_calls(text)
    assert content.startswith("Go. ") and "x" in content and content.endswith("ok")
    assert [c.error is None for c in calls] == [False, False, True]
    assert [c.name for c in calls] == ["search", "", "calculator"]
    assert calls[1].raw == "</tool_call>"


_pieces = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "\n",
        "{",
        "}",
        '"name"',
        ": ",
        '"arguments"',
        '"x"',
        "[1]",
        ",",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_pieces, st.text(max_size=8)), max_size=25))
def test_arbitrary_text_never_raises(parts):
    text = "".join(parts)
    content, calls = parse_tool_calls(text)
    # every opener and every closer is consumed into a call (a closer without an opener too)
    assert "<tool_call>" not in content and "</tool_call>" not in content
    orphans = [c for c in calls if not c.raw.startswith("<tool_call>")]
    assert len(calls) == text.count("<tool_call>") + len(orphans)
    assert all(c.raw.endswith("</tool_call>") and "without an opening" in c.error for c in orphans)
    for i, c in enumerate(calls):
        assert c.id == f"call_{i}"
        if c.error is None:
            assert c.name.strip() and isinstance(c.arguments, dict)
            assert c.raw.endswith("</tool_call>")
        else:
            assert c.arguments == {}


def test_registry_validates_names_and_accepts_plugins():
    with pytest.raises(ValueError, match=r"unknown tool-call format 'xml'.*'hermes'"):
        parse_tool_calls("x", format="xml")
    with pytest.raises(ValueError, match="already registered"):
        register_tool_parser("hermes", lambda text: (text, []))

    @register_tool_parser("test_bang")
    def bang(text: str) -> tuple[str, list[ToolCall]]:
        # "!name arg" lines are calls
        lines = text.splitlines()
        calls = [
            ToolCall(name=l[1:].split()[0], arguments={"arg": l.split()[1]})
            for l in lines
            if l.startswith("!")
        ]
        return "\n".join(l for l in lines if not l.startswith("!")), calls

    try:
        content, calls = parse_tool_calls("ok\n!search cats\n!open d2", format="test_bang")
        assert content == "ok"
        assert [(c.id, c.name, c.arguments) for c in calls] == [
            ("call_0", "search", {"arg": "cats"}),
            ("call_1", "open", {"arg": "d2"}),
        ]
        with pytest.raises(ValueError, match="unknown tool_parser 'nope'"):
            ChatFormat(load_tiny_tokenizer(), tool_parser="nope")
        assert ChatFormat(load_tiny_tokenizer(), tool_parser="test_bang").tool_parser == "test_bang"
    finally:
        TOOL_CALL_PARSERS.pop("test_bang")


# -- render -> parse round trip ------------------------------------------------------------
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False),
)
_json = st.recursive(
    _json_leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
_names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
_calls = st.lists(
    st.tuples(_names, st.dictionaries(st.text(max_size=8), _json, max_size=4)), max_size=3
)
_content = st.text(max_size=30).map(str.strip)


@pytest.fixture(scope="module", params=["tiny", "qwen2.5"])
def chat(request):
    return ChatFormat(load_tiny_tokenizer(), chat_template=request.param)


@settings(max_examples=60, deadline=None)
@given(calls=_calls, content=_content)
def test_rendered_calls_parse_back_to_the_same_calls(chat, calls, content):
    blob = json.dumps([content, calls])
    # Markup inside a JSON string would end the block early: a known limit of the Hermes format.
    assume(not any(t in blob for t in ("<tool_call>", "</tool_call>", "<|im_end|>")))
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
        ],
    }
    text = chat.assistant_text(message)
    parsed_message, parsed = chat.parse_assistant(text)
    assert [(c.name, c.arguments, c.error) for c in parsed] == [(n, a, None) for n, a in calls]
    assert parsed_message["content"] == (content if calls else text)
    # Re-rendering the parsed message reproduces the text exactly (what no-drift relies on).
    assert chat.assistant_text(parsed_message) == text


# -- adversarial model output: never raises, linear time, per-turn cap ---------------------


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deep_nesting_is_an_error_call_not_a_recursion_error(depth):
    for body in (
        '{"name": "f", "arguments": ' + "[" * depth + "]" * depth + "}",  # balanced
        '{"name": "f", "arguments": ' + "[" * depth,  # never closed
        '{"name": "f", "arguments": "' + "[" * depth + '"}',  # inside an arguments string
        "{" * depth,
    ):
        _, (call,) = parse_tool_calls(block(body))
        assert call.error is not None and call.arguments == {}, call.error
        assert call.name in ("f", "")


def test_arguments_deeper_than_the_limit_are_rejected():
    def nested(d):
        return '{"a": ' * d + "1" + "}" * d

    _, (ok, deep) = parse_tool_calls(
        block(f'{{"name": "f", "arguments": {nested(MAX_ARGUMENT_DEPTH)}}}')
        + block(f'{{"name": "f", "arguments": {nested(MAX_ARGUMENT_DEPTH + 1)}}}')
    )
    assert ok.error is None
    assert deep.name == "f" and f"deeper than {MAX_ARGUMENT_DEPTH}" in deep.error
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert decode_arguments(cyclic) == (
        {},
        f'"arguments" are nested deeper than {MAX_ARGUMENT_DEPTH} levels',
    )


def test_huge_integer_is_an_error_call():
    digits = "9" * 5000  # past Python's 4300-digit int-string limit
    _, (a, b) = parse_tool_calls(
        block('{"name": "calculator", "arguments": {"x": ' + digits + "}}")
        + block('{"name": "calculator", "arguments": "{\\"x\\": ' + digits + '}"}')
    )
    assert "invalid JSON" in a.error and "digits" in a.error and a.name == "calculator"
    assert "not JSON" in b.error and "digits" in b.error and b.name == "calculator"


class _CountingText(str):
    """A ``str`` that counts the characters its ``find`` calls scan (the parser's only search of
    the whole text; the slices it takes are plain strings, each scanned once)."""

    scanned = 0

    def find(self, sub, start=0, end=None):  # type: ignore[override]
        at = super().find(sub, start, end)
        _CountingText.scanned += (len(self) if at == -1 else at + len(sub)) - start
        return at


def test_many_unclosed_openers_parse_in_linear_time():
    """Linear, not quadratic (the old parser rescanned to the end for every opener: 23 s here):
    the characters scanned by the searches, counted rather than timed, stay within a small
    multiple of the text's length (quadratic would be ~100_000 x)."""
    n = 100_000
    text = _CountingText("<tool_call>" * n)
    _CountingText.scanned = 0
    content, calls = parse_tool_calls(text)
    assert _CountingText.scanned <= 3 * len(text), _CountingText.scanned / len(text)
    assert content == "" and len(calls) == n
    assert all(c.error is not None for c in calls)
    assert "unterminated" in calls[0].error and "too many tool calls" in calls[-1].error


def test_calls_past_the_cap_become_error_calls():
    one = block('{"name": "calculator", "arguments": {"expression": "1+1"}}') + "\n"
    content, calls = parse_tool_calls("Go.\n" + one * 10_000)
    assert content == "Go." and len(calls) == 10_000
    assert [c.error for c in calls[:16]] == [None] * 16
    assert all(c.name == "calculator" and c.arguments == {} for c in calls[16:])
    assert all(c.error and "only the first 16 are run" in c.error for c in calls[16:])
    assert calls[16].error.endswith("call 17 was not run") and calls[-1].id == "call_9999"

    _, calls = parse_tool_calls(one * 5, max_calls=2)
    assert [c.error is None for c in calls] == [True, True, False, False, False]
    _, calls = parse_tool_calls(one * 20, max_calls=None)
    assert all(c.error is None for c in calls)
    with pytest.raises(ValueError, match="max_calls"):
        parse_tool_calls(one, max_calls=-1)

    chat = ChatFormat(load_tiny_tokenizer())
    assert chat.max_tool_calls == 16
    message, calls = chat.parse_assistant(one * 20)
    assert len(calls) == 20 and len(message["tool_calls"]) == 16
    chat.max_tool_calls = 3
    message, calls = chat.parse_assistant(one * 20)
    assert len(message["tool_calls"]) == 3 and sum(c.error is None for c in calls) == 3


def test_the_cap_applies_to_plugin_parsers_and_a_crashing_plugin_is_an_error_call():
    @register_tool_parser("test_many")
    def many(text: str) -> tuple[str, list[ToolCall]]:
        if text == "crash":
            raise RuntimeError("bug")
        return "", [ToolCall(name="f", arguments={"i": i}) for i in range(int(text))]

    try:
        _, calls = parse_tool_calls("20", format="test_many")
        assert [c.error is None for c in calls] == [True] * 16 + [False] * 4
        content, (call,) = parse_tool_calls("crash", format="test_many")
        assert content == "crash" and "RuntimeError: bug" in call.error
    finally:
        TOOL_CALL_PARSERS.pop("test_many")


_garbage = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.lists(
        st.sampled_from(["<tool_call>", "</tool_call>", "[", "{", '"', "\\", "9" * 50, ":"]),
        max_size=60,
    ).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(_garbage, st.integers(0, 4))
def test_random_garbage_never_raises(text, max_calls):
    content, calls = parse_tool_calls(text, max_calls=max_calls)
    assert isinstance(content, str)
    assert sum(c.error is None for c in calls) <= max_calls
    assert all(c.arguments == {} for c in calls if c.error is not None)


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01\x02<tool_call>\ud800</tool_call>",
        "<tool_call>" + "\\" * 10_001,
        "<tool_call>{" + '"name":' * 10_000 + "</tool_call>",
        "<tool_call>" + '{"name": "f", "arguments": {"a": 1e999, "b": NaN}}' + "</tool_call>",
        "<tool_call>" + '{"name": "f", "arguments": {"x": ' + "1" * 4000 + "}}" + "</tool_call>",
        "</tool_call><tool_call><tool_call></tool_call></tool_call>",
    ],
)
def test_nasty_inputs_never_raise(text):
    _, calls = parse_tool_calls(text)
    assert calls
    for c in calls:  # what the env computes from a call must not raise either
        assert call_key(c) and c.signature()
