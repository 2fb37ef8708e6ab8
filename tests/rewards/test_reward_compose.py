"""Reward terms and their composition: a table over weights, gates, clipping and assignment."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jaxrl_agents.rewards import REWARD_TERMS, RewardComposer, RewardConfig, register_judge
from jaxrl_agents.types import (
    Ann,
    EndReason,
    Task,
    ToolCall,
    ToolErrorKind,
    ToolResult,
    Trajectory,
    Turn,
    Verdict,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "reward"


def call(name="search", **args) -> ToolCall:
    return ToolCall(name=name, arguments=args)


def turn(
    i, *, calls=(), errors=(), n_tokens=5, ann=None, text="ok", finish="stop", env_reward=None
):
    calls = list(calls)
    results = [
        ToolResult(call=c, content="r", error_kind=e) for c, e in zip(calls, errors, strict=False)
    ]
    return Turn(
        index=i,
        start=10 * i,
        end=10 * i + n_tokens,
        text=text,
        tool_calls=calls,
        tool_results=results,
        finish_reason=finish,
        annotations=dict(ann or {}),
        env_reward=env_reward,
    )


def traj(turns, *, success=True, end=EndReason.ANSWERED) -> Trajectory:
    return Trajectory(
        task=Task("t0", "toy", "train", {}),
        messages=[],
        tools=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        prompt_len=0,
        turns=list(turns),
        end_reason=end,
        verdict=Verdict(success=success),
    )


def three_turns(success=True):
    """Turn 0: two calls (one BAD_ARGUMENTS); turn 1 repeats turn 0's first call; turn 2 answers."""
    c = call(q="paris")
    return traj(
        [
            turn(0, calls=[c, call(q="x")], errors=[None, ToolErrorKind.BAD_ARGUMENTS]),
            turn(1, calls=[call(q="paris")], errors=[None]),
            turn(2),
        ],
        success=success,
    )


def compose(terms, t):
    return RewardComposer(RewardConfig.from_dict({"terms": terms}))(t)


# Each row: terms, success, expected total, expected turn_rewards, expected logged terms.
TABLE = [
    # outcome lands on the last turn
    ([{"name": "outcome"}], True, 1.0, [0, 0, 1.0], {"outcome": 1.0}),
    ([{"name": "outcome"}], False, -1.0, [0, 0, -1.0], {"outcome": -1.0}),
    # weights scale; step penalty -0.05 on each of 3 turns, weight 2 -> -0.1 per turn
    (
        [{"name": "outcome", "weight": 0.5}, {"name": "step_penalty", "weight": 2.0}],
        True,
        0.5 - 0.3,
        [-0.1, -0.1, 0.5 - 0.1],
        {"outcome": 0.5, "step_penalty": -0.3},
    ),
    # validity: one BAD_ARGUMENTS call in turn 0 -> -0.2 on turn 0
    ([{"name": "tool_validity"}], True, -0.2, [-0.2, 0, 0], {"tool_validity": -0.2}),
    # assign=trajectory moves it to the last turn
    (
        [{"name": "tool_validity", "assign": "trajectory"}],
        True,
        -0.2,
        [0, 0, -0.2],
        {"tool_validity": -0.2},
    ),
    # gate success: efficiency (3 calls * -0.02 = -0.06: turn0 -0.04, turn1 -0.02), success only
    (
        [{"name": "efficiency", "gate": "success"}],
        True,
        -0.06,
        [-0.04, -0.02, 0],
        {"efficiency": -0.06},
    ),
    ([{"name": "efficiency", "gate": "success"}], False, 0.0, [0, 0, 0], {"efficiency": 0.0}),
    (
        [{"name": "efficiency", "gate": "failure"}],
        False,
        -0.06,
        [-0.04, -0.02, 0],
        {"efficiency": -0.06},
    ),
    # clip bounds the trajectory total (raw units) before the weight; turns keep their shares:
    # step raw -0.15 clipped to -0.09 -> each turn -0.03; weight 2 -> -0.06 per turn
    (
        [{"name": "step_penalty", "clip": [-0.09, 0.0], "weight": 2.0}],
        True,
        -0.18,
        [-0.06, -0.06, -0.06],
        {"step_penalty": -0.18},
    ),
    # clip that does not bind changes nothing; loop: turn 1 repeats an identical call -> -0.1
    ([{"name": "loop", "clip": [-1.0, 0.0]}], True, -0.1, [0, -0.1, 0], {"loop": -0.1}),
    # clip a positive outcome: +1 -> 0.5, then weight 3
    (
        [{"name": "outcome", "clip": [-1.0, 0.5], "weight": 3.0}],
        True,
        1.5,
        [0, 0, 1.5],
        {"outcome": 1.5},
    ),
    # everything together (outcome_efficiency defaults): 1 - 0.15 - 0.2 - 0.06
    (
        [
            {"name": "outcome"},
            {"name": "step_penalty"},
            {"name": "tool_validity"},
            {"name": "efficiency", "gate": "success", "clip": [-0.5, 0.0]},
        ],
        True,
        1 - 0.15 - 0.2 - 0.06,
        [-0.05 - 0.2 - 0.04, -0.05 - 0.02, 1 - 0.05],
        {"outcome": 1.0, "step_penalty": -0.15, "tool_validity": -0.2, "efficiency": -0.06},
    ),
]


