"""Host trajectories -> fixed-shape device batches. The one module that owns this conversion.

Alignment convention: every ``[B, T]`` array is indexed by *input* position ``t``; the quantities
that belong to a predicted token (``target_ids``, ``loss_mask``, ``old_logprobs``, ``advantages``,
``turn_ids``) describe token ``t + 1``, which the logits at ``t`` predict. So a trajectory of ``n``
tokens occupies ``n - 1`` prediction positions.

Shapes are bucketed: ``T`` is the smallest bucket that fits the longest trajectory (longer ones are
truncated and counted), ``B`` is padded to ``batch_size`` with all-zero rows, so a long run compiles
at most ``len(buckets)`` train-step programs.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from jaxrl_agents.types import Ann, Trajectory


class TrainBatch(NamedTuple):
    """One device batch (numpy on the host until the train step places it)."""

    input_ids: np.ndarray  # Int['B T']
    positions: np.ndarray  # Int['B T']
    segment_ids: np.ndarray  # Int['B T']  1 on real tokens, 0 on padding
    target_ids: np.ndarray  # Int['B T']  token t+1
    loss_mask: np.ndarray  # Float['B T'] 1 where token t+1 was sampled by the policy
    old_logprobs: np.ndarray  # Float['B T'] rollout logprob of token t+1
    advantages: np.ndarray  # Float['B T']
    returns: np.ndarray  # Float['B T']  value targets (GAE), else 0
    turn_ids: np.ndarray  # Int['B T']  turn of token t+1, -1 if not sampled


class EpisodeArrays(NamedTuple):
    """Per-trajectory quantities the advantage estimators need besides the token arrays."""

    rewards: np.ndarray  # Float['B']
    group_ids: np.ndarray  # Int['B']
    turn_rewards: np.ndarray  # Float['B N']
    turn_mask: np.ndarray  # Float['B N']
    anchor_ids: np.ndarray  # Int['B N']  same id = same (group, env state) before the turn
    row_valid: np.ndarray  # Float['B']  0 for padding rows


class Packed(NamedTuple):
    batch: TrainBatch
    episodes: EpisodeArrays
    truncated: int  # trajectories cut to the largest bucket


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n (the largest one if none fits)."""
    buckets = sorted(buckets)
    i = bisect.bisect_left(buckets, n)
    return buckets[min(i, len(buckets) - 1)]


def pack(
    trajectories: Sequence[Trajectory],
    *,
    buckets: Sequence[int],
    batch_size: int | None = None,
    max_turns: int | None = None,
    pad_id: int = 0,
    turn_rewards: Sequence[Sequence[float]] | None = None,
) -> Packed:
    """Pack trajectories into a :class:`TrainBatch` (+ :class:`EpisodeArrays`).

    ``turn_rewards[i]`` (one value per turn of trajectory ``i``) defaults to the sum of each
    turn's ``reward_terms``; trajectories with no turns get their whole reward on a virtual turn 0.
    """
    n = len(trajectories)
    if n == 0:
        raise ValueError("pack() needs at least one trajectory")
    b = batch_size or n
    if b < n:
        raise ValueError(f"batch_size={b} is smaller than the {n} trajectories to pack")
    longest = max(len(t.token_ids) for t in trajectories) - 1
    T = bucket_for(max(longest, 1), buckets)
    N = max_turns or max(1, max(len(t.turns) for t in trajectories))

    i32, f32 = np.int32, np.float32
    input_ids = np.full((b, T), pad_id, i32)
    positions = np.zeros((b, T), i32)
    segment_ids = np.zeros((b, T), i32)
    target_ids = np.full((b, T), pad_id, i32)
    loss_mask = np.zeros((b, T), f32)
    old_logprobs = np.zeros((b, T), f32)
    turn_ids = np.full((b, T), -1, i32)
    rewards = np.zeros((b,), f32)
    group_ids = np.arange(b, dtype=i32)  # padding rows: singleton groups
    t_rewards = np.zeros((b, N), f32)
    t_mask = np.zeros((b, N), f32)
    anchor_ids = np.full((b, N), -1, i32)
    row_valid = np.zeros((b,), f32)
    anchors: dict[tuple[int, str], int] = {}
    truncated = 0

    for i, traj in enumerate(trajectories):
        ids = np.asarray(traj.token_ids, i32)
        L = min(len(ids) - 1, T)
        truncated += int(len(ids) - 1 > T)
        input_ids[i, :L] = ids[:L]
        positions[i, :L] = np.arange(L)
        segment_ids[i, :L] = 1
        target_ids[i, :L] = ids[1 : L + 1]
        loss_mask[i, :L] = np.asarray(traj.loss_mask[1 : L + 1], f32)
        old_logprobs[i, :L] = np.asarray(traj.logprobs[1 : L + 1], f32)
        for k, turn in enumerate(traj.turns[:N]):
            lo, hi = max(turn.start - 1, 0), min(turn.end - 1, L)
            if lo < hi:
                turn_ids[i, lo:hi] = k
        turn_ids[i] = np.where(loss_mask[i] > 0, turn_ids[i], -1)
        rewards[i] = traj.reward
        group_ids[i] = traj.group_id
        row_valid[i] = 1.0
        n_turns = min(max(len(traj.turns), 1), N)
        t_mask[i, :n_turns] = 1.0
        if turn_rewards is not None:
            tr = list(turn_rewards[i])[:N]
        elif traj.turns:
            tr = [sum(t.reward_terms.values()) for t in traj.turns[:N]]
        else:
            tr = [traj.reward]
        t_rewards[i, : len(tr)] = tr
        for k, turn in enumerate(traj.turns[:N]):
            key = turn.annotations.get(Ann.STATE_KEY)
            if key is not None:
                anchor_ids[i, k] = anchors.setdefault((traj.group_id, str(key)), len(anchors))
    # Padding rows need group ids that collide with no real group.
    if b > n:
        group_ids[n:] = np.max(group_ids[:n]) + 1 + np.arange(b - n)

    batch = TrainBatch(
        input_ids=input_ids,
        positions=positions,
        segment_ids=segment_ids,
        target_ids=target_ids,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=np.zeros((b, T), f32),
        returns=np.zeros((b, T), f32),
        turn_ids=turn_ids,
    )
    episodes = EpisodeArrays(rewards, group_ids, t_rewards, t_mask, anchor_ids, row_valid)
    return Packed(batch, episodes, truncated)


def pack_sft(
    encoded: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    buckets: Sequence[int],
    batch_size: int | None = None,
    pad_id: int = 0,
) -> tuple[TrainBatch, int]:
    """Golden ``(ids, loss_mask)`` pairs -> a :class:`TrainBatch` for SFT (advantages unused)."""
    trajs = [_SftRow(ids, mask) for ids, mask in encoded]
    packed = pack(trajs, buckets=buckets, batch_size=batch_size, pad_id=pad_id)  # type: ignore[arg-type]
    return packed.batch, packed.truncated


class _SftRow:
    """The few Trajectory fields ``pack`` reads, for golden (non-rollout) sequences."""

    def __init__(self, ids: Sequence[int], mask: Sequence[int]):
        self.token_ids, self.loss_mask = list(ids), list(mask)
        self.logprobs = [0.0] * len(self.token_ids)
        self.turns: list = []
        self.reward = 0.0
        self.group_id = 0
