"""The rollout orchestrator through the real chat format and env, driven by scripted policies:
token in / token out, loss masks, end reasons, fault handling, concurrency."""

import asyncio
import time

import pytest

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
from jaxrl_agents.envs import ENVIRONMENTS
from jaxrl_agents.envs.calculator import oracle_policy, wrong_policy
from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.types import EndReason, EnvStep

Calc = ENVIRONMENTS["calculator"]


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tiny_tokenizer())


def _orch(chat, engine, env_factory=Calc, **cfg):
    return Orchestrator(
        engine=engine,
        chat=chat,
        env_factory=env_factory,
        cfg=RolloutConfig(
            **{
                "group_size": 2,
                "max_turns": 4,
                "max_new_tokens": 64,
                "max_total_tokens": 512,
                **cfg,
            }
        ),
        sampling_params=lambda n, seed: type("P", (), {"max_new_tokens": n, "seed": seed})(),
    )


def test_oracle_solves_and_tokens_match_template(chat):
    tasks = Calc.make_tasks("heldout", 6, seed=1)
    orch = _orch(chat, ScriptedEngine(chat, policy_factory=oracle_policy))
    trajs = asyncio.run(orch.run(tasks, group_size=2))
    assert len(trajs) == 12
    assert [(t.group_id, t.sample_index) for t in trajs] == [
        (i, k) for i in range(6) for k in range(2)
    ]
    for t in trajs:
        assert t.success and t.end_reason == EndReason.ANSWERED
        assert len(t.turns) >= 2 and t.tool_calls
        # token in / token out: ids == the template's incremental rendering of the final messages
        enc = chat.encode_conversation(t.messages, t.tools)
        assert t.token_ids == enc.ids
        assert t.loss_mask == enc.loss_mask
        assert [(u.start, u.end) for u in t.turns] == enc.turn_spans
        assert len(t.logprobs) == len(t.token_ids)
        # the mask covers exactly the sampled spans
        sampled = {i for u in t.turns for i in range(u.start, u.end)}
        assert {i for i, m in enumerate(t.loss_mask) if m} == sampled


def test_wrong_policy_fails(chat):
    tasks = Calc.make_tasks("heldout", 4, seed=1)
    orch = _orch(chat, ScriptedEngine(chat, policy_factory=wrong_policy))
    trajs = asyncio.run(orch.run(tasks, group_size=1))
    assert not any(t.success for t in trajs)
    assert all(t.end_reason == EndReason.ANSWERED and len(t.turns) == 1 for t in trajs)


def _looping(task):
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1+1"}},
    }
    return lambda messages: {"role": "assistant", "content": "", "tool_calls": [call]}


def test_max_turns_and_max_tokens(chat):
    tasks = Calc.make_tasks("train", 2, seed=0)
    trajs = asyncio.run(
        _orch(chat, ScriptedEngine(chat, policy_factory=_looping), max_turns=3).run(
            tasks, group_size=1
        )
    )
    assert all(t.end_reason == EndReason.MAX_TURNS and len(t.turns) == 3 for t in trajs)
    trajs = asyncio.run(
        _orch(
            chat, ScriptedEngine(chat, policy_factory=_looping), max_turns=50, max_total_tokens=200
        ).run(tasks, group_size=1)
    )
    assert all(t.end_reason == EndReason.MAX_TOKENS for t in trajs)
    assert all(len(t.token_ids) <= 200 for t in trajs)


class _RaisingEnv(Calc):
    async def step(self, message, tool_calls):
        raise RuntimeError("backend down")


class _HangingEnv(Calc):
    async def step(self, message, tool_calls):
        await asyncio.sleep(3600)
        return EnvStep(messages=[], done=True)


def test_env_faults_end_episodes_with_reasons(chat):
    tasks = Calc.make_tasks("train", 3, seed=0)
    t0 = time.time()
    trajs = asyncio.run(
        _orch(
            chat, ScriptedEngine(chat, policy_factory=oracle_policy), env_factory=_RaisingEnv
        ).run(tasks, group_size=1)
    )
    assert all(t.end_reason == EndReason.ENV_ERROR and "backend down" in t.error for t in trajs)
    assert all(t.turns and sum(t.loss_mask) > 0 for t in trajs)  # data kept
    trajs = asyncio.run(
        _orch(
            chat,
            ScriptedEngine(chat, policy_factory=oracle_policy),
            env_factory=_HangingEnv,
            episode_timeout_s=0.5,
        ).run(tasks, group_size=2)
    )
    assert all(t.end_reason == EndReason.EPISODE_TIMEOUT for t in trajs)
    assert all(t.turns for t in trajs)
    assert time.time() - t0 < 10


def test_latency_is_overlapped_across_episodes(chat):
    """32 episodes x 2 generate calls each with 0.1 s policy latency finish far faster than the
    6.4 s a sequential loop would take."""
    tasks = Calc.make_tasks("train", 16, seed=0)
    engine = ScriptedEngine(chat, policy_factory=oracle_policy, latency_s=0.1)
    t0 = time.time()
    trajs = asyncio.run(_orch(chat, engine).run(tasks, group_size=2))
    assert len(trajs) == 32 and all(t.success for t in trajs)
    assert time.time() - t0 < 2.0
    assert engine.open_sessions == 0  # every slot released
