"""Dynamic sampling (zero-variance groups) and overlong masking, host and device side."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.algos import (
    DynamicSampler,
    filter_zero_variance_groups,
    mask_rows,
    overlong_rows,
    zero_variance_mask,
)
from jaxrl_agents.types import EndReason, Task, Trajectory, Turn, Verdict


def tr(group: int, reward: float, end=EndReason.ANSWERED, finish="stop") -> Trajectory:
    t = Trajectory(
        task=Task(f"t{group}", "toy", "train", {}),
        messages=[],
        tools=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        prompt_len=0,
        turns=[Turn(index=0, start=0, end=1, finish_reason=finish)],
        end_reason=end,
        group_id=group,
    )
    t.reward = reward
    return t


def batch(spec):
    return [tr(g, r) for g, rs in spec.items() for r in rs]


def test_filter_drops_zero_variance_groups_and_reports():
    trajs = batch({0: [1, 1, 1], 1: [1, -1, 1], 2: [-1, -1, -1], 3: [0.5, 0.5000001, 0.5]})
    kept, stats = filter_zero_variance_groups(trajs)
    assert sorted({t.group_id for t in kept}) == [1, 3]
    assert (stats.groups_in, stats.groups_dropped, stats.trajectories_dropped) == (4, 2, 6)
    kept, stats = filter_zero_variance_groups(trajs, min_std=1e-3)
    assert sorted({t.group_id for t in kept}) == [1] and stats.groups_dropped == 3
    assert stats.as_metrics()["shaping/groups_dropped"] == 3.0


def test_device_mask_agrees_with_host_filter():
    rng = np.random.default_rng(0)
    for _ in range(5):
        gids = rng.integers(0, 4, size=12)
        rewards = rng.choice([0.0, 1.0], size=12, p=[0.7, 0.3])
        trajs = [tr(int(g), float(r)) for g, r in zip(gids, rewards, strict=True)]
        kept, _ = filter_zero_variance_groups(trajs)
        want = [float(t.group_id in {k.group_id for k in kept}) for t in trajs]
        got = zero_variance_mask(jnp.asarray(rewards, jnp.float32), jnp.asarray(gids, jnp.int32))
        np.testing.assert_array_equal(np.asarray(got), want)


def test_dynamic_sampler_accumulates_until_full():
    ds = DynamicSampler(target_groups=3, max_rounds=5)
    ds.add(batch({0: [1, 1], 1: [1, 0]}))  # 1 informative
    assert not ds.ready
    ds.add(batch({2: [0, 0], 3: [0, 1], 4: [1, 0], 5: [0, 1]}))  # 3 more -> 4 >= 3
    assert ds.ready
    out, stats = ds.take()
    assert sorted({t.group_id for t in out}) == [1, 3, 4] and len(out) == 6
    assert (stats.groups_in, stats.groups_dropped) == (6, 2)
    assert ds.rounds == 0 and not ds.ready  # reset
    # no informative group in max_rounds: the last round as is, flagged (a step never empties)
    give_up = DynamicSampler(target_groups=2, max_rounds=2)
    give_up.add(batch({0: [1, 1]}))
    give_up.add(batch({7: [0, 0], 8: [1, 1], 9: [0, 0]}))
    assert give_up.ready
    out, stats = give_up.take()
    assert sorted({t.group_id for t in out}) == [7, 8] and stats.fallback == 1
    part = DynamicSampler(target_groups=2, max_rounds=1)  # some informative: those, no fallback
    part.add(batch({0: [1, 1], 1: [0, 1]}))
    out, stats = part.take()
    assert {t.group_id for t in out} == {1} and stats.fallback == 0
    with pytest.raises(ValueError, match="target_groups=0"):
        DynamicSampler(target_groups=0)


def test_outcome_keyed_groups_ignore_shaping_differences():
    """All-failing groups whose rewards differ only by step penalties (the sql experiment's
    collapse) are informative by reward but not by outcome; a group with a success is both."""

    def ep(group, success, steps):
        t = tr(group, (1.0 if success else -1.0) - 0.05 * steps)
        t.verdict = Verdict(success=success)
        return t

    trajs = [ep(0, False, 1), ep(0, False, 4), ep(1, True, 3), ep(1, False, 3),
             ep(2, True, 2), ep(2, True, 5)]  # fmt: skip
    by_reward, _ = filter_zero_variance_groups(trajs)
    by_outcome, stats = filter_zero_variance_groups(trajs, by="outcome")
    assert sorted({t.group_id for t in by_reward}) == [0, 1, 2]
    assert sorted({t.group_id for t in by_outcome}) == [1]
    assert (stats.groups_in, stats.groups_dropped, stats.trajectories_dropped) == (3, 2, 4)
    ds = DynamicSampler(target_groups=1, by="outcome")
    ds.add(trajs)
    assert ds.ready and {t.group_id for t in ds.take()[0]} == {1}
    with pytest.raises(ValueError, match=r"by='accuracy'.*\('reward', 'outcome'\)"):
        filter_zero_variance_groups(trajs, by="accuracy")


def test_overlong_rows_are_masked_and_counted():
    trajs = [
        tr(0, 1.0),
        tr(0, 0.0, end=EndReason.MAX_TOKENS),
        tr(1, 0.0, end=EndReason.CONTEXT_FULL),
        tr(1, 1.0, finish="length"),
        tr(2, 0.0, end=EndReason.MAX_TURNS),
    ]
    flags = overlong_rows(trajs)
    assert flags == [False, True, True, True, False]
    assert overlong_rows(trajs, reasons=[EndReason.MAX_TURNS]) == [False, False, False, True, True]
    mask = jnp.ones((5, 4))
    masked, n = mask_rows(mask, jnp.asarray(flags))
    assert int(n) == 3
    np.testing.assert_array_equal(np.asarray(masked).sum(1), [4, 0, 0, 0, 4])
