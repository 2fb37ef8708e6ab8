"""Token-in / token-out rendering of multi-turn conversations through a chat template.

A rollout's token ids are built incrementally and never re-tokenized:

1. ``prompt_ids(opening messages, tools)``: the template's rendering with the generation prompt.
2. The policy samples an assistant turn, ending with its stop token (``stop_token_ids[0]``). Those
   ids go into the trajectory as they are (loss mask 1).
3. ``continuation_ids(new messages)``: the tokens that follow the stop token in the template's
   rendering of the longer conversation: the template's tail after an assistant message (``"\\n"``
   for ChatML), the new tool/user messages, and the generation prompt. It is found by rendering a
   fixed dummy conversation ``[user, assistant]`` with and without the new messages and tokenizing
   only the string difference, so it works for any template that renders a conversation's prefix
   as a prefix of its rendering (ChatML/Qwen2.5, Llama 3, the shipped tiny template); a template
   that does not raises ``ValueError`` rather than drifting silently.

Because the stop token and the chat markup are added tokens, every piece starts and ends at a
token boundary of the full rendering, so for canonical assistant text (what
:meth:`ChatFormat.assistant_text` produces) the concatenation equals the tokenization of the final
conversation's rendering, up to the template's tail after the last stop token (tested for the tiny
and a Qwen2.5-style template). :meth:`ChatFormat.encode_conversation` builds SFT data the same
incremental way, so SFT and RL see identical token streams.

Deviation to know: the message list is a *view* of the trajectory. Sampled text that is not in
canonical form (other JSON spacing, malformed calls) keeps its sampled ids in the trajectory, while
the parsed assistant message holds the content with all call markup removed plus the valid calls.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

from jaxrl_agents.chat.templates import CHAT_TEMPLATES
from jaxrl_agents.chat.tool_calls import MAX_TOOL_CALLS, TOOL_CALL_PARSERS, parse_tool_calls
from jaxrl_agents.facts import decode_arguments
from jaxrl_agents.types import Message, ToolCall

# Sentinel contents of the dummy conversation; plain words any vocabulary encodes.
_DUMMY_USER, _DUMMY_ASSISTANT = "Hi.", "Okay."


class Encoded(NamedTuple):
    """A tokenized conversation. ``ids``/``loss_mask``: Int['T']; ``turn_spans``: one
    ``(start, end)`` per assistant turn (``end`` exclusive, stop token included)."""

    ids: list[int]
    loss_mask: list[int]
    turn_spans: list[tuple[int, int]]


class ChatFormat:
    """Renders messages to token ids through a tokenizer's chat template, and parses sampled text.

    Args:
      tokenizer: a transformers tokenizer (``apply_chat_template``, ``encode``, ``decode``).
      tool_parser: name of the tool-call format in ``TOOL_CALL_PARSERS`` (default ``hermes``).
      chat_template: template text, or a name in ``CHAT_TEMPLATES`` (``tiny``, ``qwen2.5``);
        default: the tokenizer's own ``chat_template``.
      max_tool_calls: per-turn cap :meth:`parse_assistant` applies (``None``: no cap); calls past
        it come back with ``error`` set, so the environment answers them with a tool error.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_parser: str = "hermes",
        chat_template: str | None = None,
        max_tool_calls: int | None = MAX_TOOL_CALLS,
    ):
        if tool_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"unknown tool_parser {tool_parser!r}; registered: {sorted(TOOL_CALL_PARSERS)}"
            )
        template = CHAT_TEMPLATES.get(chat_template, chat_template) if chat_template else None
        template = template or getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ValueError(
                "the tokenizer has no chat_template; pass chat_template= (template text or one of "
                f"{sorted(CHAT_TEMPLATES)})"
            )
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0 or None, got {max_tool_calls}")
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.max_tool_calls = max_tool_calls
        self.chat_template = template
        self.stop_token, stop_id = self._find_stop_token()
        eos = tokenizer.eos_token_id
        self.stop_token_ids: list[int] = [stop_id] + ([eos] if eos not in (None, stop_id) else [])
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad if pad is not None else self.stop_token_ids[-1])

    # -- rendering -------------------------------------------------------------------------
    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (tool-call arguments normalised to dicts)."""
        out = self.tokenizer.apply_chat_template(
            [_normalize(m) for m in messages],
            tools=tools or None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        if not isinstance(out, str):  # some transformers versions wrap single renders in a list
            out = out[0]
        return out

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered text (the template writes any BOS itself, so none is added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Opening messages rendered with the generation prompt: Int['T']."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation_ids(
        self, new_messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Tokens after an assistant turn's stop token: template tail + ``new_messages`` +
        generation prompt: Int['T']. See the module docstring for how it is derived."""
        dummy = [
            {"role": "user", "content": _DUMMY_USER},
            {"role": "assistant", "content": _DUMMY_ASSISTANT},
        ]
        base = self.render(dummy, tools)
        full = self.render(dummy + list(new_messages), tools, add_generation_prompt=True)
        if not full.startswith(base):
            raise ValueError(
                "chat template does not render a conversation's prefix as a prefix of its "
                "rendering, so continuation tokens cannot be derived without re-tokenizing; "
                f"rendering of [user, assistant] = {base[-200:]!r}..."
            )
        after_stop = base.rfind(self.stop_token) + len(self.stop_token)
        return self.encode(base[after_stop:] + full[len(base) :])

    def assistant_text(self, message: Message) -> str:
        """What the policy must generate for ``message`` (content + tool-call blocks exactly as
        the template renders them after the generation prompt), without the stop token."""
        head = [{"role": "user", "content": _DUMMY_USER}]
        base = self.render(head, add_generation_prompt=True)
        msg = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            msg["tool_calls"] = message["tool_calls"]
        full = self.render(head + [msg])
        if not full.startswith(base):
            raise ValueError(
                "chat template does not render an assistant message as generation prompt + text: "
                f"{full[:200]!r}"
            )
        rest = full[len(base) :]
        return rest[: rest.rfind(self.stop_token)]

    # -- parsing ---------------------------------------------------------------------------
    def parse_assistant(self, text: str) -> tuple[Message, list[ToolCall]]:
        """Sampled text (stop token stripped) -> OpenAI assistant message + all parsed calls.

        The message's ``tool_calls`` hold only the valid calls; malformed ones (``error`` set) are
        returned in the list for the environment to answer with a tool error, as are the calls past
        ``self.max_tool_calls``. Never raises.
        """
        content, calls = parse_tool_calls(
            text, format=self.tool_parser, max_calls=self.max_tool_calls
        )
        message: Message = {"role": "assistant", "content": content}
        valid = [c.to_openai() for c in calls if c.error is None]
        if valid:
            message["tool_calls"] = valid
        return message, calls

    # -- supervised data -------------------------------------------------------------------
    def encode_conversation(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> Encoded:
        """Golden token ids and loss mask for a whole conversation, built exactly as a rollout
        builds them (prompt, then per assistant turn: its text + stop token with mask 1, then the
        continuation of the following messages with mask 0)."""
        n = len(messages)
        first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), n)
        if first == 0:
            raise ValueError("conversation starts with an assistant message; it needs a prompt")
        ids = self.prompt_ids(messages[:first], tools)
        mask = [0] * len(ids)
        spans: list[tuple[int, int]] = []
        i = first
        while i < n:
            turn = self.encode(self.assistant_text(messages[i])) + [self.stop_token_ids[0]]
            spans.append((len(ids), len(ids) + len(turn)))
            ids += turn
            mask += [1] * len(turn)
            j = next((k for k in range(i + 1, n) if messages[k].get("role") == "assistant"), n)
            if j < n or j > i + 1:  # nothing follows a final assistant turn in a rollout
                cont = self.continuation_ids(messages[i + 1 : j], tools)
                ids += cont
                mask += [0] * len(cont)
            i = j
        return Encoded(ids, mask, spans)

    # -- internals -------------------------------------------------------------------------
    def _find_stop_token(self) -> tuple[str, int]:
        """The added token the template writes right after an assistant message's content."""
        text = self.render(
            [
                {"role": "user", "content": _DUMMY_USER},
                {"role": "assistant", "content": _DUMMY_ASSISTANT},
            ]
        )
        after = text[text.rfind(_DUMMY_ASSISTANT) + len(_DUMMY_ASSISTANT) :]
        added = self.tokenizer.get_added_vocab()
        matches = [t for t in added if t and after.startswith(t)]
        if not matches:
            raise ValueError(
                "cannot find the assistant stop token: the template renders "
                f"{after[:40]!r} after an assistant message, which does not start with an added "
                "token of the tokenizer"
            )
        token = max(matches, key=len)
        return token, int(added[token])


def _normalize(message: Message) -> Message:
    """Copy of ``message`` safe for any template: ``None`` content -> ``""``, OpenAI-style JSON
    string arguments -> dicts (templates ``tojson`` them)."""
    m = dict(message)
    if m.get("content") is None:
        m["content"] = ""
    if m.get("tool_calls"):
        calls = copy.deepcopy(m["tool_calls"])
        for c in calls:
            fn = c.get("function", c)
            if isinstance(fn.get("arguments"), str):
                args, error = decode_arguments(fn["arguments"])
                if error is not None:
                    raise ValueError(
                        f"tool call {fn.get('name')!r} has arguments {fn['arguments']!r}: {error}"
                    )
                fn["arguments"] = args
        m["tool_calls"] = calls
    return m
