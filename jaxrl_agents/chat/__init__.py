"""Chat layer: the shipped tiny tokenizer, chat templates, token-in/token-out rendering of
conversations to ids and loss masks, and tool-call parsing of sampled text."""

from jaxrl_agents.chat.messages import split_reasoning
from jaxrl_agents.chat.render import ChatFormat, Encoded
from jaxrl_agents.chat.templates import (
    CHAT_TEMPLATES,
    QWEN25_CHAT_TEMPLATE,
    TINY_CHAT_TEMPLATE,
    resolve_template,
)
from jaxrl_agents.chat.tokenizer import load_tiny_tokenizer, tiny_tokenizer_path
from jaxrl_agents.chat.tool_calls import (
    MAX_TOOL_CALLS,
    TOOL_CALL_PARSERS,
    ToolParser,
    detect_tool_parser,
    parse_tool_calls,
    register_tool_parser,
)

__all__ = [
    "CHAT_TEMPLATES",
    "MAX_TOOL_CALLS",
    "QWEN25_CHAT_TEMPLATE",
    "TINY_CHAT_TEMPLATE",
    "TOOL_CALL_PARSERS",
    "ChatFormat",
    "Encoded",
    "ToolParser",
    "detect_tool_parser",
    "load_tiny_tokenizer",
    "parse_tool_calls",
    "register_tool_parser",
    "resolve_template",
    "split_reasoning",
    "tiny_tokenizer_path",
]
