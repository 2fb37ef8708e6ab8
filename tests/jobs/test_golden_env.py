"""``env.sft_options`` / ``env.sft_tasks``: the SFT golden data's own env and task mix."""

from __future__ import annotations

import asyncio

import pytest

from jaxrl_agents.envs.base import drive
from jaxrl_agents.envs.calculator import oracle_policy
from jaxrl_agents.jobs.build import resolve_env
from jaxrl_agents.jobs.config import ConfigError, EnvSpec


def test_golden_env_and_tasks_override_the_rl_ones():
    env = resolve_env(
        EnvSpec(
            options={"one_op_per_call": True, "fault_rate": 0.5},
            tasks={"two_step_frac": 0.5},
            sft_options={"fault_rate": 0.0},
            sft_tasks={"two_step_frac": 0.0},
        )
    )
    rl, golden = env.tasks("train", 40, seed=0), env.golden_tasks("train", 40, seed=0)
    assert any(len(t.data["steps"]) == 2 for t in rl)
    assert all(len(t.data["steps"]) == 1 for t in golden)
    rl_env, golden_env = env.factory(), env.golden_factory()
    assert rl_env.one_op_per_call and golden_env.one_op_per_call
    assert (rl_env.fault_rate, golden_env.fault_rate) == (0.5, 0.0)
    faults = []
    for task in golden:
        verdict, _, _ = asyncio.run(drive(env.golden_factory(), task, oracle_policy(task)))
        assert verdict.success
        faults.append(verdict.info["faults"])
    assert faults == [0] * len(golden)  # clean golden traces


@pytest.mark.parametrize(
    "spec, match",
    [
        (
            EnvSpec(sft_tasks={"two_steps": 0.0}),
            r"env\.sft_tasks\.two_steps: .*valid: two_step_frac",
        ),
        (EnvSpec(sft_options={"fault_rate": 2.0}), r"env\.sft_options: fault_rate must be in"),
        (EnvSpec(sft_options={"faults": 1}), r"env\.sft_options: .*faults"),
        (EnvSpec(rl_options={"fault_rate": -1.0}), r"env\.rl_options: fault_rate must be in"),
    ],
)
def test_bad_golden_settings_stop_in_one_line(spec, match):
    with pytest.raises(ConfigError, match=match):
        resolve_env(spec)


def test_sft_like_rl_demonstrates_the_rl_mix():
    """``env.sft_like_rl``: the annotator's episodes come from RL's task mix and env (faults at
    ``rl_options``' rate, two-step problems), and the oracle chains and retries through them."""
    spec = EnvSpec(
        options={"fault_rate": 0.3},
        tasks={"two_step_frac": 0.5},
        sft_options={"fault_rate": 0.0},
        sft_tasks={"two_step_frac": 0.0},
        rl_options={"fault_rate": 1.0},
        sft_like_rl=True,
    )
    env = resolve_env(spec)
    golden = env.golden_tasks("train", 40, seed=0)
    assert [t.data["steps"] for t in golden] == [
        t.data["steps"] for t in env.tasks("train", 40, seed=0)
    ]
    assert {len(t.data["steps"]) for t in golden} == {1, 2}
    assert env.golden_factory().fault_rate == 1.0 and env.factory().fault_rate == 0.3
    for task in golden:
        verdict, _, _ = asyncio.run(drive(env.golden_factory(), task, oracle_policy(task)))
        assert verdict.success and verdict.info["faults"] == 1  # a retry after the fault
