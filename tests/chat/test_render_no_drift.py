"""No drift: ids built incrementally (prompt, sampled turns + stop, continuations) equal the
template's rendering of the final message list, for the tiny and a Qwen2.5-style template, and the
loss mask covers exactly the assistant-generated tokens."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, desc, props in [
        (
            "search",
            "Search the documents.",
            {"query": {"type": "string"}, "k": {"type": "integer"}},
        ),
        ("open", "Open a document.", {"doc_id": {"type": "string"}}),
    ]
]


def call(name: str, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "Answer with sources."},
    {"role": "user", "content": "Which city was the founder of Acme born in?"},
    {
        "role": "assistant",
        "content": "Let me search.",
        "tool_calls": [
            call("search", {"query": "Acme founder", "k": 2}),
            call("open", '{"doc_id": "d3"}'),
        ],
    },
    {
        "role": "tool",
        "name": "search",
        "tool_call_id": "call_0",
        "content": "d3: Acme was founded by Ana.",
    },
    {
        "role": "tool",
        "name": "open",
        "tool_call_id": "call_1",
        "content": "Ana was born in Oslo in 1961.",
    },
    {"role": "assistant", "content": None, "tool_calls": [call("open", {"doc_id": "d9"})]},
    {
        "role": "tool",
        "name": "open",
        "tool_call_id": "call_0",
        "content": "Error: unknown doc 'd9'",
    },
    {"role": "user", "content": "Please cite the document id."},
    {"role": "assistant", "content": "Oslo [d3]"},
]


@pytest.fixture(scope="module", params=["tiny", "qwen2.5"])
def chat(request):
    return ChatFormat(load_tiny_tokenizer(), chat_template=request.param)


def reference_ids(chat: ChatFormat, messages, *, add_generation_prompt: bool) -> list[int]:
    """transformers' own tokenized rendering (v5 returns a BatchEncoding, v4 a list)."""
    out = chat.tokenizer.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=chat.chat_template,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    as_text = chat.tokenizer.apply_chat_template(
        messages,
        tools=TOOLS,
        chat_template=chat.chat_template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert list(ids) == chat.tokenizer.encode(as_text, add_special_tokens=False)
    return list(ids)


def expected_mask(chat: ChatFormat, ids: list[int]) -> list[int]:
    """Independent reference: 1 from the token after ``<|im_start|>assistant\\n`` up to and
    including the next ``<|im_end|>`` (both templates are ChatML)."""
    tok = chat.tokenizer
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    header = [start] + tok.encode("assistant\n", add_special_tokens=False)
    mask, inside = [0] * len(ids), False
    for i, t in enumerate(ids):
        if inside:
            mask[i] = 1
            inside = t != end
        elif ids[i + 1 - len(header) : i + 1] == header:
            inside = True
    return mask


def _normalized(messages):
    # Reference renders need dict arguments (what ChatFormat normalises OpenAI JSON strings to).
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                call(c["function"]["name"], json.loads(c["function"]["arguments"]))
                if isinstance(c["function"]["arguments"], str)
                else c
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def test_conversation_ending_with_an_answer_has_no_drift(chat):
    enc = chat.encode_conversation(CONVERSATION, TOOLS)
    ref = reference_ids(chat, _normalized(CONVERSATION), add_generation_prompt=False)
    n = len(enc.ids)
    assert ref[:n] == enc.ids
    # A rollout ends at the last stop token; the template's tail after it is never sampled.
    assert chat.tokenizer.decode(ref[n:]) == "\n"
    assert enc.loss_mask == expected_mask(chat, ref)[:n]
    assert len(enc.turn_spans) == 3
    for s, e in enc.turn_spans:
        assert enc.ids[e - 1] == chat.stop_token_ids[0] and set(enc.loss_mask[s:e]) == {1}
    assert sum(enc.loss_mask) == sum(e - s for s, e in enc.turn_spans)


def test_conversation_ending_with_tool_results_has_no_drift(chat):
    messages = CONVERSATION[:7]
    enc = chat.encode_conversation(messages, TOOLS)
    ref = reference_ids(chat, _normalized(messages), add_generation_prompt=True)
    assert enc.ids == ref
    assert enc.loss_mask == expected_mask(chat, ref)


def test_rollout_loop_with_parsed_messages_has_no_drift(chat):
    """The orchestrator's loop: sampled ids are kept, the message list is rebuilt from *parsed*
    sampled text, and its final rendering still matches the ids."""
    tok = chat.tokenizer
    stop = chat.stop_token_ids[0]
    messages = CONVERSATION[:2]
    ids = chat.prompt_ids(messages, TOOLS)
    i = 2
    while i < len(CONVERSATION):
        sampled = tok.encode(chat.assistant_text(CONVERSATION[i]), add_special_tokens=False) + [
            stop
        ]
        text = tok.decode(
            [t for t in sampled if t not in chat.stop_token_ids], skip_special_tokens=False
        )
        message, calls = chat.parse_assistant(text)
        assert all(c.error is None for c in calls)
        messages.append(message)
        ids += sampled
        j = next(
            (k for k in range(i + 1, len(CONVERSATION)) if CONVERSATION[k]["role"] == "assistant"),
            len(CONVERSATION),
        )
        if j > i + 1:
            messages += CONVERSATION[i + 1 : j]
            ids += chat.continuation_ids(CONVERSATION[i + 1 : j], TOOLS)
        i = j
    ref = reference_ids(chat, messages, add_generation_prompt=False)
    assert ref[: len(ids)] == ids and tok.decode(ref[len(ids) :]) == "\n"


_text = st.text(st.characters(codec="utf-8", exclude_characters="<"), min_size=1, max_size=20)
# Assistant text starts with a non-space: a whitespace run across the "assistant\n" boundary
# pre-tokenizes differently in one piece (the policy's own tokens are kept either way).
_assistant = _text.filter(lambda s: not s[0].isspace() and s == s.strip())


@settings(max_examples=40, deadline=None)
@given(
    user=_text,
    tool_out=st.lists(_text, min_size=1, max_size=2),
    first=_assistant,
    answer=_assistant,
)
def test_no_drift_for_arbitrary_message_text(user, tool_out, first, answer):
    chat = ChatFormat(load_tiny_tokenizer())
    messages = [
        {"role": "user", "content": user},
        {
            "role": "assistant",
            "content": first,
            "tool_calls": [call("search", {"query": user, "k": 1})],
        },
        *[{"role": "tool", "content": t} for t in tool_out],
        {"role": "assistant", "content": answer},
    ]
    enc = chat.encode_conversation(messages, TOOLS)
    ref = reference_ids(chat, messages, add_generation_prompt=False)
    assert ref[: len(enc.ids)] == enc.ids and chat.tokenizer.decode(ref[len(enc.ids) :]) == "\n"
    assert enc.loss_mask == expected_mask(chat, ref)[: len(enc.ids)]


def test_stop_and_pad_ids(chat):
    assert chat.stop_token == "<|im_end|>" and chat.stop_token_ids == [2] and chat.pad_id == 0
    # A base-model style tokenizer (eos != the template's stop token) stops on both.
    tok = load_tiny_tokenizer(cached=False)
    tok.eos_token, tok.pad_token = "<|endoftext|>", None
    base = ChatFormat(tok, chat_template=chat.chat_template)
    assert base.stop_token_ids == [2, 0] and base.pad_id == 0


def test_history_rewriting_template_renders_only_the_new_messages():
    # Renders the message count in the header: a longer conversation changes earlier text, so
    # re-rendering would not be what was sampled; the continuation is the text after the turn.
    rewriting = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = ChatFormat(load_tiny_tokenizer(), chat_template=rewriting, tool_parser="hermes")
    assert chat.rewrites_history
    assert not ChatFormat(load_tiny_tokenizer()).rewrites_history
    ids = chat.continuation_ids([{"role": "user", "content": "more"}])
    assert (
        chat.tokenizer.decode(ids) == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    )


def test_configuration_errors_name_the_value():
    tok = load_tiny_tokenizer(cached=False)
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"no chat_template.*'qwen2.5'"):
        ChatFormat(tok)
    no_stop = "{% for m in messages %}{{ m.content }}|{% endfor %}"
    with pytest.raises(ValueError, match="stop token"):
        ChatFormat(tok, chat_template=no_stop, tool_parser="hermes")
    with pytest.raises(ValueError, match="auto cannot tell.*matches none"):
        ChatFormat(tok, chat_template=no_stop)
    with pytest.raises(ValueError, match="starts with an assistant"):
        ChatFormat(load_tiny_tokenizer()).encode_conversation(
            [{"role": "assistant", "content": "x"}]
        )
    with pytest.raises(ValueError, match="not JSON"):
        ChatFormat(load_tiny_tokenizer()).prompt_ids(
            [{"role": "assistant", "content": "", "tool_calls": [call("open", "{oops")]}]
        )