@pytest.mark.parametrize("row", range(len(TABLE)))
def test_composition_table(row):
    terms, success, total, turn_rewards, logged = TABLE[row]
    t = three_turns(success)
    out = compose(terms, t)
    assert out.total == pytest.approx(total)
    assert out.turn_rewards == pytest.approx(turn_rewards)
    assert out.terms == pytest.approx(logged)
    assert sum(out.turn_rewards) == pytest.approx(out.total)
    # written in place: traj.reward, traj.reward_terms, and per-turn terms summing to turn rewards
    assert t.reward == pytest.approx(total) and t.reward_terms == pytest.approx(logged)
    assert [sum(tt.reward_terms.values()) for tt in t.turns] == pytest.approx(turn_rewards)


def test_raw_is_logged_before_clip_gate_weight():
    out = compose(
        [
            {"name": "step_penalty", "clip": [-0.09, 0.0], "weight": 2.0},
            {"name": "efficiency", "gate": "success"},
        ],
        three_turns(success=False),
    )
    assert out.raw == pytest.approx({"step_penalty": -0.15, "efficiency": -0.06})


def test_tool_validity_kinds_and_near_identical_loops():
    kinds = [
        ToolErrorKind.MALFORMED,
        ToolErrorKind.UNKNOWN_TOOL,
        ToolErrorKind.TOOL_ERROR,
        ToolErrorKind.TIMEOUT,
    ]
    t = traj([turn(0, calls=[call(q=str(i)) for i in range(4)], errors=kinds)])
    assert compose([{"name": "tool_validity"}], t).total == pytest.approx(-0.4)
    opt_in = {
        "name": "tool_validity",
        "params": {"count_tool_errors": True, "count_timeouts": True},
    }
    assert compose([opt_in], t).total == pytest.approx(-0.8)
    # loop counts calls equal up to case / whitespace / number spelling (facts.call_key); a
    # one-character-different query is a different call, not a near-duplicate.
    near = traj(
        [
            turn(0, calls=[call(q="capital of france")]),
            turn(1, calls=[call(q="capital of frances")]),
            turn(2, calls=[call(q="Capital of  France ")]),
        ]
    )
    assert compose([{"name": "loop"}], near).turn_rewards == pytest.approx([0.0, 0.0, -0.1])
    with pytest.raises(ValueError, match=r"unknown params \['similarity'\]"):
        RewardConfig.from_dict({"terms": [{"name": "loop", "params": {"similarity": 0.9}}]})


