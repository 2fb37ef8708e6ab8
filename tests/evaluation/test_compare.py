"""Side-by-side comparison: exactly the flipped tasks, mode deltas, paired samples."""

from __future__ import annotations

import random

import pytest
from conftest import looping

from jaxrl_agents.envs.calculator import oracle_policy, wrong_policy
from jaxrl_agents.evaluation.compare import compare, mcnemar_exact


def _mixed(good_ids: set[str]):
    """Oracle on ``good_ids``, the early answerer elsewhere."""
    return lambda task: (oracle_policy if task.id in good_ids else wrong_policy)(task)


def test_compare_lists_exactly_the_flipped_tasks(tasks, rollout):
    ids = [t.id for t in tasks]
    rng = random.Random(1)
    good_a = set(rng.sample(ids, 4))
    good_b = set(rng.sample(ids, 5))
    a = rollout(_mixed(good_a), tasks)
    b = rollout(_mixed(good_b), tasks)
    cmp = compare(a, b, names=("a", "b"), max_pairs=4)

    assert cmp.gained == [i for i in ids if i in good_b and i not in good_a]
    assert cmp.lost == [i for i in ids if i in good_a and i not in good_b]
    assert cmp.both_solved == len(good_a & good_b)
    assert cmp.neither_solved == len(set(ids) - good_a - good_b)
    # The early answerer is the only source of premature answers.
    assert cmp.mode_counts["premature"] == (len(ids) - len(good_a), len(ids) - len(good_b))
    assert cmp.mode_deltas["premature"] == len(good_a) - len(good_b)
    assert cmp.success_delta == pytest.approx((len(good_b) - len(good_a)) / len(ids))
    # Pairs: only flipped tasks, both trajectories of the same task, in the right direction.
    assert 0 < len(cmp.pairs) <= 4
    for p in cmp.pairs:
        assert p.a.task.id == p.b.task.id == p.task_id
        assert (p.a.success, p.b.success) == (
            (False, True) if p.direction == "gained" else (True, False)
        )
    assert compare(a, b, names=("a", "b"), max_pairs=4).pairs == cmp.pairs  # deterministic


def test_identical_policies_flip_nothing(tasks, rollout):
    a = rollout(looping, tasks[:4])
    cmp = compare(a, rollout(looping, tasks[:4]))
    assert cmp.gained == cmp.lost == [] and cmp.pairs == []
    assert set(cmp.mode_deltas.values()) == {0} and cmp.mcnemar_p == 1.0


def test_different_task_sets_are_rejected(tasks, rollout):
    a, b = rollout(oracle_policy, tasks[:3]), rollout(oracle_policy, tasks[1:4])
    with pytest.raises(ValueError, match=f"only in A: \\['{tasks[0].id}'\\]"):
        compare(a, b)


def test_mcnemar_exact_matches_binomial_tail():
    # 9 discordant pairs split 8:1 -> 2 * P(X <= 1), X ~ Bin(9, 1/2) = 2 * 10 / 512.
    assert mcnemar_exact(8, 1) == pytest.approx(20 / 512)
    assert mcnemar_exact(1, 8) == mcnemar_exact(8, 1)
    assert mcnemar_exact(3, 3) == 1.0
