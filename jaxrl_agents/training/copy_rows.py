"""Synthetic copy rows for the first SFT steps of a freshly initialised model
(``trainer.sft.copy_steps``).

A model trained from random weights has none of the in-context copying (induction heads) that any
pretrained checkpoint has, and tool use is mostly copying: an entity from the question into a
search, a date into a query, an id from a result into the next call. On golden trajectories alone
the tiny demo model learns the template in ~100 steps and then guesses every copied token from its
prior: research's first search copies none of the question's names after 800 steps, and sql's date
copies appear only after ~1000 steps, in two seeds of four never (EXPERIMENTS.md).

Each row is ``COPY_LEN`` random tokens from the tokenizer's ordinary vocabulary (no special or
added token): ``a + s + b + s``, where ``s`` is a run of ``MIN_SPAN`` to ``COPY_LEN // 2`` tokens
and ``a``, ``b`` split the rest at random, so the distance between the two copies varies and only a
content-keyed copy (an induction head) predicts the repeat. The loss mask covers the second ``s``
after its first token, the only tokens predictable from the context.

What the shape is from (EXPERIMENTS.md, the tiny 2 x 128 model, 32 rows a step, lr 1e-3): on rows
of 64 tokens from the whole vocabulary the repeat's token accuracy jumps from ~0.02 to 0.98
between steps 400 and 500 (~70 s on 2 CPU cores). On rows of 256 tokens it stayed at chance for
1000 steps; from a 64-token vocabulary the circuit forms but copies none of the other tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COPY_LEN = 64
"""Tokens per copy row."""

MIN_SPAN = 4
"""Shortest repeated run."""


def ordinary_ids(tokenizer: Any) -> np.ndarray:
    """The token ids of ``tokenizer``'s vocabulary that are neither special nor added tokens."""
    special = set(getattr(tokenizer, "all_special_ids", ()))
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids = np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)
    if ids.size < 2:
        raise ValueError(f"the tokenizer has {ids.size} ordinary token ids: no copy rows possible")
    return ids


def copy_rows(
    rng: np.random.Generator, vocab: np.ndarray, n: int, length: int = COPY_LEN
) -> list[tuple[list[int], list[int]]]:
    """``n`` rows of ``length`` tokens, each ``(ids, loss_mask)`` as golden SFT rows are: random
    ``a + s + b + s`` with the mask on the repeated ``s`` but its first token."""
    if length < 2 * MIN_SPAN:
        raise ValueError(f"length={length}: copy rows need at least {2 * MIN_SPAN} tokens")
    rows = []
    for _ in range(n):
        span = int(rng.integers(MIN_SPAN, length // 2 + 1))
        s = rng.choice(vocab, span).tolist()
        rest = rng.choice(vocab, length - 2 * span).tolist()
        cut = int(rng.integers(0, len(rest) + 1))
        ids = rest[:cut] + s + rest[cut:] + s
        mask = [0] * (length - span + 1) + [1] * (span - 1)
        rows.append((ids, mask))
    return rows
