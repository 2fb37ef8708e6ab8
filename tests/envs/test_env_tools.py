"""@tool schema derivation, argument validation and ToolBox execution basics."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from jaxrl_agents.envs import Env, ToolBox, derive_tool, make_env, tool
from jaxrl_agents.envs.tools import ArgumentError, parse_docstring, truncate, validate_arguments
from jaxrl_agents.types import ToolCall, ToolErrorKind


def lookup(
    query: str,
    k: int = 5,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    weight: float = 1.0,
    verbose: bool = False,
) -> str:
    """Look things up in the index.

    Longer explanation that stays in the description.

    Args:
        query: what to look for,
            continued on a second line.
        k (int): number of hits.
        mode: search mode.
        tags: optional filters.

    Returns:
        The hits.
    """
    return f"{query}:{k}:{mode}:{tags}:{weight}:{verbose}"


def test_schema_derived_from_hints_and_docstring():
    schema = derive_tool(lookup).schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == (
        "Look things up in the index. Longer explanation that stays in the description."
    )
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "what to look for, continued on a second line.",
            },
            "k": {"type": "integer", "description": "number of hits.", "default": 5},
            "mode": {
                "type": "string",
                "enum": ["fast", "exact"],
                "description": "search mode.",
                "default": "fast",
            },
            "tags": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "optional filters.",
            },
            "weight": {"type": "number", "default": 1.0},
            "verbose": {"type": "boolean", "default": False},
        },
        "required": ["query"],
    }


def test_method_tools_skip_self_and_bind():
    class Counter(Env):
        name = "counter"

        def __init__(self, **kw):
            super().__init__(**kw)
            self.n = 0

        @tool(name="bump", description="Add to the counter.")
        def add(self, by: int) -> int:
            self.n += by
            return self.n

    env = Counter()
    [schema] = env.tools.schemas()
    assert schema["function"]["name"] == "bump"
    assert schema["function"]["parameters"]["required"] == ["by"]
    res = asyncio.run(env.tools.execute(ToolCall("bump", {"by": 3}), timeout_s=1, max_chars=100))
    assert (res.ok, res.content, env.n) == (True, "3", 3)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x: x, "needs a type hint"),
        (lambda *a: 0, r"\*args"),
    ],
)
def test_schema_errors_name_the_parameter(bad, match):
    with pytest.raises(TypeError, match=match):
        derive_tool(bad, name="bad")


def test_unsupported_type_is_rejected_at_decoration():
    with pytest.raises(TypeError, match=r"parameter 'x'.*unsupported type"):

        @tool
        def f(x: set[int]) -> None:
            """Nope."""


def test_validation():
    params = derive_tool(lookup).parameters
    assert validate_arguments(params, {"query": "a", "k": 3.0}) == {"query": "a", "k": 3}
    assert validate_arguments(params, {"query": "a", "tags": None}) == {"query": "a", "tags": None}
    cases = [
        ({}, "missing required argument"),
        ({"query": 1}, "'query' must be string"),
        ({"query": "a", "k": True}, "'k' must be integer"),
        ({"query": "a", "k": 2.5}, "'k' must be integer"),
        ({"query": "a", "mode": "slow"}, r"one of \['fast', 'exact'\]"),
        ({"query": "a", "tags": ["x", 2]}, r"'tags\[1\]' must be string"),
        ({"query": "a", "qurey": "b"}, r"unknown argument\(s\) \['qurey'\]"),
        ("query", "must be a JSON object"),
    ]
    for args, match in cases:
        with pytest.raises(ArgumentError, match=match):
            validate_arguments(params, args)


def test_docstring_parser_and_truncate():
    summary, args = parse_docstring(
        "Do it.\n\nArgs:\n    a: first.\n    b (str): second\n      more.\n"
    )
    assert summary == "Do it." and args == {"a": "first.", "b": "second more."}
    assert truncate("x" * 10, 20) == "x" * 10
    assert truncate("x" * 100, 20) == "x" * 20 + "\n...[truncated 80 chars]"


def test_toolbox_from_plain_functions_and_duplicates():
    box = ToolBox([lookup])
    res = asyncio.run(box.execute(ToolCall("lookup", {"query": "q"}), timeout_s=2, max_chars=100))
    assert res.content == "q:5:fast:None:1.0:False"
    with pytest.raises(ValueError, match="duplicate tool name 'lookup'"):
        ToolBox([lookup, lookup])
    res = asyncio.run(box.execute(ToolCall("lookup", {"k": 1}), timeout_s=2, max_chars=100))
    assert res.error_kind is ToolErrorKind.BAD_ARGUMENTS


def test_make_env_by_name_and_path_and_errors():
    assert make_env("calculator").name == "calculator"
    env = make_env("jaxrl_agents.envs.sql:SqlEnv", tool_timeout_s=3.0, max_rows=5)
    assert (env.config.tool_timeout_s, env.max_rows) == (3.0, 5)
    with pytest.raises(ValueError, match=r"unknown environment 'calc'.*'calculator'"):
        make_env("calc")
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['tool_timeout'\]"):
        make_env("calculator", tool_timeout=3)
