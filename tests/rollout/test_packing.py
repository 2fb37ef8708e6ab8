"""Packing trajectories into fixed-shape batches: alignment, masks, buckets, turn ids."""

import numpy as np
import pytest

from jaxrl_agents.rollout.packing import bucket_for, pack
from jaxrl_agents.types import Ann, EndReason, Task, Trajectory, Turn


def _traj(ids, mask, lps, turns, *, reward=0.0, group=0):
    return Trajectory(
        task=Task(id="t", env="x", split="train", data={}),
        messages=[],
        tools=[],
        token_ids=ids,
        loss_mask=mask,
        logprobs=lps,
        prompt_len=mask.index(1) if 1 in mask else len(ids),
        turns=turns,
        end_reason=EndReason.ANSWERED,
        group_id=group,
        reward=reward,
    )


def test_bucket_for():
    assert bucket_for(5, [8, 16]) == 8
    assert bucket_for(8, [16, 8]) == 8
    assert bucket_for(9, [8, 16]) == 16
    assert bucket_for(99, [8, 16]) == 16  # too long: largest bucket (truncation is counted)


def test_alignment_masks_and_turns():
    # prompt (3) | turn0 sampled (2) | env reply (2) | turn1 sampled (3)
    ids = [10, 11, 12, 20, 21, 30, 31, 40, 41, 42]
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    lps = [0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4, -0.5]
    turns = [
        Turn(
            index=0, start=3, end=5, reward_terms={"step": -0.05}, annotations={Ann.STATE_KEY: "s0"}
        ),
        Turn(
            index=1,
            start=7,
            end=10,
            reward_terms={"step": -0.05, "outcome": 1.0},
            annotations={Ann.STATE_KEY: "s1"},
        ),
    ]
    p = pack([_traj(ids, mask, lps, turns, reward=0.9)], buckets=[4, 16], batch_size=2, max_turns=3)
    b, ep = p.batch, p.episodes
    assert b.input_ids.shape == (2, 16) and p.truncated == 0
    # position t predicts token t+1
    np.testing.assert_array_equal(b.input_ids[0, :9], ids[:9])
    np.testing.assert_array_equal(b.target_ids[0, :9], ids[1:])
    np.testing.assert_array_equal(b.loss_mask[0, :9], mask[1:])
    np.testing.assert_allclose(b.old_logprobs[0, :9], lps[1:])
    np.testing.assert_array_equal(b.segment_ids[0], [1] * 9 + [0] * 7)
    # turn ids on targets: tokens 3,4 -> turn 0 at positions 2,3; tokens 7..9 -> turn 1 at 6..8
    np.testing.assert_array_equal(b.turn_ids[0, :9], [-1, -1, 0, 0, -1, -1, 1, 1, 1])
    assert (b.turn_ids[0, 9:] == -1).all() and (b.turn_ids[1] == -1).all()
    np.testing.assert_allclose(ep.turn_rewards[0], [-0.05, 0.95, 0.0])
    np.testing.assert_array_equal(ep.turn_mask[0], [1, 1, 0])
    np.testing.assert_array_equal(ep.anchor_ids[0], [0, 1, -1])
    np.testing.assert_array_equal(ep.row_valid, [1, 0])
    assert ep.rewards[0] == pytest.approx(0.9)
    assert ep.group_ids[1] != ep.group_ids[0]  # padding rows form their own groups
    assert (b.loss_mask[1] == 0).all()


def test_truncation_counted_and_shared_anchors():
    ids = list(range(40))
    mask = [0] * 10 + [1] * 30
    t1 = _traj(
        ids,
        mask,
        [0.0] * 40,
        [Turn(index=0, start=10, end=40, annotations={Ann.STATE_KEY: "same"})],
        group=3,
    )
    t2 = _traj(
        ids[:12],
        mask[:12],
        [0.0] * 12,
        [Turn(index=0, start=10, end=12, annotations={Ann.STATE_KEY: "same"})],
        group=3,
    )
    p = pack([t1, t2], buckets=[16])
    assert p.truncated == 1 and p.batch.input_ids.shape == (2, 16)
    assert p.episodes.anchor_ids[0, 0] == p.episodes.anchor_ids[1, 0] == 0


def test_batch_too_small_is_an_error():
    t = _traj([1, 2, 3], [0, 1, 1], [0, 0, 0], [])
    with pytest.raises(ValueError, match="batch_size=1"):
        pack([t, t], buckets=[8], batch_size=1)
