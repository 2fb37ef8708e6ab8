"""The dense partial-credit term of the reward-design experiment: +per_valid_call for each call
that ran, +per_hit for each required step newly done; a looping policy earns call credit for
spam (the hacking the experiment looks for) but no hits after the first."""

from __future__ import annotations

import asyncio

import pytest

from jaxrl_agents.jobs.build import build_chat, resolve_env
from jaxrl_agents.jobs.config import ChatSpec, EnvSpec
from jaxrl_agents.rewards.terms import partial_credit
from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine
from jaxrl_agents.rollout.scripted import scripted_factory
from jaxrl_agents.types import Ann


def episodes(policy: str, n: int = 4):
    env = resolve_env(EnvSpec(name="research"))
    chat = build_chat(ChatSpec())
    rollout = RolloutConfig(group_size=1, max_turns=8, max_new_tokens=4096, max_total_tokens=8192)
    engine = ScriptedEngine(chat, policy_factory=scripted_factory(policy, env.cls))
    orch = Collector(chat=chat, env_factory=env.factory, rollout=rollout).orchestrator(
        engine, greedy=True, group_size=1
    )
    return asyncio.run(orch.run(env.tasks("heldout", n, seed=0), group_size=1))


def test_oracle_gets_credit_for_every_call_and_every_required_step():
    for t in episodes("oracle"):
        per_turn = partial_credit(t, per_valid_call=0.1, per_hit=0.2)
        calls = sum(len(turn.tool_results) for turn in t.turns)
        required = len(t.verdict.info[Ann.REQUIRED_STEPS])
        assert len(per_turn) == len(t.turns)
        assert sum(per_turn) == pytest.approx(0.1 * calls + 0.2 * required)


def test_a_loop_is_paid_for_its_spam_but_not_for_hits():
    for t in episodes("loop"):
        per_turn = partial_credit(t, per_valid_call=0.1, per_hit=0.0)
        assert sum(per_turn) == pytest.approx(0.1 * len(t.turns) - 0.0, abs=0.11)
        hits = partial_credit(t, per_valid_call=0.0, per_hit=1.0)
        assert sum(hits) <= 1.0
