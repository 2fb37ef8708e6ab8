"""Batch shaping before the advantage estimator: dynamic sampling and overlong masking (DAPO,
Yu et al. 2025), each reporting what it removed.

* **Dynamic sampling.** A group whose rewards are all equal gives every group estimator zero
  advantage: it costs a forward/backward pass and dilutes token-mean losses. Keyed on the
  outcome instead (``by="outcome"``, DAPO's accuracy criterion), it also drops groups that
  differ only in shaping terms, whose advantages would train the shaping alone. Host side,
  :func:`filter_zero_variance_groups` drops such groups and :class:`DynamicSampler` accumulates
  informative groups over several rollout rounds until a batch is full (DAPO's resample loop;
  the caller does the sampling). Device side, :func:`zero_variance_mask` returns a ``Float['B']``
  row mask for when the batch shape must not change.
* **Overlong masking.** Trajectories cut off by a length budget (``MAX_TOKENS``,
  ``CONTEXT_FULL``, or a final turn that stopped on ``length``) carry no reliable signal about
  their unfinished answer; :func:`overlong_rows` flags them and :func:`mask_rows` zeroes their loss
  mask. They still count in their group's reward statistics (DAPO masks only the loss).

Deviation: DAPO's soft overlong *penalty* is a reward term concern, not implemented here.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxrl_agents.types import EndReason, Trajectory

Array = jax.Array
OVERLONG_REASONS = (EndReason.MAX_TOKENS, EndReason.CONTEXT_FULL)


@dataclasses.dataclass
class ShapingStats:
    """What shaping removed, for logging."""

    groups_in: int = 0
    groups_dropped: int = 0  # zero variance (of the reward, or of the outcome)
    trajectories_dropped: int = 0
    fallback: int = 0  # 1: no round had an informative group; the last round is trained as is

    def as_metrics(self) -> dict[str, float]:
        return {f"shaping/{k}": float(v) for k, v in dataclasses.asdict(self).items()}


def _groups(trajs: Sequence[Trajectory]) -> dict[int, list[Trajectory]]:
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t)
    return dict(groups)


GROUP_KEYS = ("reward", "outcome")
"""What a group must vary in to be kept: its total ``reward``, or its ``outcome`` (success, the
env's answer check: DAPO's accuracy criterion). A group that fails every episode still varies in
its shaping terms (step penalty, validity), which alone would then train the policy."""


def _informative(group: list[Trajectory], min_std: float, by: str = "reward") -> bool:
    rs = [t.reward for t in group] if by == "reward" else [float(t.success) for t in group]
    mean = sum(rs) / len(rs)
    std = (sum((r - mean) ** 2 for r in rs) / len(rs)) ** 0.5
    return len(rs) > 1 and std > min_std


def filter_zero_variance_groups(
    trajs: Sequence[Trajectory], *, min_std: float = 0.0, by: str = "reward"
) -> tuple[list[Trajectory], ShapingStats]:
    """Keep groups (by ``group_id``) whose std of ``by`` (:data:`GROUP_KEYS`) exceeds
    ``min_std``; order is preserved."""
    if by not in GROUP_KEYS:
        raise ValueError(f"by={by!r}: groups are filtered by one of {GROUP_KEYS}")
    groups = _groups(trajs)
    keep = {g for g, members in groups.items() if _informative(members, min_std, by)}
    kept = [t for t in trajs if t.group_id in keep]
    stats = ShapingStats(
        groups_in=len(groups),
        groups_dropped=len(groups) - len(keep),
        trajectories_dropped=len(trajs) - len(kept),
    )
    return kept, stats


class DynamicSampler:
    """Accumulate informative groups across rollout rounds until ``target_groups`` are ready.

    ``add(round_trajs)`` after each round; ``ready`` says when to stop sampling; ``take()`` pops
    exactly ``target_groups`` groups (surplus groups are discarded, as in DAPO) and resets.
    Give up after ``max_rounds``: then ``take`` returns what it has, or, if no round held an
    informative group, the last round's groups unfiltered (``stats.fallback = 1``), so a step
    always has episodes to train on. Keyed on the reward, those groups have zero advantage (a
    no-op update); keyed on the outcome, they would train the shaping terms alone, so the training
    job masks their loss and skips the update (``rollout.dynamic.StepSource.no_loss``). A long run
    should not stop for one unlucky step.
    """

    def __init__(
        self, *, target_groups: int, max_rounds: int = 4, min_std: float = 0.0, by: str = "reward"
    ):
        if target_groups < 1 or max_rounds < 1:
            raise ValueError(f"target_groups={target_groups}, max_rounds={max_rounds} must be >= 1")
        if by not in GROUP_KEYS:
            raise ValueError(f"by={by!r}: groups are filtered by one of {GROUP_KEYS}")
        self.target_groups, self.max_rounds, self.min_std = target_groups, max_rounds, min_std
        self.by = by
        self._groups: list[list[Trajectory]] = []
        self._last: list[Trajectory] = []
        self.rounds = 0
        self.stats = ShapingStats()

    def add(self, trajs: Sequence[Trajectory]) -> None:
        self.rounds += 1
        self._last = list(trajs)
        kept, s = filter_zero_variance_groups(trajs, min_std=self.min_std, by=self.by)
        self.stats.groups_in += s.groups_in
        self.stats.groups_dropped += s.groups_dropped
        self.stats.trajectories_dropped += s.trajectories_dropped
        self._groups.extend(_groups(kept).values())

    @property
    def ready(self) -> bool:
        return len(self._groups) >= self.target_groups or self.rounds >= self.max_rounds

    def take(self) -> tuple[list[Trajectory], ShapingStats]:
        out = [t for g in self._groups[: self.target_groups] for t in g]
        stats = dataclasses.replace(self.stats)
        if not out and self._last:
            groups = list(_groups(self._last).values())[: self.target_groups]
            out, stats.fallback = [t for g in groups for t in g], 1
        self._groups, self._last, self.rounds, self.stats = [], [], 0, ShapingStats()
        return out, stats


def overlong_rows(
    trajs: Sequence[Trajectory], *, reasons: Sequence[EndReason] = OVERLONG_REASONS
) -> list[bool]:
    """Which trajectories were truncated by a length budget (reason or a ``length`` last turn)."""
    reasons = tuple(reasons)
    return [
        t.end_reason in reasons or bool(t.turns and t.turns[-1].finish_reason == "length")
        for t in trajs
    ]


def mask_rows(loss_mask: Array, drop: Array) -> tuple[Array, Array]:
    """Zero the loss mask of rows where ``drop: Bool['B']``; returns ``(Float['B T'], count)``."""
    drop = drop.astype(bool)
    return jnp.where(drop[:, None], 0.0, loss_mask), drop.sum()


def zero_variance_mask(rewards: Array, group_ids: Array, *, tol: float = 0.0) -> Array:
    """``Float['B']``: 1 for rows whose group's reward range exceeds ``tol`` (jittable)."""
    b = rewards.shape[0]
    hi = jax.ops.segment_max(rewards, group_ids, num_segments=b)
    lo = jax.ops.segment_min(rewards, group_ids, num_segments=b)
    return ((hi - lo)[group_ids] > tol).astype(rewards.dtype)
