"""Configuration records of the sampler engine: what to sample (per request) and how to batch.

``SamplingParams`` (a ``Sampling`` distribution plus the request's length, stops and seed)
travels with every ``Session.generate`` call; ``EngineConfig`` fixes the shapes that are compiled
once (slots, per-slot cache length, prefill buckets, decode chunk) and the scheduling policy
(prefix sharing, chunked prefill). Both validate eagerly so a typo fails at construction, not at
trace time.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

FinishReason = Literal["stop", "length", "cache_full"]


def check_sampling(x, *, greedy_ok: bool = True) -> None:
    """The one range check of sampling settings (anything with ``temperature``, ``top_k``,
    ``top_p``, ``min_p``: ``Sampling`` (``rollout.sampling``) and ``SamplingParams``, the
    learner's sampling transform)."""
    if greedy_ok and x.temperature < 0:
        raise ValueError(f"temperature={x.temperature} must be >= 0 (0 = greedy)")
    if not greedy_ok and not x.temperature > 0:
        raise ValueError(
            f"temperature={x.temperature} must be > 0 (greedy has no sampling "
            "distribution: use None, the temperature-1 policy)"
        )
    if x.top_k < 0:
        raise ValueError(f"top_k={x.top_k} must be >= 0 (0 = no top-k filter)")
    if not 0.0 < x.top_p <= 1.0:
        raise ValueError(f"top_p={x.top_p} must be in (0, 1] (1 = no top-p filter)")
    if not 0.0 <= x.min_p < 1.0:
        raise ValueError(f"min_p={x.min_p} must be in [0, 1) (0 = no min-p filter)")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The distribution a turn is sampled from: temperature and the filters, applied in the order
    temperature -> top-k -> top-p -> min-p. The record a config holds (``rollout.sampling``);
    :class:`SamplingParams` adds what one request needs besides."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose mass reaches top_p; 1 keeps all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's; 0 keeps all."""

    def __post_init__(self) -> None:
        check_sampling(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def changes_distribution(self) -> bool:
        """True when the sampling distribution differs from the policy's (T=1, unfiltered)."""
        return (
            self.greedy
            or self.temperature != 1.0
            or self.top_k > 0
            or self.top_p < 1.0
            or self.min_p > 0.0
        )


@dataclasses.dataclass(frozen=True)
class SamplingParams(Sampling):
    """How to sample one turn: the :class:`Sampling` distribution (its fields first, same order)
    and the request's length, stops and seed."""

    max_new_tokens: int = 64
    """At most this many tokens are generated in the turn (finish reason ``length``)."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these ids is sampled (it is returned, reason ``stop``)."""
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    """Generation ends once the generated tokens end with one of these id sequences (reason
    ``stop``; the sequence is returned). Matched within this turn's generated tokens."""
    seed: int = 0
    """Request key = PRNGKey(seed); the key of a token is fold_in(request key, its position)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        seqs = tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences)
        if any(not seq or min(seq) < 0 for seq in seqs):
            raise ValueError(f"stop_sequences={self.stop_sequences}: need non-empty id sequences")
        object.__setattr__(self, "stop_sequences", seqs)


@dataclasses.dataclass
class GenerationResult:
    """One turn's output. ``logprobs`` are under the policy (temperature 1, unfiltered).
    ``sampling_logprobs`` are under the distribution actually sampled from (temperature +
    filters), present only when that differs and is not greedy: the behaviour logprobs the
    rollout stores for training."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    sampling_logprobs: list[float] | None = None


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Compiled shapes of the engine: one prefill program per (length, row) bucket, one decode
    program per (window (+ the full cache), row bucket), one fork program with ``share_prefixes``;
    ``Engine.compile_count`` stays within that bound."""

    max_slots: int = 8
    """Concurrent sessions (rows of the KV cache); a session holds its slot until closed."""
    max_seq_len: int = 1024
    """Most tokens a session's context may hold (prompt + all turns + tool results)."""
    prefill_buckets: tuple[int, ...] = (16, 64, 256)
    """Token-length buckets of prefill dispatches; longer inputs are prefilled in several chunks."""
    decode_chunk: int = 16
    """Most decode steps per dispatch (one jitted while_loop); new requests join between chunks."""
    decode_windows: tuple[int, ...] | None = None
    """Attention-window buckets of the decode program (one program each, plus the full cache):
    a chunk attends over the smallest window holding every active row's context + the chunk.
    None: 128, 192, 256, 384, 512, 768, ... up to the largest worth its copy: a windowed chunk
    copies the window out of the cache and back (~4 steps' worth of reading it), so a window
    ``w`` is kept only while ``decode_chunk * (max_seq_len - w) > 4 * w`` (the reads it saves
    exceed the copy; 768 of an 832-token cache costs more than the full cache). (): always the
    full cache."""
    max_stop_ids: int = 8
    """Capacity of the per-slot stop-id table (a compiled shape)."""
    max_stop_sequences: int = 4
    """Capacity of the per-slot stop-sequence table (a compiled shape)."""
    max_stop_sequence_len: int = 8
    """Longest stop sequence (a compiled shape)."""
    dtype: str | None = None
    """Compute dtype of the sampler: its copy of the weights, its activations and (unless
    ``cache_dtype``) its KV cache; None: the model's compute dtype. ``bfloat16`` under a float32
    learner samples in bf16 (matmuls accumulate in float32 on XLA, norms and softmax in float32,
    logits and log-probs in float32) while the learner stays float32: the log-probs a rollout
    records are the bf16 sampler's own, so the RL update's ``mismatch_kl`` measures the
    difference and a rollout correction (``loss.is_correction``) covers it. Needs the unrolled
    layers (``unroll_layers``, the default on CPU and GPU)."""
    cache_dtype: str | None = None
    """KV cache dtype; None uses the sampler's compute dtype (``dtype``)."""
    prefill_rows: tuple[int, ...] | None = None
    """Row buckets of prefill dispatches (unrolled layers, the slots on one device): a prefill
    computes over the smallest bucket of rows holding every slot with new tokens, not over all
    ``max_slots``. One prefill program per (length bucket, row bucket) used. None: max_slots //
    16, // 4 and all of them; (): always all rows."""
    decode_rows: tuple[int, ...] | None = None
    """Row buckets of decode chunks (unrolled layers, the slots on one device): a chunk
    computes over the smallest bucket of rows holding every running session, their cache rows
    gathered (with the attention window) before the chunk and written back after it, not over
    all ``max_slots``: RL steps that run fewer sessions than slots, and the last sessions of a
    turn, stop paying for idle rows. One decode program per (window, row bucket) used. None:
    max_slots // 4, // 2 and all of them (``decode_row_buckets``); (): always all rows. A
    session's log-probs can then differ in their last bits with how many sessions ran beside it
    (another matmul shape); the tokens sampled from them are the same but at a rounding
    boundary."""
    unroll_layers: bool | None = None
    """Run the layers unrolled over a per-layer copy of the weights (in the compute dtype) and
    per-layer KV buffers, instead of the model's layer scan over stacked arrays. Faster decode on
    XLA:CPU (no per-step copies out of the stacked arrays) at the price of that weight copy and a
    longer compile. None: on when the default backend is the CPU or a GPU (on an H200, decode of
    a 0.5B model ran 1.4x faster at batch 1 and 1.5x at batch 256 than the layer scan; TPU is
    unmeasured and keeps the scan)."""
    merge_lora: bool = True
    """A policy with LoRA adapters: fold them into the sampler's weight copy at each weight push
    (one small matmul per projection, nothing per token), or (false) keep them unmerged and run
    ``x @ A @ B`` in every prefill and decode step (``scripts/bench_lora.py`` compares both)."""
    share_prefixes: bool = True
    """A new session whose prompt starts with a prompt prefix another live session's slot already
    holds (the G samples of one task; a shared system prompt) gets those positions copied by one
    fork program instead of prefilling them again (``Engine`` docstring). Same tokens and
    logprobs as without; False: every prompt is prefilled in full."""
    share_min_tokens: int = 16
    """Shortest common prefix worth forking (shorter ones are prefilled with the rest)."""
    prefill_chunk_tokens: int | None = 512
    """Chunked prefill: while sessions are decoding, a scheduler iteration prefills at most this
    many tokens of any one request, so a longer input is prefilled in pieces between decode
    chunks (it joins decoding after its last piece) and running sessions stall for one piece,
    not the whole prompt. Shorter inputs are not held back; with nothing decoding everything
    waiting is prefilled at once. None: always whole inputs."""

    @property
    def decode_row_buckets(self) -> tuple[int, ...]:
        """``decode_rows`` resolved: sorted, with ``max_slots``."""
        return self._row_buckets("decode_rows", (4, 2))

    def _row_buckets(self, name: str, fractions: tuple[int, ...]) -> tuple[int, ...]:
        """Field ``name``'s row buckets, sorted, with ``max_slots`` (None: ``max_slots //
        f`` for each of ``fractions``, at least 1); ``ValueError`` outside [1, max_slots]."""
        given, B = getattr(self, name), self.max_slots
        if given is None:
            return tuple(sorted({max(1, B // f) for f in fractions} | {B}))
        rows = {int(r) for r in given} | {B}
        if min(rows) < 1 or max(rows) > B:
            raise ValueError(f"{name}={given} must lie in [1, max_slots={B}]")
        return tuple(sorted(rows))

    def __post_init__(self) -> None:
        if self.max_slots < 1:
            raise ValueError(f"max_slots={self.max_slots} must be >= 1")
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len={self.max_seq_len} must be >= 2")
        buckets = tuple(sorted({int(b) for b in self.prefill_buckets}))
        if not buckets or buckets[0] < 1:
            raise ValueError(f"prefill_buckets={self.prefill_buckets} must be positive lengths")
        object.__setattr__(self, "prefill_buckets", buckets)
        if self.decode_windows is None:
            # 128, 192, 256, 384, 512, 768, ...: a step reads at most 1.5x the cache it needs.
            wins, w = [], 128
            while self.decode_chunk * (self.max_seq_len - w) > 4 * w:
                wins.append(w)
                w = w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3
        else:
            wins = sorted({int(w) for w in self.decode_windows})
            if wins and (wins[0] < 1 or wins[-1] > self.max_seq_len):
                raise ValueError(
                    f"decode_windows={self.decode_windows} must lie in [1, max_seq_len="
                    f"{self.max_seq_len}]"
                )
        object.__setattr__(self, "decode_windows", tuple(w for w in wins if w < self.max_seq_len))
        object.__setattr__(self, "prefill_rows", self._row_buckets("prefill_rows", (16, 4)))
        self._row_buckets("decode_rows", (4, 2))  # checked; kept as given (None: the default)
        if self.decode_chunk < 1:
            raise ValueError(f"decode_chunk={self.decode_chunk} must be >= 1")
        if self.max_stop_sequences < 1 or self.max_stop_sequence_len < 1:
            raise ValueError(
                f"max_stop_sequences={self.max_stop_sequences} and max_stop_sequence_len="
                f"{self.max_stop_sequence_len} must be >= 1"
            )
        if self.share_min_tokens < 1:
            raise ValueError(f"share_min_tokens={self.share_min_tokens} must be >= 1")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 1:
            raise ValueError(
                f"prefill_chunk_tokens={self.prefill_chunk_tokens} must be >= 1 (None: no limit)"
            )
        if self.max_stop_ids < 1:
            raise ValueError(f"max_stop_ids={self.max_stop_ids} must be >= 1")
        if self.dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; valid: None, 'float32', 'bfloat16'")
        if self.cache_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(
                f"cache_dtype={self.cache_dtype!r}; valid: None, 'float32', 'bfloat16', 'float16'"
            )
