"""Token-in / token-out rendering of multi-turn conversations through a chat template.

A rollout's token ids are built incrementally and never re-tokenized:

1. ``prompt_ids(opening messages, tools)``: the template's rendering with the generation prompt.
2. The policy samples an assistant turn, ending with its stop token (``stop_token_ids[0]``). Those
   ids go into the trajectory as they are (loss mask 1).
3. ``continuation_ids(new messages)``: the tokens that follow the stop token in the template's
   rendering of the longer conversation: the template's tail after an assistant message (``"\\n"``
   for ChatML), the new tool/user messages, and the generation prompt. It is found by rendering a
   fixed dummy conversation ``[user, assistant, *new messages]`` and tokenizing only the text after
   the dummy assistant's stop token.

Because the stop token and the chat markup are added tokens, every piece starts and ends at a
token boundary of the full rendering, so for canonical assistant text (what
:meth:`ChatFormat.assistant_text` produces) and a template that renders a conversation's prefix as
a prefix of its rendering (ChatML/Qwen2.5, Llama 3.x, the shipped tiny template) the concatenation
equals the tokenization of the final conversation's rendering, up to the template's tail after the
last stop token (tested). :meth:`ChatFormat.encode_conversation` builds SFT data the same
incremental way, so SFT and RL see identical token streams.

**History-rewriting templates** (``ChatFormat.rewrites_history``; Qwen3 drops the ``<think>`` blocks
of earlier assistant turns and gives the final one an empty block): re-rendering the grown
conversation through such a template is not what the policy sampled from, so nothing here ever
re-renders it. The trajectory keeps the sampled ids verbatim, and only the *new* messages are
rendered, as a continuation of them (step 3 needs only the text after one assistant turn, not a
prefix-preserving template). The training ids therefore equal what the sampler saw, turn by turn:
the log-probs the update recomputes are of the context the behaviour policy really had, not of a
rewritten history it never saw (which would make every later turn off-policy by an unmeasured
amount). The price: a long conversation served later by an inference server that re-renders the
history each request shows the model less of its own earlier reasoning than training did. SFT
data (``encode_conversation``) is built the same way, each assistant turn rendered as the template
renders a final one (with its think block), so SFT and RL agree. Sampled ``<think>`` content is kept
in the parsed message as ``reasoning_content`` (the trajectory record), and only the text after it
is parsed for tool calls and handed to the environment.

**Control tokens come only from the template.** A string of the messages or tools that holds a
control token's string (``<|im_end|>``, ``<tool_call>``) is tokenized as plain text, never as the
control token: see :mod:`jaxrl_agents.chat.control_tokens`. Message normalisation and the split of
a sampled turn's reasoning live in :mod:`jaxrl_agents.chat.messages`.

Deviation to know: the message list is a *view* of the trajectory. Sampled text that is not in
canonical form (other JSON spacing, malformed calls) keeps its sampled ids in the trajectory, while
the parsed assistant message holds the content with all call markup removed plus the valid calls.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from jaxrl_agents.chat.control_tokens import (
    Defuse,
    Marked,
    control_pattern,
    control_tokens,
    defuser,
    encode_marked,
    encode_plain,
)
from jaxrl_agents.chat.messages import (
    THINK_CLOSE,
    call_pair,
    has_inline_reasoning,
    normalize,
    split_inline_reasoning,
    split_reasoning,
)
from jaxrl_agents.chat.templates import CHAT_TEMPLATES, resolve_template
from jaxrl_agents.chat.tool_calls import (
    MAX_TOOL_CALLS,
    TOOL_CALL_PARSERS,
    detect_tool_parser,
    parse_tool_calls,
)
from jaxrl_agents.types import Message, ToolCall

__all__ = ["ChatFormat", "Encoded", "split_reasoning"]

_END_OF_TURN = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
)
"""Tokens that end a turn when the template writes them (Llama 3.x ends a tool-call turn with
``<|eom_id|>`` in ipython mode and others with ``<|eot_id|>``: both stop)."""

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
      tool_parser: name of the tool-call format in ``TOOL_CALL_PARSERS`` (``hermes``,
        ``llama3_json``, or a registered one), or ``auto`` (default): the one format the template
        renders (:func:`~jaxrl_agents.chat.tool_calls.detect_tool_parser`; ``ValueError`` when
        that is ambiguous).
      chat_template: template text, a name in ``CHAT_TEMPLATES`` (``tiny``, ``qwen2.5``) or the
        path of a template file; default: the tokenizer's own ``chat_template``.
      max_tool_calls: per-turn cap :meth:`parse_assistant` applies (``None``: no cap); calls past
        it come back with ``error`` set, so the environment answers them with a tool error.
      thinking: the template's ``enable_thinking`` switch (Qwen3: ``False`` prompts with an empty
        think block, so the policy answers directly); ``None`` leaves the template's default. A
        template without the switch rejects a bool.
      extra_stop_ids: more ids that end an assistant turn (a checkpoint's ``generation_config``
        eos list, e.g. Qwen's ``<|endoftext|>``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tool_parser: str = "auto",
        chat_template: str | None = None,
        max_tool_calls: int | None = MAX_TOOL_CALLS,
        thinking: bool | None = None,
        extra_stop_ids: Sequence[int] = (),
    ):
        if chat_template and ("{%" in chat_template or "{{" in chat_template):
            template = chat_template  # template text itself
        elif chat_template:
            template = resolve_template(chat_template)
        else:
            template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ValueError(
                "the tokenizer has no chat_template; pass chat_template= (template text, a file, "
                f"or one of {sorted(CHAT_TEMPLATES)})"
            )
        if tool_parser == "auto":
            tool_parser = detect_tool_parser(template)
        if tool_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"unknown tool_parser {tool_parser!r}; registered: "
                f"{sorted(TOOL_CALL_PARSERS)} (or auto)"
            )
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0 or None, got {max_tool_calls}")
        if thinking is not None and "enable_thinking" not in template:
            raise ValueError(
                f"thinking={thinking}: the chat template has no enable_thinking switch "
                "(leave it null)"
            )
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.max_tool_calls = max_tool_calls
        self.chat_template = template
        self.thinking = thinking
        self.template_kwargs: dict[str, Any] = (
            {} if thinking is None else {"enable_thinking": thinking}
        )
        self.reasoning = THINK_CLOSE in template
        """Whether sampled turns are split into ``reasoning_content`` and content (templates
        that know ``<think>`` blocks)."""
        added = tokenizer.get_added_vocab()
        self._added: dict[int, str] = {int(i): t for t, i in added.items() if t}
        """Added tokens by id (the tokenizer matches their strings before any other piece)."""
        self.control_tokens: frozenset[str] = control_tokens(tokenizer, added, template)
        """Strings that only the template may write as tokens: the special tokens and the added
        tokens the template writes (``<tool_call>``, ``<think>``). In text from outside the
        template they are tokenized as plain text; other added tokens (vocabulary extensions
        such as whitespace runs) are tokenized there as always."""
        self._controls = control_pattern(self.control_tokens)
        self.stop_token, stop_id = self._find_stop_token()
        ends = [int(added[t]) for t in _END_OF_TURN if t in added and t in template]
        eos = tokenizer.eos_token_id
        ids = [stop_id, *([] if eos is None else [int(eos)]), *ends, *map(int, extra_stop_ids)]
        self.stop_token_ids: list[int] = list(dict.fromkeys(ids))
        """The template's assistant stop first (what SFT data and scripted turns end with),
        then every other id that ends a turn."""
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad if pad is not None else self.stop_token_ids[-1])
        self.single_call_turns = self._single_call_turns()
        """Whether the template renders at most one tool call per assistant turn (Llama 3.1
        raises on more; scripted multi-call turns are then issued one call per turn)."""
        self.rewrites_history = self._rewrites_history()
        """Whether the template re-renders earlier turns once the conversation grows (Qwen3
        drops earlier reasoning): then a re-rendered conversation is not what was sampled, and
        only the token-in/token-out record is."""

    # -- rendering -------------------------------------------------------------------------
    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (tool-call arguments normalised to dicts)."""
        return self._apply([normalize(m) for m in messages], tools, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered text (the template writes any BOS itself, so none is added); every
        added-token string in ``text`` becomes its control id."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_plain(self, text: str) -> list[int]:
        """Tokenize ``text`` as plain text: no added token is recognised, so ``"<|im_end|>"``
        becomes ordinary tokens (for special tokens the same ids as transformers'
        ``split_special_tokens=True``; non-special added tokens such as ``<tool_call>`` are split
        too). Runs the fast tokenizer's normalizer, pre-tokenizer and model, the pipeline every
        piece of text between added tokens goes through."""
        return encode_plain(self.tokenizer, text)

    def prompt_ids(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Opening messages rendered with the generation prompt: Int['T']."""
        defuse = defuser(self._controls, self.chat_template, messages, tools)
        msgs, tls = self._prepare(messages, tools, defuse)
        text = self._apply(msgs, tls, True)
        return encode_marked(
            self.tokenizer, self._added, Marked(text, defuse.hidden if defuse else {})
        )

    def continuation_ids(
        self, new_messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Tokens after an assistant turn's stop token: template tail + ``new_messages`` +
        generation prompt: Int['T']. See the module docstring for how it is derived."""
        return encode_marked(
            self.tokenizer, self._added, self._continuation(list(new_messages), tools)
        )

    def _continuation(
        self, new: list[Message], tools: list[dict[str, Any]] | None, *, hide: bool = True
    ) -> Marked:
        user = {"role": "user", "content": _DUMMY_USER}
        msgs = [user, {"role": "assistant", "content": _DUMMY_ASSISTANT}, *new]
        defuse = defuser(self._controls, self.chat_template, new, tools) if hide else None
        msgs, tls = self._prepare(msgs, tools, defuse)
        full = self._apply(msgs, tls, True)
        head = self._apply(msgs[:1], tls, False)
        at = full.find(_DUMMY_ASSISTANT, len(os.path.commonprefix([head, full])))
        stop = -1 if at < 0 else full.find(self.stop_token, at + len(_DUMMY_ASSISTANT))
        if stop < 0:
            raise ValueError(
                "cannot find where an assistant turn ends in the chat template's rendering of "
                f"[user, assistant, ...]: {full[-300:]!r}"
            )
        return Marked(full[stop + len(self.stop_token) :], defuse.hidden if defuse else {})

    def assistant_text(self, message: Message) -> str:
        """What the policy must generate for ``message`` (content + tool-call blocks exactly as
        the template renders them after the generation prompt), without the stop token."""
        return self._assistant(message, hide=False).text

    def assistant_ids(self, message: Message) -> list[int]:
        """:meth:`assistant_text` tokenized with the template's markup as control tokens and the
        message's own strings (content, reasoning, tool-call names and arguments) as plain text:
        Int['T'], without the stop token."""
        return encode_marked(self.tokenizer, self._added, self._assistant(message))

    def _assistant(self, message: Message, *, hide: bool = True) -> Marked:
        head = [{"role": "user", "content": _DUMMY_USER}]
        base = self.render(head, add_generation_prompt=True)
        msg = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            msg["tool_calls"] = message["tool_calls"]
        if message.get("reasoning_content") is not None:
            msg["reasoning_content"] = message["reasoning_content"]
        defuse = defuser(self._controls, self.chat_template, [msg]) if hide else None
        msgs, _ = self._prepare([*head, msg], None, defuse)
        full = self._apply(msgs, None, False)
        if not full.startswith(base):
            raise ValueError(
                "chat template does not render an assistant message as generation prompt + text"
                f"{' (thinking=false with reasoning_content?)' if self.thinking is False else ''}"
                f": {full[-200:]!r}"
            )
        rest = full[len(base) :]
        return Marked(rest[: rest.rfind(self.stop_token)], defuse.hidden if defuse else {})

    def _apply(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for already normalised ``messages``."""
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        if not isinstance(out, str):  # some transformers versions wrap single renders in a list
            out = out[0]
        return out

    def _prepare(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        defuse: Defuse | None,
    ) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """Normalised ``messages`` and ``tools``, with ``defuse``'s placeholders in their strings.

        An assistant message whose content carries its reasoning inline (``<think>...</think>``,
        no ``reasoning_content``) is first split into the two fields when the template renders
        that split to the same text (Qwen3 splits it itself): the think block's tags are then the
        template's markup, and only what is inside and after it is outside text."""
        msgs = [normalize(m) for m in messages]
        if defuse is None:
            return msgs, tools
        if self.reasoning and any(has_inline_reasoning(m) for m in msgs):
            split = [split_inline_reasoning(m) for m in msgs]
            try:
                same = self._apply(split, tools, False) == self._apply(msgs, tools, False)
            except Exception:  # noqa: BLE001 - a template that renders only the inline form
                same = False
            if same:
                msgs = split
        return defuse(msgs), defuse(tools)

    def check_round_trip(self, message: Message) -> str | None:
        """``None`` when parsing what the template renders for assistant ``message`` gives its
        tool calls back (and, for a turn without calls, its content); else the reason, naming
        the rendered text and what the parser read from it."""
        text = self.assistant_text(message)
        parsed, calls = self.parse_assistant(text)
        want = [call_pair(c) for c in message.get("tool_calls") or []]
        got = [(c.name, c.arguments) for c in calls if c.error is None]
        if want != got:
            errors = [c.error for c in calls if c.error]
            return (
                f"it renders the call(s) {[n for n, _ in want]} as {text[-160:]!r}, from which the "
                f"{self.tool_parser!r} parser reads {len(got)} call(s) {[n for n, _ in got]}"
                + (f" ({errors[0]})" if errors else "")
            )
        if (
            not want
            and (parsed.get("content") or "").strip() != (message.get("content") or "").strip()
        ):
            return (
                f"it renders an answer as {text[-160:]!r}, which the {self.tool_parser!r} parser "
                f"reads as content {parsed.get('content')!r:.120}"
            )
        return None

    # -- parsing ---------------------------------------------------------------------------
    def parse_assistant(self, text: str) -> tuple[Message, list[ToolCall]]:
        """Sampled text (stop token stripped) -> OpenAI assistant message + all parsed calls.

        The message's ``tool_calls`` hold only the valid calls; malformed ones (``error`` set) are
        returned in the list for the environment to answer with a tool error, as are the calls past
        ``self.max_tool_calls``. Never raises.
        """
        reasoning, body = split_reasoning(text) if self.reasoning else (None, text)
        content, calls = parse_tool_calls(
            body, format=self.tool_parser, max_calls=self.max_tool_calls
        )
        message: Message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
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
            turn = self.assistant_ids(messages[i]) + [self.stop_token_ids[0]]
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

    def _single_call_turns(self) -> bool:
        call = {"type": "function", "function": {"name": "f", "arguments": {}}}
        try:
            self.assistant_text({"role": "assistant", "content": "", "tool_calls": [call, call]})
        except Exception:  # noqa: BLE001 - the template refuses two calls in one turn
            return True
        return False

    def _rewrites_history(self) -> bool:
        user = {"role": "user", "content": _DUMMY_USER}
        turn = [user, {"role": "assistant", "content": _DUMMY_ASSISTANT}]
        try:
            base = self.render(turn)
            more = self.render([*turn, {"role": "user", "content": _DUMMY_USER}])
        except Exception:  # noqa: BLE001 - a template that cannot render this probe
            return True
        return not more.startswith(base)
