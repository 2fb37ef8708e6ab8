"""Host trajectories -> fixed-shape device batches (the types: ``jaxrl_agents.batches``). The one
module that owns this conversion.

Alignment convention: every ``[R, T]`` array is indexed by *input* position ``t``; the quantities
that belong to a predicted token (``target_ids``, ``loss_mask``, ``old_logprobs``, ``advantages``,
``turn_ids``) describe token ``t + 1``, which the logits at ``t`` predict. So a trajectory of ``n``
tokens occupies ``n - 1`` prediction positions (its *length* below).

Two layouts, one set of arrays:

* **One trajectory per row** (``pack(..., rows=None)``): ``T`` is the smallest bucket that fits
  the longest trajectory (longer ones are truncated and counted), the batch has ``batch_size``
  rows, padding rows all zero.
* **Packed rows** (``pack(..., rows=plan_rows(...))``): several trajectories share a row,
  placed first-fit-decreasing into ``rows`` rows of ``row_len`` positions. Within a row the
  trajectories are segments ``1, 2, ...`` of ``segment_ids`` (0 = padding) and each one's
  ``positions`` restart at 0, so the decoder (causal attention within equal segment ids, RoPE from
  ``positions``) computes every trajectory exactly as if it were alone in its row.

Either way the per-trajectory quantities stay in *episode space*: :class:`EpisodeArrays` has one
entry per trajectory slot (``batch_size`` of them, in trajectory order), and its ``row`` /
``offset`` / ``length`` say where each trajectory's positions lie in the batch, so the update can
gather per-token statistics into ``[E, T]`` (one trajectory per row, what the advantage
estimators read) and scatter advantages back (``training.update``).

Shapes are fixed so a long run compiles few programs: the row length is a bucket, the number of
rows comes from a small ladder of multiples of what the update must split rows by
(:func:`row_ladder`), and :func:`plan_rows` picks the pair with the fewest computed positions.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from jaxrl_agents.batches import EpisodeArrays, TrainBatch, real_frac
from jaxrl_agents.types import Ann, Trajectory


class RowPlan(NamedTuple):
    """The shape of a packed batch: ``rows`` rows of ``row_len`` positions (per process)."""

    row_len: int
    rows: int


class Packed(NamedTuple):
    batch: TrainBatch
    episodes: EpisodeArrays
    truncated: int  # trajectories cut to the row length (the largest bucket)

    @property
    def real_frac(self) -> float:
        """Real (trajectory) positions / computed positions of the batch."""
        return real_frac(self.batch)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n (the largest one if none fits)."""
    buckets = sorted(buckets)
    i = bisect.bisect_left(buckets, n)
    return buckets[min(i, len(buckets) - 1)]


# -- packing plans ----------------------------------------------------------------------------