def test_premature_constraint_progress_format_efficiency_tokens():
    t = traj(
        [
            turn(0, ann={Ann.PROGRESS: 0.5, Ann.CONSTRAINT_VIOLATIONS: ["budget"]}, n_tokens=7),
            turn(1, ann={Ann.PROGRESS: 0.25}, finish="length", n_tokens=3, env_reward=0.1),
            turn(2, ann={Ann.ANSWERED: True, Ann.EVIDENCE_COMPLETE: False}, text="final"),
        ]
    )
    assert compose([{"name": "premature"}], t).turn_rewards == pytest.approx([0, 0, -0.5])
    assert compose([{"name": "constraint"}], t).turn_rewards == pytest.approx([-0.1, 0, 0])
    # delta progress: 0.5, -0.25 (+0.1 env reward), then unchanged 0
    assert compose([{"name": "progress"}], t).turn_rewards == pytest.approx([0.5, -0.15, 0.0])
    fmt = compose([{"name": "format", "params": {"pattern": "^final$"}}], t)
    assert fmt.turn_rewards == pytest.approx(
        [-0.1, -0.1, 0.0]
    )  # no match / truncated+no match / ok
    # sampled tokens only (end - start): 7 + 3 + 5
    eff = compose([{"name": "efficiency", "params": {"per_call": 0.0, "per_token": -0.01}}], t)
    assert eff.total == pytest.approx(-0.15)
    # evidence complete (or missing key) -> no premature penalty
    t.turns[2].annotations[Ann.EVIDENCE_COMPLETE] = True
    assert compose([{"name": "premature"}], t).total == 0.0


def test_async_judge_hook():
    seen = []

    async def rubric(tr):
        seen.append(tr.task.id)
        await asyncio.sleep(0)
        return 0.75

    register_judge("test_rubric", rubric)
    cfg = RewardConfig.from_dict(
        {
            "terms": [
                {"name": "outcome"},
                {"name": "judge", "weight": 0.5, "params": {"name": "test_rubric"}},
            ]
        }
    )
    composer = RewardComposer(cfg)
    out = asyncio.run(composer.acompute(three_turns()))
    assert out.terms["judge"] == pytest.approx(0.375) and out.total == pytest.approx(1.375)
    assert composer(three_turns()).total == pytest.approx(1.375)  # sync call outside a loop

    async def slow(tr):
        await asyncio.sleep(5)
        return 1.0

    bad = RewardConfig.from_dict(
        {
            "terms": [
                {"name": "judge", "params": {"name": "slow", "timeout_s": 0.01, "on_error": "zero"}}
            ]
        }
    )
    assert (
        asyncio.run(RewardComposer(bad, judges={"slow": slow}).acompute(three_turns())).total == 0.0
    )
    with pytest.raises(ValueError, match="unknown judge 'nope'"):
        compose([{"name": "judge", "params": {"name": "nope"}}], three_turns())


def test_config_errors_and_shipped_yaml():
    with pytest.raises(ValueError, match="unknown reward term 'outcom'.*outcome.*step_penalty"):
        RewardConfig.from_dict({"terms": [{"name": "outcom"}]})
    with pytest.raises(
        ValueError, match="unknown params \\['per_stp'\\]; valid: free_steps, per_step"
    ):
        RewardConfig.from_dict({"terms": [{"name": "step_penalty", "params": {"per_stp": 1}}]})
    with pytest.raises(ValueError, match="gate 'win'"):
        RewardConfig.from_dict({"terms": [{"name": "outcome", "gate": "win"}]})
    with pytest.raises(ValueError, match="allowed keys"):
        RewardConfig.from_dict({"terms": [{"name": "outcome", "wieght": 2}]})
    for name in ("outcome", "outcome_efficiency", "agentic"):
        cfg = RewardConfig.from_dict(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
        assert cfg.terms[0].name == "outcome"
        # the outcome dominates: a success with every penalty firing still beats a clean failure
        assert (
            RewardComposer(cfg)(three_turns(True)).total
            > RewardComposer(cfg)(three_turns(False)).total
        )
    assert {"outcome", "judge", "progress", "loop", "premature", "constraint"} <= set(REWARD_TERMS)


def test_rewards_package_does_not_import_jax():
    code = "import sys, jaxrl_agents.rewards; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
