"""The run's named PRNG streams: one independent stream per purpose, derived per step."""

from __future__ import annotations

import zlib

import jax
import numpy as np

PURPOSES = (
    "model_init",
    "sft_tasks",
    "sft_oracle",
    "sft_order",
    "sft_copy",
    "rl_tasks",
    "rollout",
    "update",
    "refill",
    "rollout_refill",
    "rft_order",
)
"""The run's independent random streams, one per purpose."""
RL_PURPOSES = ("rl_tasks", "rollout", "update", "refill", "rollout_refill", "rft_order")
"""The streams only RL (or the RFT stage in its place) draws from (``trainer.rl.seed`` reseeds
them alone)."""


class Keys:
    """PRNG keys made once from the run seed, one per purpose (:data:`PURPOSES`; the stream of a
    purpose is ``fold_in(key(seed), crc32(purpose))``, so adding a purpose changes no other), and
    derived per step with ``fold_in``: what step ``s`` draws depends only on
    ``(seed, purpose, s)``, so a resumed run draws exactly what an uninterrupted one would.
    ``rl_seed``: the :data:`RL_PURPOSES` streams from this seed instead (the same SFT result,
    other RL draws); None or equal to ``seed``: the run seed's."""

    def __init__(self, seed: int, *, rl_seed: int | None = None):
        root = jax.random.key(seed)
        rl_root = root if rl_seed is None else jax.random.key(rl_seed)
        self._keys = {
            p: jax.random.fold_in(rl_root if p in RL_PURPOSES else root, zlib.crc32(p.encode()))
            for p in PURPOSES
        }

    def key(self, purpose: str, step: int | None = None) -> jax.Array:
        if purpose not in self._keys:
            raise KeyError(f"no random stream {purpose!r}; streams: {', '.join(PURPOSES)}")
        k = self._keys[purpose]
        return k if step is None else jax.random.fold_in(k, step)

    def seed(self, purpose: str, step: int | None = None) -> int:
        """A 31-bit integer seed from the stream (for host-side generators and episode seeds)."""
        bits = jax.random.bits(self.key(purpose, step), (), np.uint32)
        return int(bits) & 0x7FFFFFFF
