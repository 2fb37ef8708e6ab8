"""The shipped tiny tokenizer: loadable offline, byte-level, digit-splitting, rebuilt identically by
its script, and its chat template renders tools, tool calls and tool results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from jaxrl_agents.chat import (
    TINY_CHAT_TEMPLATE,
    ChatFormat,
    load_tiny_tokenizer,
    tiny_tokenizer_path,
)
from jaxrl_agents.chat.templates import render_template

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_tiny_tokenizer.py"
SPECIAL_IDS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 3,
    "</tool_call>": 4,
    "<tool_response>": 5,
    "</tool_response>": 6,
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


@pytest.fixture(scope="module")
def tok():
    return load_tiny_tokenizer()


def test_loads_offline_with_autotokenizer_and_has_the_special_tokens():
    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_path()))
    assert 1000 <= len(tok) <= 1500
    assert {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_IDS} == SPECIAL_IDS
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.bos_token is None
    assert tok.chat_template == TINY_CHAT_TEMPLATE
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)


def test_digits_are_single_tokens(tok):
    ids = tok.encode("There are 3071 boxes with 12 pens each.", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    digit_pieces = [p for p in pieces if any(ch.isdigit() for ch in p)]
    assert digit_pieces == list("307112")


def test_tool_tags_are_single_non_special_tokens(tok):
    text = "<tool_call>\n{}\n</tool_call><tool_response>x</tool_response>"
    ids = tok.encode(text, add_special_tokens=False)
    assert [i for i in ids if i in SPECIAL_IDS.values()] == [3, 4, 5, 6]
    # Like Qwen2.5: the tags survive skip_special_tokens, the ChatML markers do not.
    assert tok.decode(ids + [2], skip_special_tokens=True) == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60).filter(lambda s: "<" not in s))
def test_byte_level_round_trip_of_any_text(tok, text):
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_shipped_files_equal_a_fresh_deterministic_build(tmp_path):
    spec = importlib.util.spec_from_file_location("build_tiny_tokenizer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shipped = (tiny_tokenizer_path() / name).read_bytes()
        assert (tmp_path / name).read_bytes() == shipped, f"{name} is stale: rerun the build script"


CONVERSATION = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Tom has 37 boxes with 12 pens each. How many pens?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "37*12"}},
            }
        ],
    },
    {"role": "tool", "name": "calculator", "tool_call_id": "call_0", "content": "444"},
    {"role": "assistant", "content": "444"},
]
# The template's contract written out by hand: compact tool JSON in the system turn, Hermes blocks
# in the assistant turn, tool output inside a user turn.
EXPECTED = (
    "<|im_start|>system\nUse the tools.\nTools:\n"
    '{"name":"calculator","description":"Evaluate an arithmetic expression.","parameters":'
    '{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}\n'
    'Call a tool with <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nTom has 37 boxes with 12 pens each. How many pens?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "37*12"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n444\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n444<|im_end|>\n"
)


def test_template_renders_tools_calls_and_results(tok):
    hf = tok.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], tokenize=False)
    assert hf == EXPECTED
    # transformers and the build script's own jinja renderer agree (the corpus saw this text).
    assert render_template(TINY_CHAT_TEMPLATE, CONVERSATION, tools=[CALC_TOOL]) == EXPECTED
    gen = tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert gen.endswith("How many pens?<|im_end|>\n<|im_start|>assistant\n")
    assert "Tools:" not in gen  # no tools -> no tool section


def test_template_parses_back_to_the_same_calls(tok):
    chat = ChatFormat(tok)
    text = tok.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], tokenize=False)
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    message, calls = chat.parse_assistant(turn)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "37*12"}, None)
    ]
    assert message["content"] == "" and message["tool_calls"][0]["function"]["name"] == "calculator"


def test_calculator_prompt_fits_the_tiny_context(tok):
    chat = ChatFormat(tok)
    ids = chat.prompt_ids(CONVERSATION[:2], [CALC_TOOL])
    # Tiny model context is ~384 tokens; the opening prompt must leave most of it for the episode.
    assert len(ids) <= 110, len(ids)
