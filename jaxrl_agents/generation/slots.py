"""The engine's slot table: host mirrors of per-slot state and the free list.

A slot is one row of the KV cache; a session owns one from ``open_session`` until ``close``. The
host arrays here are the truth between dispatches: the scheduler edits them on the event-loop
thread, and each decode chunk gets a copy of them as its ``SlotState`` input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jaxrl_agents.generation.config import EngineConfig, SamplingParams
from jaxrl_agents.generation.sampling import SlotSampling
from jaxrl_agents.generation.steps import SlotState


@dataclass
class SlotTable:
    """Per-slot host arrays (leading axis = slots) and the slots no session owns."""

    lengths: np.ndarray  # Int[B]: tokens in the slot's cache
    last: np.ndarray  # Int[B]: next token to feed (sampled or last of a prompt; not cached yet)
    n_gen: np.ndarray  # Int[B]: tokens generated so far in this turn
    max_new: np.ndarray  # Int[B]
    stop: np.ndarray  # Int[B NS]: stop ids, padded with -1
    stop_seqs: np.ndarray  # Int[B NQ LS]: right-aligned stop sequences, -1 padded
    seed: np.ndarray  # UInt32[B]
    temp: np.ndarray  # Float[B]
    top_k: np.ndarray  # Int[B]
    top_p: np.ndarray  # Float[B]
    min_p: np.ndarray  # Float[B]
    free: list[int] = field(default_factory=list)  # slots to hand out, oldest release first

    @classmethod
    def create(cls, cfg: EngineConfig) -> SlotTable:
        """``cfg.max_slots`` idle slots, all free."""
        B = cfg.max_slots
        return cls(
            lengths=np.zeros(B, np.int32),
            last=np.zeros(B, np.int32),
            n_gen=np.zeros(B, np.int32),
            max_new=np.ones(B, np.int32),
            stop=np.full((B, cfg.max_stop_ids), -1, np.int32),
            stop_seqs=np.full((B, cfg.max_stop_sequences, cfg.max_stop_sequence_len), -1, np.int32),
            seed=np.zeros(B, np.uint32),
            temp=np.ones(B, np.float32),
            top_k=np.zeros(B, np.int32),
            top_p=np.ones(B, np.float32),
            min_p=np.zeros(B, np.float32),
            free=list(range(B)),
        )

    @property
    def has_free(self) -> bool:
        return bool(self.free)

    def claim(self) -> int:
        """Take the free slot released longest ago (or never used)."""
        return self.free.pop(0)

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def arm(self, slot: int, cached: int, last_token: int, sp: SamplingParams) -> None:
        """Reset ``slot`` for a new turn: ``cached`` tokens in its cache, ``last_token`` to feed
        first, and the turn's sampling settings and stop tables."""
        s = slot
        self.lengths[s] = cached
        self.last[s] = last_token
        self.n_gen[s] = 0
        self.max_new[s] = sp.max_new_tokens
        self.stop[s] = -1
        self.stop[s, : len(sp.stop_token_ids)] = sp.stop_token_ids
        self.stop_seqs[s] = -1
        for q, seq in enumerate(sp.stop_sequences):
            self.stop_seqs[s, q, self.stop_seqs.shape[2] - len(seq) :] = seq
        self.seed[s] = np.uint32(sp.seed & 0xFFFFFFFF)
        self.temp[s] = sp.temperature
        self.top_k[s], self.top_p[s], self.min_p[s] = sp.top_k, sp.top_p, sp.min_p

    def advance(self, slot: int, n: int, last_token: int) -> None:
        """``n`` tokens were generated on ``slot`` (each step cached the token it fed)."""
        self.lengths[slot] += n
        self.n_gen[slot] += n
        self.last[slot] = last_token

    def decode_inputs(self, active: np.ndarray, recent: np.ndarray) -> SlotState:
        """A decode chunk's ``SlotState``: copies, so later edits do not race the dispatch."""
        return SlotState(
            lengths=self.lengths.copy(),
            last_token=self.last.copy(),
            active=active,
            n_generated=self.n_gen.copy(),
            max_new=self.max_new.copy(),
            stop_ids=self.stop.copy(),
            stop_seqs=self.stop_seqs.copy(),
            recent=recent,
            sampling=SlotSampling(
                seed=self.seed.copy(),
                temperature=self.temp.copy(),
                top_k=self.top_k.copy(),
                top_p=self.top_p.copy(),
                min_p=self.min_p.copy(),
            ),
        )


def bucket_rows(active: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray | None:
    """Cache rows of a decode chunk over the ``active`` slots (Bool[B]): those slots, then idle
    ones up to the smallest of ``buckets`` that holds them (distinct rows, so the chunk's
    write-back leaves the idle ones as they were); None when that bucket is all B rows."""
    B, live = len(active), np.flatnonzero(active)
    R = next(r for r in buckets if r >= len(live))
    if R == B:
        return None
    return np.concatenate([live, np.flatnonzero(~active)[: R - len(live)]]).astype(np.int32)
