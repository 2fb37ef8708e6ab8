"""Sessions of the engine: one slot each, one ``generate`` at a time, and the requests they send.

A :class:`Session` validates a turn's input against the engine's limits and hands it to the engine
as a :class:`Request`; the engine's scheduler arms, prefills and decodes it, and resolves the
request's future with the turn's :class:`~jaxrl_agents.generation.config.GenerationResult`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from jaxrl_agents.generation.config import GenerationResult, SamplingParams
from jaxrl_agents.generation.prefix_cache import PrefixEntry

if TYPE_CHECKING:
    from jaxrl_agents.generation.engine import Engine


class Request:
    """One ``generate`` call in flight: its tokens, parameters and accumulated output."""

    def __init__(self, session: Session, prompt: list[int], params: SamplingParams, future):
        self.session, self.prompt, self.params, self.future = session, prompt, params, future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.sampling_logprobs: list[float] = []
        # Admission state (engine-side): tokens still to prefill, the prefix to fork first.
        self.todo: list[int] = []
        self.src: PrefixEntry | None = None  # fork positions [0, share) from src.slot first
        self.share = 0
        self.entry: PrefixEntry | None = None  # this request's own registry entry (first turns)


class Session:
    """Owns one slot (a KV-cache row) until ``close``. Not for concurrent ``generate`` calls."""

    def __init__(self, engine: Engine, slot: int):
        self._engine, self.slot = engine, slot
        self.cached = 0  # tokens in the slot's cache
        self.pending: int | None = None  # last sampled token: in the context, not yet cached
        self._busy = False
        self._cancelled = False  # a cancelled turn leaves the slot's context undefined
        self.closed = False

    @property
    def length(self) -> int:
        """Tokens in this session's context (cached + the pending last sampled token)."""
        return self.cached + (self.pending is not None)

    async def generate(self, new_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Append ``new_token_ids`` (the prompt on the first call) and generate one turn."""
        if self.closed or self._cancelled:
            why = "closed" if self.closed else "unusable after a cancelled generate (close it)"
            raise RuntimeError(f"session on slot {self.slot} is {why}")
        if self._busy:
            raise RuntimeError(f"session on slot {self.slot} already has a generate in flight")
        new = [int(t) for t in new_token_ids]
        if not new and self.pending is None:
            raise ValueError("the first generate of a session needs a non-empty prompt")
        vocab = self._engine.vocab_size
        bad = [t for t in new if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        if self.length + len(new) >= self._engine.cfg.max_seq_len:
            return GenerationResult(token_ids=[], logprobs=[], finish_reason="cache_full")
        if len(params.stop_token_ids) > self._engine.cfg.max_stop_ids:
            raise ValueError(
                f"{len(params.stop_token_ids)} stop ids > EngineConfig.max_stop_ids="
                f"{self._engine.cfg.max_stop_ids}"
            )
        cfg = self._engine.cfg
        if len(params.stop_sequences) > cfg.max_stop_sequences or any(
            len(q) > cfg.max_stop_sequence_len for q in params.stop_sequences
        ):
            raise ValueError(
                f"stop_sequences={params.stop_sequences} exceed EngineConfig.max_stop_sequences="
                f"{cfg.max_stop_sequences} / max_stop_sequence_len={cfg.max_stop_sequence_len}"
            )
        prompt = ([self.pending] if self.pending is not None else []) + new
        self._busy = True
        try:
            return await self._engine._submit(self, prompt, params)
        except asyncio.CancelledError:
            self._cancelled = True
            raise
        finally:
            self._busy = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._engine._release(self)
