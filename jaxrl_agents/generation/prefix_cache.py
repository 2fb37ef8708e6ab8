"""The engine's registry of shared prompt prefixes (``EngineConfig.share_prefixes``).

RL group estimators open G sessions on one prompt at once. A request of a *new* session (nothing
cached) whose prompt body — all but its last token, which the decode loop feeds — shares a common
prefix of at least ``share_min_tokens`` tokens with the body of another live session's first
prompt gets those positions copied from that session's slot by the fork program
(``steps.make_fork``: one dispatch for all forks of an iteration, fixed shapes, compiled once) and
prefills only the rest. This works because sessions only append: positions ``[0, n)`` of a live
slot stay valid until it is released.

A host-side registry (:class:`PrefixCache`) holds, per live slot, the body of its first prompt and
how many of its positions are written; it is keyed by the body's first ``share_min_tokens`` tokens
(candidates) and by the whole body (exact hits), and the source is the candidate with the longest
common prefix. So identical prompts share everything and prompts that extend a registered one (or
only share its system prompt and tools) share the common part, at token granularity. When the
source is itself being admitted (the G requests of one group arrive together), the first is
prefilled (the leader) and the others fork as soon as it has written the positions they need —
within the same iteration unless chunking spreads the leader over several. Releasing a slot (or
cancelling its prefill) drops its entry; ``update_weights`` makes every entry stale (KV computed
under the old weights is never shared). Later turns are never shared (each session's own
continuation), nor are generated tokens (their KV came from decode steps). Results are those of
unshared prefill: the copied KV is what the request's own prefill would have written (to float
rounding of a different dispatch shape; the tests check tokens and logprobs). The engine's
``stats`` count ``prefill_tokens``, ``shared_tokens`` and ``forks``.
"""

from __future__ import annotations

import numpy as np


class PrefixEntry:
    """A registry entry: positions ``[0, written)`` of ``slot`` hold the KV of ``tokens[:written]``
    (``tokens``: the body of the slot's first prompt; ``written`` grows while it is prefilled)."""

    __slots__ = ("slot", "tokens", "written", "version", "live", "complete", "forking")

    def __init__(self, slot: int, tokens: np.ndarray, version: int, forking: bool):
        self.slot, self.tokens, self.version = slot, tokens, version
        self.written = 0
        self.live = True  # False once the slot is released (or its prefill cancelled)
        self.complete = False  # all of tokens written: it cannot grow any more
        self.forking = forking  # waiting for its own fork: not a source yet


class PrefixCache:
    """Live slots' first-prompt bodies: slot -> entry, and the two indexes of :meth:`match`."""

    def __init__(self, min_tokens: int):
        self.min_tokens = min_tokens  # EngineConfig.share_min_tokens
        self.entries: dict[int, PrefixEntry] = {}
        self.by_head: dict[bytes, list[PrefixEntry]] = {}
        self.by_body: dict[bytes, list[PrefixEntry]] = {}
        self.version = 0  # bumped by invalidate: older entries are never shared

    @property
    def empty(self) -> bool:
        """No entry, in the slot map or either index."""
        return not self.entries and not self.by_head and not self.by_body

    def invalidate(self) -> None:
        """Make every entry stale (the weights changed: their KV is not what a prefill writes)."""
        self.version += 1

    def _key(self, tokens: np.ndarray) -> bytes:
        return tokens[: self.min_tokens].tobytes()

    def register(self, slot: int, tokens: np.ndarray, *, forking: bool) -> PrefixEntry:
        """A new entry for ``slot`` (replacing its old one): its first prompt body is ``tokens``."""
        self.unregister(slot)
        entry = PrefixEntry(slot, tokens, self.version, forking)
        self.entries[slot] = entry
        self.by_head.setdefault(self._key(tokens), []).append(entry)
        self.by_body.setdefault(tokens.tobytes(), []).append(entry)
        return entry

    def unregister(self, slot: int) -> None:
        """Drop ``slot``'s entry, if any (it is no longer live)."""
        entry = self.entries.pop(slot, None)
        if entry is None:
            return
        entry.live = False
        for index, key in ((self.by_head, self._key(entry.tokens)), (self.by_body, None)):
            key = entry.tokens.tobytes() if key is None else key
            bucket = index[key]
            bucket.remove(entry)
            if not bucket:
                del index[key]

    def valid(self, entry: PrefixEntry) -> bool:
        """``entry`` may be forked from: its slot is live and its KV is of the current weights."""
        return entry.live and entry.version == self.version

    def match(self, body: np.ndarray, *, waiting_ok: bool) -> tuple[PrefixEntry | None, int]:
        """The registered prefix with the longest common prefix with ``body`` (ties: the most
        written, then the oldest), and that length; (None, 0) below ``share_min_tokens``.

        ``waiting_ok``: entries still waiting for their own fork count too. Only a request's
        first match may use them: entries then point to older ones, so waits cannot form a
        cycle; a re-match (its source was released) takes only entries that wait for nobody.
        """
        if len(body) < self.min_tokens:
            return None, 0

        def usable(e: PrefixEntry) -> bool:
            return self.valid(e) and (waiting_ok or not e.forking)

        exact = [e for e in self.by_body.get(body.tobytes(), ()) if usable(e)]
        if exact:
            return max(exact, key=lambda e: e.written), len(body)
        best, best_n = None, 0
        for e in self.by_head.get(self._key(body), ()):
            if not usable(e):
                continue
            k = min(len(body), len(e.tokens))
            diff = np.flatnonzero(body[:k] != e.tokens[:k])
            n = int(diff[0]) if diff.size else k
            if n > best_n or (n == best_n and best is not None and e.written > best.written):
                best, best_n = e, n
        if best_n < self.min_tokens:
            return None, 0
        return best, best_n
