"""Fixtures of the server tests."""

import pytest

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer


@pytest.fixture(scope="session")
def chat():
    """The shipped tiny tokenizer's chat format (hermes tool calls)."""
    return ChatFormat(load_tiny_tokenizer())
