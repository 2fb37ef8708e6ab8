"""Fixed-shape device batches: the arrays one train step reads (numpy on the host until the step
places them). ``rollout.packing`` builds them from host trajectories; ``training`` consumes them.

Alignment convention: every ``[R, T]`` array is indexed by *input* position ``t``; the quantities
that belong to a predicted token (``target_ids``, ``loss_mask``, ``old_logprobs``, ``advantages``,
``turn_ids``) describe token ``t + 1``, which the logits at ``t`` predict.

Per-trajectory quantities stay in *episode space*: :class:`EpisodeArrays` has one entry per
trajectory slot (``E`` of them, in trajectory order), and its ``row`` / ``offset`` / ``length``
say where each trajectory's positions lie in the batch (several trajectories may share a row, as
segments ``1, 2, ...`` of ``segment_ids``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TrainBatch(NamedTuple):
    """One device batch (numpy on the host until the train step places it)."""

    input_ids: np.ndarray  # Int['R T']
    positions: np.ndarray  # Int['R T']  position within the trajectory (restarts per segment)
    segment_ids: np.ndarray  # Int['R T']  1, 2, ... per trajectory of the row, 0 on padding
    target_ids: np.ndarray  # Int['R T']  token t+1
    loss_mask: np.ndarray  # Float['R T'] 1 where token t+1 was sampled by the policy
    old_logprobs: np.ndarray  # Float['R T'] rollout logprob of token t+1
    advantages: np.ndarray  # Float['R T']
    returns: np.ndarray  # Float['R T']  value targets (GAE), else 0
    turn_ids: np.ndarray  # Int['R T']  turn of token t+1, -1 if not sampled


class EpisodeArrays(NamedTuple):
    """Per-trajectory quantities the advantage estimators need besides the token arrays, and where
    each trajectory lies in the batch (``E`` trajectory slots, padding slots included)."""

    rewards: np.ndarray  # Float['E']
    group_ids: np.ndarray  # Int['E']
    turn_rewards: np.ndarray  # Float['E N']
    turn_mask: np.ndarray  # Float['E N']
    anchor_ids: np.ndarray  # Int['E N']  same id = same (group, env state) before the turn
    row_valid: np.ndarray  # Float['E']  0 for padding slots
    row: np.ndarray | None = None
    """Int['E']: the batch row holding the trajectory. None (with ``offset``, ``length``): one
    trajectory per row, row ``e`` = trajectory ``e`` (``E == R``), a hand-built batch."""
    offset: np.ndarray | None = None
    """Int['E']: its first position in that row."""
    length: np.ndarray | None = None
    """Int['E']: its prediction positions in the batch (0: a padding or dropped slot)."""


def real_frac(batch: TrainBatch) -> float:
    """Fraction of a batch's ``R x T`` positions that hold trajectory tokens."""
    seg = np.asarray(batch.segment_ids)
    return float((seg > 0).sum() / max(seg.size, 1))
