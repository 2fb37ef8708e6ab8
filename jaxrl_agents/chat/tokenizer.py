"""The tiny tokenizer shipped with the package (``jaxrl_agents/assets/tiny_tokenizer/``).

A 1280-token byte-level BPE (digits split individually) with a compact Qwen2.5/Hermes-style chat
template, built deterministically by ``scripts/build_tiny_tokenizer.py``. The demo and the tests
use it so nothing is downloaded. Special tokens (ids fixed by the build): ``<|endoftext|>`` = 0
(pad), ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 (eos and assistant stop), then the non-special
added tokens ``<tool_call>`` 3, ``</tool_call>`` 4, ``<tool_response>`` 5, ``</tool_response>`` 6.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

TINY_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def tiny_tokenizer_path() -> Path:
    """Folder of the shipped tokenizer (pass it to ``AutoTokenizer.from_pretrained``)."""
    path = Path(__file__).resolve().parents[1] / "assets" / "tiny_tokenizer"
    missing = [f for f in TINY_TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"tiny tokenizer files {missing} missing under {path}; rebuild them with "
            "`python scripts/build_tiny_tokenizer.py`"
        )
    return path


@functools.cache
def _load_cached() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_path()))


def load_tiny_tokenizer(*, cached: bool = True) -> Any:
    """The shipped tokenizer as a transformers fast tokenizer (offline; ~50 ms the first time).

    ``cached=True`` returns one shared instance per process; pass ``cached=False`` for a private
    copy you intend to mutate (e.g. to set a different ``chat_template``).
    """
    if cached:
        return _load_cached()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_path()))
