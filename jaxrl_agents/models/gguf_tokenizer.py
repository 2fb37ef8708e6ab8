"""A GGUF file's tokenizer as a fast Hugging Face tokenizer, and its stop ids.

Built from the ``tokenizer.ggml.*`` metadata through transformers' GGUF tokenizer builders, with
digits split one by one for the pre-tokenizers that llama.cpp splits that way (``smollm``,
``starcoder``, ...), and the file's ``tokenizer.chat_template``. The stop ids are the file's eos
(and eot/eom) ids plus the chat template's end-of-turn token (e.g. ``<|im_end|>``) when it is
another one.
"""

from __future__ import annotations

from typing import Any

from tokenizers import pre_tokenizers

from jaxrl_agents.models.gguf_file import GGUFError, metadata

_TOKENIZER_KEYS = {  # tokenizer.<key> -> transformers' GGUF tokenizer-dict name
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap",
    "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
_SPECIAL_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
"""``tokenizer.ggml.pre`` values whose llama.cpp pre-tokenizer splits every digit on its own
before the GPT-2 split (as the original tokenizers' ``Digits(individual_digits=True)`` does)."""
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")
"""End-of-turn tokens: added to the eos list when the chat template writes them."""


def _tokenizer_builder():
    # Imported on use: importing transformers costs ~1.2 s (3.6 s with AutoTokenizer), paid only
    # when a .gguf file is converted, not by every import of jaxrl_agents.models.
    try:  # transformers >= 5
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:  # transformers 4.x
        from transformers.integrations.ggml import convert_gguf_tokenizer
    return convert_gguf_tokenizer


def build_tokenizer(reader, arch: str, hf: dict[str, Any]):
    """A fast tokenizer of the file's ``tokenizer.*`` metadata: vocabulary, merges, special and
    control tokens, pre-tokenizer, bos/eos/unk/pad and the chat template."""
    # Imported on use: ~1.2 s (see _tokenizer_builder).
    from transformers import PreTrainedTokenizerFast

    tok_dict = {
        name: metadata(reader, f"tokenizer.{key}")
        for key, name in _TOKENIZER_KEYS.items()
        if f"tokenizer.{key}" in reader.fields
    }
    if "tokens" not in tok_dict:
        raise GGUFError("the GGUF file has no tokenizer (tokenizer.ggml.tokens is missing)")
    try:
        backend, extra = _tokenizer_builder()(arch, tok_dict)
    except (ValueError, KeyError, NotImplementedError) as e:
        kind = tok_dict.get("tokenizer_type")
        raise GGUFError(
            f"cannot build the GGUF file's tokenizer (tokenizer.ggml.model={kind!r}): {e}"
        ) from e
    if tok_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    tokens = tok_dict["tokens"]
    kwargs: dict[str, Any] = dict(extra or {})
    for name, key in _SPECIAL_KEYS.items():
        idx = metadata(reader, f"tokenizer.ggml.{key}", None)
        if idx is not None and 0 <= int(idx) < len(tokens):
            kwargs[name] = tokens[int(idx)]
    for key in ("add_bos_token", "add_eos_token"):
        flag = metadata(reader, f"tokenizer.ggml.{key}", None)
        if flag is not None:
            kwargs[key] = bool(flag)
    template = metadata(reader, "tokenizer.chat_template", None)
    if template:
        kwargs["chat_template"] = template
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=hf["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def eos_ids(reader, tokenizer: Any) -> list[int]:
    """Every id that ends generation: the file's eos, eot and eom ids, then the end-of-turn
    tokens (``<|im_end|>``, ``<|eot_id|>``, ...) its chat template writes."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = metadata(reader, f"tokenizer.ggml.{key}", None)
        if v is not None:
            ids.append(int(v))
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    ids += [int(vocab[t]) for t in _END_OF_TURN if t in template and t in vocab]
    return list(dict.fromkeys(ids))
