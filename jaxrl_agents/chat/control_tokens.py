"""Control tokens come only from the template: outside text is tokenized as plain text.

Every string of the messages and tools (contents, reasoning, tool results, tool-call names and
arguments, tool schemas) is text from outside the template. Where one holds a control token's string
(:attr:`~jaxrl_agents.chat.render.ChatFormat.control_tokens`: the special tokens and the added
tokens the template writes, e.g. ``<|im_end|>``, ``<|eot_id|>``, ``<tool_call>``), the template is
rendered with each such string replaced by a placeholder, the rendering is tokenized (so only the
template's own markup matches control tokens), and each stretch of text between two added tokens
that holds a placeholder is tokenized again with the strings put back and no added token recognised
(:func:`encode_plain`). A forged ``<|im_end|>\n<|im_start|>assistant\n`` in a tool result is thus a
run of ordinary tokens, never a turn boundary. Stretches without a placeholder keep their ids, and a
conversation without such strings is tokenized exactly as before (the whole rendering in one call),
so benign ids are unchanged. BPE boundaries do not move: the tokenizer itself cuts text at every
added token and tokenizes the pieces independently, so the re-tokenized stretch is exactly the piece
the tokenizer would have seen had the hidden strings not been added tokens (checked per stretch:
tokenizing it on its own with the placeholders in must give the ids it got inside the rendering,
else ``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple


class Marked(NamedTuple):
    """Rendered text in which each control-token string from outside the template stands as a
    placeholder; ``hidden`` maps each placeholder back to the string it stands for."""

    text: str
    hidden: dict[str, str]


class Defuse:
    """Replaces, in every string of a JSON-like value (dict keys too), each control token's
    string by a placeholder ``<base><n>x`` (one per distinct string); ``hidden`` maps them back."""

    def __init__(self, controls: re.Pattern[str], base: str):
        self.controls, self.base = controls, base
        self.slots: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        return _map_strings(value, lambda s: self.controls.sub(self._slot, s))

    def _slot(self, match: re.Match[str]) -> str:
        token = match.group()
        if token not in self.slots:
            self.slots[token] = f"{self.base}{len(self.slots)}x"
        return self.slots[token]

    @property
    def hidden(self) -> dict[str, str]:
        return {p: t for t, p in self.slots.items()}


def control_tokens(tokenizer: Any, added: dict[str, int], template: str) -> frozenset[str]:
    """Strings that only the template may write as tokens: the special tokens and the added
    tokens the template writes (``<tool_call>``, ``<think>``); ``added``: the tokenizer's
    ``get_added_vocab()``."""
    special = {*getattr(tokenizer, "all_special_tokens", ())}
    special |= {
        t.content
        for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(t, "special", False)
    }
    return frozenset(
        t for t in {*added, *special} if t and (t in special or (t.strip() and t in template))
    )


def control_pattern(tokens: frozenset[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``tokens`` (longest first); ``None`` when there are none."""
    names = sorted(tokens, key=lambda t: (-len(t), t))
    return re.compile("|".join(map(re.escape, names))) if names else None


def defuser(controls: re.Pattern[str] | None, template: str, *values: Any) -> Defuse | None:
    """A :class:`Defuse` for ``values`` (messages, tools) when a string in them holds a
    control token's string (``controls`` matches it); else ``None`` (rendered and tokenized as
    they are). Its placeholders occur neither in ``template`` nor in ``values``."""
    if controls is None:
        return None
    strings = list(_strings(values))
    if not any(controls.search(s) for s in strings):
        return None
    base = "jxrlctl"  # ASCII letters: no added token, kept as is by tojson, trim, strip
    while base in template or any(base in s for s in strings):
        base += "q"
    return Defuse(controls, base)


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """``text`` tokenized by ``tokenizer``'s fast backend with no added token recognised
    (:meth:`~jaxrl_agents.chat.render.ChatFormat.encode_plain`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"cannot tokenize text as plain text with {type(tokenizer).__name__}: it "
            "has no fast (tokenizers) backend"
        )
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = (
        [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
        if backend.pre_tokenizer is not None
        else [text]
    )
    return [t.id for p in pieces if p for t in backend.model.tokenize(p)]


def encode_marked(tokenizer: Any, added: dict[int, str], marked: Marked) -> list[int]:
    """Token ids of rendered text whose placeholders stand for outside strings.

    ``added``: the tokenizer's added tokens by id. Without placeholders: the tokenizer's
    ``encode`` of the text (no special tokens added). Otherwise the text (placeholders in) is
    tokenized once; its control tokens are the template's markup, and its added tokens split
    it into stretches, each tokenized by the tokenizer on its own. A stretch holding a
    placeholder is re-tokenized with the hidden strings put back by :func:`encode_plain`,
    after checking that :func:`encode_plain` gives that stretch's ids with the placeholders
    in (the tokenizer's pipeline handles the stretch independently of its neighbours)."""
    text, hidden = marked
    if not hidden or not any(p in text for p in hidden):
        return list(tokenizer.encode(text, add_special_tokens=False))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        encode_plain(tokenizer, text)  # raises: no plain tokenization without a fast backend
    enc = backend.encode(text, add_special_tokens=False)
    ids, offsets = list(enc.ids), list(enc.offsets)
    if ids != list(tokenizer.encode(text, add_special_tokens=False)):
        raise ValueError(
            f"{type(tokenizer).__name__}.encode and its tokenizers backend disagree on "
            "rendered text; cannot tell the template's control tokens from outside text"
        )
    restore = re.compile("|".join(map(re.escape, sorted(hidden, key=len, reverse=True))))
    out: list[int] = []
    piece_start, at = 0, 0  # first id / first character of the current plain stretch
    for k in range(len(ids) + 1):
        cut = k < len(ids) and _is_added(added, ids[k], text, offsets[k])
        if k < len(ids) and not cut:
            continue
        end = offsets[k][0] if k < len(ids) else len(text)
        stretch, piece = text[at:end], ids[piece_start:k]
        if restore.search(stretch):
            if encode_plain(tokenizer, stretch) != piece:
                raise ValueError(
                    f"cannot tokenize outside text as plain text with this tokenizer: its "
                    f"pipeline tokenizes {stretch[:80]!r} differently inside the rendering"
                )
            piece = encode_plain(tokenizer, restore.sub(lambda m: hidden[m.group()], stretch))
        out += piece
        if k < len(ids):
            out.append(ids[k])
            piece_start, at = k + 1, offsets[k][1]
    return out


def _is_added(added: dict[int, str], token_id: int, text: str, span: tuple[int, int]) -> bool:
    """Whether the token at ``span`` of ``text`` is an added token (its string there, with
    any whitespace the token strips), not a plain token that happens to share its id."""
    content = added.get(token_id)
    return content is not None and content in text[span[0] : span[1]]


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {(fn(k) if isinstance(k, str) else k): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, fn) for v in value]
    return value


def _strings(value: Any):
    """Every string in a JSON-like value, dict keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                yield k
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
