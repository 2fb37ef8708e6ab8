"""Dynamic sampling through the training job: when half of the groups have zero reward variance,
the trainer drops them, samples fresh groups and trains every step on a full batch of informative
groups (counts logged); overlong masking removes cut-off episodes from the loss."""

from __future__ import annotations

import json
import sys
import zlib

import pytest

from jaxrl_agents.rewards import register_reward_term

SMOKE = ["trainer=smoke", "sampler.max_slots=16", "rollout.group_size=2", "mesh=single",
         "trainer.checkpoint.export=false", "trainer.eval.every=0", "trainer.eval.heldout_tasks=2",
         "trainer.rl.steps=3", "trainer.rl.tasks_per_step=4"]  # fmt: skip


def half_informative(traj) -> float:
    """Tasks with an even id hash: the two samples get 0 and 1 (informative); the others: 0."""
    if zlib.crc32(traj.task.id.encode()) % 2:
        return 0.0
    return float(traj.sample_index % 2)


@pytest.fixture(autouse=True)
def _registered():
    register_reward_term("half_informative")(half_informative)
    yield
    from jaxrl_agents.rewards.terms import REWARD_TERMS

    REWARD_TERMS.pop("half_informative", None)


def _train(argv, tmp_path, monkeypatch):
    from jaxrl_agents.cli import train as cli

    run = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["jaxrl-train", *SMOKE, f"run_dir={run}", *argv])
    cli.main()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


def test_zero_variance_groups_are_refilled_to_a_full_batch(tmp_path, monkeypatch):
    rl = _train(
        ["reward.terms=[{name: half_informative}]", "trainer.rl.dynamic_sampling=true",
         "trainer.rl.dynamic_max_rounds=8"],
        tmp_path, monkeypatch,
    )  # fmt: skip
    assert len(rl) == 3
    for r in rl:
        assert r["dynamic/groups_trained"] == 4  # a full batch of informative groups
        assert r["dropped"] == 0
        assert r["adv_abs"] > 0
    assert sum(r["dynamic/groups_dropped"] for r in rl) > 0  # some had zero variance
    assert sum(r["dynamic/refill_rounds"] for r in rl) > 0  # and were replaced
    # every trained group is informative: success rate of the 0/1 reward is exactly one half
    assert all(r["reward"] == pytest.approx(0.5) for r in rl)


def test_overlong_masking_counts_cut_off_episodes(tmp_path, monkeypatch):
    # 24 new tokens a turn cuts the oracle-free tiny policy's turns (it rarely stops that soon).
    rl = _train(["trainer.rl.mask_overlong=true", "rollout.max_new_tokens=24",
                 "trainer.sft.steps=0"], tmp_path, monkeypatch)  # fmt: skip
    assert sum(r["overlong_masked"] for r in rl) > 0


@pytest.mark.parametrize("on", ["outcome", "reward"])
def test_an_outcome_keyed_fallback_skips_the_update(on, tmp_path, monkeypatch):
    """No SFT: the tiny policy never succeeds, so every group shares one outcome while the
    half_informative term still varies. Keyed on the outcome, each step falls back and trains
    nothing (the shaping term would be all its signal); keyed on the reward, the groups whose term
    varies are informative and train."""
    rl = _train(
        ["reward.terms=[{name: half_informative}]", "trainer.rl.dynamic_sampling=true",
         f"trainer.rl.dynamic_sampling_on={on}", "trainer.rl.dynamic_max_rounds=1",
         "trainer.sft.steps=0"],
        tmp_path, monkeypatch,
    )  # fmt: skip
    assert len(rl) == 3 and all(r["success"] == 0.0 for r in rl)
    if on == "outcome":
        assert all(r["dynamic/fallback"] == 1 and r["update_skipped"] == 1 for r in rl)
        assert all("loss" not in r for r in rl)
    else:
        # a step whose tasks all hash odd falls back too, but trains (zero advantages)
        assert all(r["update_skipped"] == 0 and "loss" in r for r in rl)
        assert any(r["dynamic/fallback"] == 0 and r["adv_abs"] > 0 for r in rl)
