"""Side-by-side comparison of two policies evaluated on the same tasks with the same seeds.

``compare(a, b)`` pairs trajectories by task id and answers the questions a reviewer asks after a
training run: which tasks flipped (``gained``: A failed, B solved; ``lost``: A solved, B failed),
how each failure mode moved (counts and rates, B minus A), and what the flipped episodes look like
(``pairs``: a deterministic sample of flipped tasks with both trajectories).

A task is *solved* by a policy when a strict majority of its samples succeed (with one greedy sample
per task, simply when that sample succeeds). The discordant counts also give an exact McNemar test
(two-sided binomial test of ``gained`` vs ``lost`` at p = 1/2): the paired test that fits "same
tasks, two policies" far better than comparing two independent success intervals.

    cmp = compare(trajs_sft, trajs_rl, names=("sft", "rl"))
    cmp.gained, cmp.lost, cmp.mode_deltas["premature"], cmp.to_dict()
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.evaluation.metrics import group_by_task, task_outcomes
from jaxrl_agents.evaluation.summary import FAILURE_MODES, failure_modes, primary_failure
from jaxrl_agents.types import Trajectory


@dataclasses.dataclass
class PairedTask:
    """One task's first sample under each policy (for side-by-side display)."""

    task_id: str
    direction: str  # "gained" | "lost"
    a: Trajectory
    b: Trajectory


@dataclasses.dataclass
class Comparison:
    """Result of :func:`compare` (``to_dict`` is its JSON)."""

    names: tuple[str, str]
    tasks: list[str]
    gained: list[str]
    """Task ids A failed and B solved."""
    lost: list[str]
    """Task ids A solved and B failed."""
    both_solved: int
    neither_solved: int
    mode_counts: dict[str, tuple[int, int]]
    """Failure mode -> (trajectories of A with it, of B with it)."""
    mode_deltas: dict[str, int]
    """Failure mode -> count(B) - count(A); negative means B shows it less."""
    primary_counts: dict[str, tuple[int, int]]
    mcnemar_p: float
    pairs: list[PairedTask]

    @property
    def success_delta(self) -> float:
        return (len(self.gained) - len(self.lost)) / len(self.tasks) if self.tasks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "tasks": len(self.tasks),
            "gained": self.gained,
            "lost": self.lost,
            "both_solved": self.both_solved,
            "neither_solved": self.neither_solved,
            "success_delta": self.success_delta,
            "mcnemar_p": self.mcnemar_p,
            "mode_counts": {k: list(v) for k, v in self.mode_counts.items()},
            "mode_deltas": self.mode_deltas,
            "primary_counts": {k: list(v) for k, v in self.primary_counts.items()},
            "pairs": [{"task_id": p.task_id, "direction": p.direction} for p in self.pairs],
        }


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def compare(
    a: Sequence[Trajectory],
    b: Sequence[Trajectory],
    *,
    names: tuple[str, str] = ("A", "B"),
    max_pairs: int = 6,
    seed: int = 0,
) -> Comparison:
    """Compare two policies' trajectories over the same task set (see module docstring).

    Raises ``ValueError`` naming the differing task ids when the two runs did not see the same
    tasks (evaluate both with the same env, split, task count and seed).
    """
    out_a, out_b = task_outcomes(a), task_outcomes(b)
    if set(out_a) != set(out_b):
        only_a, only_b = sorted(set(out_a) - set(out_b)), sorted(set(out_b) - set(out_a))
        raise ValueError(
            f"{names[0]} and {names[1]} were evaluated on different tasks: only in {names[0]}: "
            f"{only_a[:5]}{'...' if len(only_a) > 5 else ''}, only in {names[1]}: "
            f"{only_b[:5]}{'...' if len(only_b) > 5 else ''}"
        )
    tasks = list(out_a)  # A's task order (the env's generation order)
    gained = [t for t in tasks if not out_a[t]["solved"] and out_b[t]["solved"]]
    lost = [t for t in tasks if out_a[t]["solved"] and not out_b[t]["solved"]]
    both = sum(out_a[t]["solved"] and out_b[t]["solved"] for t in tasks)

    mode_counts = {m: (_count_mode(a, m), _count_mode(b, m)) for m in FAILURE_MODES}
    causes = sorted({c for t in (*a, *b) if (c := primary_failure(t)) is not None})
    primary = {
        c: (sum(primary_failure(t) == c for t in a), sum(primary_failure(t) == c for t in b))
        for c in causes
    }

    # A fixed-seed sample, balanced between directions, so reports are reproducible.
    rng = random.Random(seed)
    ga, gb = group_by_task(a), group_by_task(b)
    picks_g = rng.sample(gained, min(len(gained), max_pairs - min(len(lost), max_pairs // 2)))
    picks_l = rng.sample(lost, min(len(lost), max_pairs - len(picks_g)))
    order = {t: i for i, t in enumerate(tasks)}
    pairs = [
        PairedTask(t, d, ga[t][0], gb[t][0])
        for d, picks in (("gained", picks_g), ("lost", picks_l))
        for t in sorted(picks, key=order.__getitem__)
    ]
    return Comparison(
        names=names,
        tasks=tasks,
        gained=gained,
        lost=lost,
        both_solved=both,
        neither_solved=len(tasks) - both - len(gained) - len(lost),
        mode_counts=mode_counts,
        mode_deltas={m: nb - na for m, (na, nb) in mode_counts.items()},
        primary_counts=primary,
        mcnemar_p=mcnemar_exact(len(gained), len(lost)),
        pairs=pairs,
    )


def _count_mode(trajs: Sequence[Trajectory], mode: str) -> int:
    return sum(failure_modes(t)[mode] for t in trajs)