def first_fit_decreasing(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """Bins of item indices: items longest first (ties by index), each into the first row with
    room for it. Items of length 0 are left out; items longer than ``row_len`` are an error."""
    lengths = [int(x) for x in lengths]
    if any(x > row_len for x in lengths):
        raise ValueError(f"an item of {max(lengths)} positions does not fit a row of {row_len}")
    order = sorted((i for i, x in enumerate(lengths) if x > 0), key=lambda i: (-lengths[i], i))
    free = np.zeros(len(order), np.int64)
    bins: list[list[int]] = []
    for i in order:
        n = lengths[i]
        j = int(np.argmax(free[: len(bins)] >= n)) if bins else 0
        if not bins or free[j] < n:
            j = len(bins)
            bins.append([])
            free[j] = row_len
        bins[j].append(i)
        free[j] -= n
    return bins


def row_ladder(n: int, multiple: int = 1, max_rows: int | None = None) -> int:
    """The smallest ladder row count holding ``n`` rows: ``multiple x k`` with ``k`` any of
    1..32, then ``16..31 x 2^j`` (rounding up by less than 1/16: at most 16 shapes per doubling
    of the batch, of which a run visits the few its per-step token volume spans); ``max_rows``
    (the one-trajectory-per-row count, always a valid shape) caps it."""
    k = max(-(-n // multiple), 1)
    if k > 32:  # round up to a multiple of 2^e, e such that k / 2^e lies in [16, 32]
        step = 1 << (k.bit_length() - 5)
        k = -(-k // step) * step
    rows = k * multiple
    if max_rows is not None and rows >= max_rows:
        return max_rows
    return rows


def plan_rows(
    parts: Sequence[Sequence[int]],
    *,
    buckets: Sequence[int],
    multiple: int = 1,
    max_rows: int | None = None,
) -> RowPlan:
    """The packed shape every part (process) can use: ``(row_len, rows)`` with ``row_len`` a bucket
    at least the smallest one holding the longest item, ``rows`` from :func:`row_ladder` and at
    least the first-fit-decreasing row count of every part, minimising ``rows x row_len`` (the
    computed positions; ties: the shorter row, whose attention is cheaper).

    ``parts[p]``: the lengths (prediction positions, ``len(token_ids) - 1``) of part ``p``'s
    trajectories; longer than the largest bucket means truncated to it. Every process computes
    the same plan from the same (all-gathered) lengths, so no further agreement is needed.
    """
    buckets = sorted(set(int(b) for b in buckets))
    top = buckets[-1]
    parts = [[min(max(int(x), 0), top) for x in p] for p in parts]
    longest = max((max(p, default=0) for p in parts), default=0)
    lo = bucket_for(max(longest, 1), buckets)
    best: tuple[int, int, int] | None = None  # (positions, row_len, rows)
    for T in (b for b in buckets if b >= lo):
        floor = max(-(-sum(p) // T) for p in parts)  # rows needed by volume alone
        if best is not None and row_ladder(floor, multiple, max_rows) * T >= best[0]:
            continue
        need = max(len(first_fit_decreasing(p, T)) for p in parts)
        rows = row_ladder(need, multiple, max_rows)
        if best is None or rows * T < best[0]:
            best = (rows * T, T, rows)
    assert best is not None
    return RowPlan(row_len=best[1], rows=best[2])


# -- packing ----------------------------------------------------------------------------------


def pack(
    trajectories: Sequence[Trajectory],
    *,
    buckets: Sequence[int],
    batch_size: int | None = None,
    max_turns: int | None = None,
    pad_id: int = 0,
    turn_rewards: Sequence[Sequence[float]] | None = None,
    rows: RowPlan | None = None,
) -> Packed:
    """Pack trajectories into a :class:`TrainBatch` (+ :class:`EpisodeArrays`).

    ``batch_size``: trajectory slots ``E`` (default: the trajectories; extra slots are padding).
    ``rows``: None puts trajectory ``i`` alone in row ``i`` (``R = E`` rows of the smallest bucket
    holding the longest); a :class:`RowPlan` packs them first-fit-decreasing into its rows
    (``ValueError`` if they do not fit; :func:`plan_rows` makes plans that do). Trajectories with
    fewer than two tokens take no position.

    ``turn_rewards[i]`` (one value per turn of trajectory ``i``) defaults to the sum of each
    turn's ``reward_terms``; trajectories with no turns get their whole reward on a virtual turn 0.
    """
    n = len(trajectories)
    if n == 0:
        raise ValueError("pack() needs at least one trajectory")
    b = batch_size or n
    if b < n:
        raise ValueError(f"batch_size={b} is smaller than the {n} trajectories to pack")
    full = [max(len(t.token_ids) - 1, 0) for t in trajectories]
    T, R, lengths, place = _place(full, buckets=buckets, b=b, rows=rows)
    N = max_turns or max(1, max(len(t.turns) for t in trajectories))

    batch = _empty_batch(R, T, pad_id)
    episodes = _empty_episodes(b, N)
    anchors: dict[tuple[int, str], int] = {}
    truncated = 0
    for i, traj in enumerate(trajectories):
        L = lengths[i]
        truncated += int(full[i] > T)
        r, o, seg = place[i]
        if L > 0:
            _write_tokens(batch, traj, r, o, seg, L, N)
        tr = None if turn_rewards is None else turn_rewards[i]
        _write_episode(episodes, anchors, i, traj, (r, o, L), N, tr)
    # Padding slots need group ids that collide with no real group.
    if b > n:
        group_ids = episodes.group_ids
        group_ids[n:] = np.max(group_ids[:n]) + 1 + np.arange(b - n)
    return Packed(batch, episodes, truncated)


def _place(
    full: list[int], *, buckets: Sequence[int], b: int, rows: RowPlan | None
) -> tuple[int, int, list[int], list[tuple[int, int, int]]]:
    """``(T, R, lengths, place)`` for :func:`pack`: the row length and row count, each
    trajectory's length cut to ``T``, and its ``(row, offset, segment id)``."""
    n = len(full)
    if rows is None:
        T = bucket_for(max(max(full), 1), buckets)
        R = b
        lengths = [min(x, T) for x in full]
        place = [(i, 0, 1) for i in range(n)]  # (row, offset, segment id)
    else:
        T, R = rows.row_len, rows.rows
        lengths = [min(x, T) for x in full]
        bins = first_fit_decreasing(lengths, T)
        if len(bins) > R:
            raise ValueError(f"{n} trajectories need {len(bins)} rows of {T}; the plan has {R}")
        place = [(0, 0, 0)] * n
        for r, items in enumerate(bins):
            off = 0
            for k, i in enumerate(items):
                place[i] = (r, off, k + 1)
                off += lengths[i]
    return T, R, lengths, place


def _empty_batch(R: int, T: int, pad_id: int) -> TrainBatch:
    """An ``[R, T]`` :class:`TrainBatch` of padding, for :func:`pack` to fill in place."""
    i32, f32 = np.int32, np.float32
    return TrainBatch(
        input_ids=np.full((R, T), pad_id, i32),
        positions=np.zeros((R, T), i32),
        segment_ids=np.zeros((R, T), i32),
        target_ids=np.full((R, T), pad_id, i32),
        loss_mask=np.zeros((R, T), f32),
        old_logprobs=np.zeros((R, T), f32),
        advantages=np.zeros((R, T), f32),
        returns=np.zeros((R, T), f32),
        turn_ids=np.full((R, T), -1, i32),
    )


def _empty_episodes(b: int, N: int) -> EpisodeArrays:
    """:class:`EpisodeArrays` for ``b`` padding slots of ``N`` turns, for :func:`pack` to fill."""
    i32, f32 = np.int32, np.float32
    return EpisodeArrays(
        rewards=np.zeros((b,), f32),
        group_ids=np.arange(b, dtype=i32),  # padding slots: singleton groups
        turn_rewards=np.zeros((b, N), f32),
        turn_mask=np.zeros((b, N), f32),
        anchor_ids=np.full((b, N), -1, i32),
        row_valid=np.zeros((b,), f32),
        row=np.zeros((b,), i32),
        offset=np.zeros((b,), i32),
        length=np.zeros((b,), i32),
    )


def _write_tokens(
    batch: TrainBatch, traj: Trajectory, r: int, o: int, seg: int, L: int, N: int
) -> None:
    """Write the first ``L`` prediction positions of ``traj`` at row ``r``, offset ``o`` as
    segment ``seg`` (turn ids for its first ``N`` turns)."""
    i32, f32 = np.int32, np.float32
    ids = np.asarray(traj.token_ids, i32)
    sl = slice(o, o + L)
    batch.input_ids[r, sl] = ids[:L]
    batch.positions[r, sl] = np.arange(L)
    batch.segment_ids[r, sl] = seg
    batch.target_ids[r, sl] = ids[1 : L + 1]
    mask = np.asarray(traj.loss_mask[1 : L + 1], f32)
    batch.loss_mask[r, sl] = mask
    batch.old_logprobs[r, sl] = np.asarray(traj.logprobs[1 : L + 1], f32)
    tid = np.full((L,), -1, i32)
    for k, turn in enumerate(traj.turns[:N]):
        lo, hi = max(turn.start - 1, 0), min(turn.end - 1, L)
        if lo < hi:
            tid[lo:hi] = k
    batch.turn_ids[r, sl] = np.where(mask > 0, tid, -1)


def _write_episode(
    ep: EpisodeArrays,
    anchors: dict[tuple[int, str], int],
    i: int,
    traj: Trajectory,
    where: tuple[int, int, int],
    N: int,
    turn_rewards: Sequence[float] | None,
) -> None:
    """Fill slot ``i`` of ``ep`` from ``traj`` (``where``: its row, offset and length); ``anchors``
    numbers the (group, state key) pairs across the batch."""
    ep.row[i], ep.offset[i], ep.length[i] = where
    ep.rewards[i] = traj.reward
    ep.group_ids[i] = traj.group_id
    ep.row_valid[i] = 1.0
    n_turns = min(max(len(traj.turns), 1), N)
    ep.turn_mask[i, :n_turns] = 1.0
    if turn_rewards is not None:
        tr = list(turn_rewards)[:N]
    elif traj.turns:
        tr = [sum(t.reward_terms.values()) for t in traj.turns[:N]]
    else:
        tr = [traj.reward]
    ep.turn_rewards[i, : len(tr)] = tr
    for k, turn in enumerate(traj.turns[:N]):
        key = turn.annotations.get(Ann.STATE_KEY)
        if key is not None:
            ep.anchor_ids[i, k] = anchors.setdefault((traj.group_id, str(key)), len(anchors))


def clear_loss(packed: Packed, slots: Sequence[int]) -> None:
    """Zero the loss mask of trajectory slots ``slots`` in place; their positions stay in the
    batch and their slots in the episode arrays (``mask_overlong``)."""
    ep, b = packed.episodes, packed.batch
    for i in slots:
        r, o, L = int(ep.row[i]), int(ep.offset[i]), int(ep.length[i])
        b.loss_mask[r, o : o + L] = 0.0


def pack_sft(
    encoded: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    buckets: Sequence[int],
    batch_size: int | None = None,
    pad_id: int = 0,
    rows: RowPlan | None = None,
) -> tuple[TrainBatch, int]:
    """Golden ``(ids, loss_mask)`` pairs -> a :class:`TrainBatch` for SFT (advantages unused);
    ``rows`` as in :func:`pack` (None: one sequence per row)."""
    trajs = [_SftRow(ids, mask) for ids, mask in encoded]
    packed = pack(trajs, buckets=buckets, batch_size=batch_size, pad_id=pad_id, rows=rows)  # type: ignore[arg-type]
    return packed.batch, packed.truncated


class _SftRow:
    """The few Trajectory fields ``pack`` reads, for golden (non-rollout) sequences."""

    def __init__(self, ids: Sequence[int], mask: Sequence[int]):
        self.token_ids, self.loss_mask = list(ids), list(mask)
        self.logprobs = [0.0] * len(self.token_ids)
        self.turns: list = []
        self.reward = 0.0
        self.group_id = 0
