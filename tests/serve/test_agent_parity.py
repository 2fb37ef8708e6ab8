"""An agent function that sends what the built-in loop sends gets what the built-in loop gets:
the same sampling seeds turn by turn, hence the same sampled tokens; the same invalid-call tool
errors for the reward terms; the same end at ``rollout.max_turns``."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

import numpy as np
import pytest
from serve_helpers import Calc, Recorder, tiny_policy

from jaxrl_agents.envs.calculator import oracle_policy
from jaxrl_agents.generation import Engine, EngineConfig
from jaxrl_agents.rewards.terms import tool_validity
from jaxrl_agents.rollout.collector import Collector
from jaxrl_agents.rollout.orchestrator import RolloutConfig, episode_seed, turn_seed
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.serve.agent_collector import AgentCollector
from jaxrl_agents.serve.examples import calculator_agent
from jaxrl_agents.types import EndReason, ToolErrorKind

ROLLOUT = RolloutConfig(group_size=2, max_turns=4, max_new_tokens=48, max_total_tokens=384)


def _collectors(chat: Any, rollout: RolloutConfig) -> tuple[Collector, AgentCollector]:
    """The built-in loop's collector and one whose episodes are ``calculator_agent``'s."""
    return (
        Collector(chat=chat, env_factory=Calc, rollout=rollout),
        AgentCollector(chat=chat, env_factory=Calc, rollout=rollout, agent=calculator_agent),
    )


def _both(engine: Any, chat: Any, tasks: list, *, seed: int = 7, rollout=ROLLOUT, started=False):
    """The same tasks through the built-in loop, then through ``calculator_agent``, on
    ``engine`` (entered first when ``started``: the JAX engine)."""
    kw = dict(group_size=rollout.group_size, seed=seed, version=0, greedy=False)

    async def main():
        return [await c.episodes(engine, tasks, **kw) for c in _collectors(chat, rollout)]

    async def started_main():
        async with engine:
            return await main()

    return asyncio.run(started_main() if started else main())


def test_same_seed_same_sampled_tokens_on_the_real_engine(chat):
    """Temperature-1 sampling on the JAX engine: every episode's ids and log-probs through the
    agent are the built-in loop's, and a different seed gives different samples."""
    engine = Engine(
        tiny_policy(chat),
        EngineConfig(max_slots=4, max_seq_len=512, prefill_buckets=(64, 256), decode_chunk=8),
    )
    tasks = Calc.make_tasks("train", 3, seed=0)
    builtin, agent = _both(engine, chat, tasks, started=True)
    assert ROLLOUT.sampling.temperature == 1.0 and len(builtin) == len(agent) == 6
    for a, b in zip(builtin, agent, strict=True):
        assert (a.group_id, a.sample_index) == (b.group_id, b.sample_index)
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        # equal up to float rounding: a decode chunk's row bucket (how many sessions ran beside
        # this one, EngineConfig.decode_rows) changes the matmul shape, not the numbers' meaning
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
        assert sum(a.loss_mask) > 0
    assert any(a.token_ids != b.token_ids for a, b in zip(builtin[::2], builtin[1::2], strict=True))
    _, other = _both(engine, chat, tasks, seed=8, started=True)
    assert sum(a.token_ids != b.token_ids for a, b in zip(builtin, other, strict=True)) >= 4


def test_each_turn_is_seeded_as_the_built_in_loop_seeds_it(chat):
    """Multi-turn tool use (the scripted oracle, two calls then the answer): each episode's
    requests carry the built-in loop's seed of that turn, and the trajectories are equal."""
    tasks = Calc.make_tasks("train", 3, seed=0, two_step_frac=1.0)
    seeds, trajs = [], []
    for collector in _collectors(chat, ROLLOUT):
        rec = Recorder(ScriptedEngine(chat, policy_factory=oracle_policy))
        kw = dict(group_size=2, seed=7, version=0, greedy=False)
        trajs.append(asyncio.run(collector.episodes(rec, tasks, **kw)))
        per_session = collections.defaultdict(list)
        for number, params in rec.params:
            per_session[number].append(params.seed)
        seeds.append(sorted(tuple(s) for s in per_session.values()))
    assert all(t.success and len(t.turns) == 3 for t in trajs[0] + trajs[1])
    assert [t.token_ids for t in trajs[0]] == [t.token_ids for t in trajs[1]]
    expected = sorted(
        tuple(turn_seed(episode_seed(7, t.id, k), i) for i in range(3))
        for t in tasks
        for k in range(2)
    )
    assert seeds[0] == seeds[1] == expected


def _invalid_then_answer(task):
    """Turn 1: a malformed call, an unknown tool, bad arguments and one good call; turn 2: the
    answer."""
    step = task.data["steps"][0]

    def act(messages):
        if messages[-1]["role"] != "tool":
            return {
                "role": "assistant",
                "content": '<tool_call>\n{"name": "calculator", "arguments": {\n</tool_call>',
                "tool_calls": [
                    {"type": "function", "function": {"name": "abacus", "arguments": {}}},
                    {"type": "function", "function": {"name": "calculator", "arguments": {}}},
                    {
                        "type": "function",
                        "function": {
                            "name": "calculator",
                            "arguments": {"expression": step["expression"]},
                        },
                    },
                ],
            }
        return {"role": "assistant", "content": str(task.data["answer"])}

    return act


def test_invalid_calls_are_the_same_tool_errors_on_both_paths(chat):
    """The agent runs its own tools, yet the policy's invalid calls are recorded as the
    built-in env records them, so ``tool_validity`` scores both paths alike."""
    tasks = Calc.make_tasks("train", 2, seed=0)
    engine = ScriptedEngine(chat, policy_factory=_invalid_then_answer)
    long = RolloutConfig(group_size=1, max_turns=4, max_new_tokens=160, max_total_tokens=512)
    builtin, agent = _both(engine, chat, tasks, rollout=long)
    as_text = dataclasses.replace(long, malformed_calls="as_text")
    for a, b in zip(_both(engine, chat, tasks, rollout=as_text)[0], agent, strict=True):
        assert a.token_ids == b.token_ids  # the agent words its tool errors as the env does
    for a, b in zip(builtin, agent, strict=True):
        assert a.success and b.success, (a.error, b.error)
        kinds = [sorted(str(r.error_kind) for r in t.turns[0].tool_results) for t in (a, b)]
        assert kinds[0] == kinds[1], kinds
        assert sorted(r.error_kind for r in b.turns[0].tool_results if not r.ok) == sorted(
            [ToolErrorKind.MALFORMED, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.BAD_ARGUMENTS]
        )
        assert len(b.turns[0].tool_results) == 4  # the good call's result, from the agent
        assert tool_validity(a) == tool_validity(b) == [-0.6000000000000001, 0.0]


def _looping(task):
    """Calls the calculator on the first step, again and again."""
    call = {"name": "calculator", "arguments": {"expression": task.data["steps"][0]["expression"]}}

    def act(messages):
        return {"role": "assistant", "content": "", "tool_calls": [{"function": call}]}

    return act


def test_an_agent_past_max_turns_ends_as_the_built_in_loop_does(chat):
    """A policy that keeps calling the tool: the built-in loop stops it at ``max_turns``; the
    server refuses the agent's request past it and the episode ends ``max_turns`` alike."""
    rollout = RolloutConfig(group_size=1, max_turns=3, max_new_tokens=48, max_total_tokens=384)
    tasks = Calc.make_tasks("train", 2, seed=0)
    engine = ScriptedEngine(chat, policy_factory=_looping)
    builtin, agent = _both(engine, chat, tasks, rollout=rollout)
    for a, b in zip(builtin, agent, strict=True):
        assert a.end_reason == b.end_reason == EndReason.MAX_TURNS, (b.end_reason, b.error)
        assert len(a.turns) == len(b.turns) == 3 and not a.success and not b.success
        assert "limits.max_requests=3" in b.error


def _rambling(task):
    """The right number first, then words until the turn is cut off."""

    def act(messages):
        return {"role": "assistant", "content": f"{task.data['answer']}" + " and so on" * 40}

    return act


def test_a_turn_cut_off_by_max_new_tokens_is_no_answer_on_both_paths(chat):
    """A tool call or an answer cut off by ``max_new_tokens``: the built-in loop ends the
    episode ``max_tokens`` with no answer; through the agent the server refuses to continue the
    cut-off call, the cut-off answer the agent returns is not judged, and a call cut off in its
    middle is truncated, not an invalid call."""
    tasks = Calc.make_tasks("train", 2, seed=0, two_step_frac=1.0)
    errors = []
    # the second call is 25 tokens (its stop token is cut off) / the first is cut in its JSON /
    # the answer runs on
    for factory, new in ((oracle_policy, 24), (oracle_policy, 16), (_rambling, 24)):
        short = RolloutConfig(group_size=1, max_turns=4, max_new_tokens=new, max_total_tokens=384)
        engine = ScriptedEngine(chat, policy_factory=factory)
        builtin, agent = _both(engine, chat, tasks, rollout=short)
        for a, b in zip(builtin, agent, strict=True):
            assert a.end_reason == b.end_reason == EndReason.MAX_TOKENS, (b.end_reason, b.error)
            assert a.token_ids == b.token_ids and not a.success and not b.success
            assert b.turns[-1].finish_reason == "length"
            assert not b.turns[-1].tool_results  # truncated, not an invalid call
            assert tool_validity(a) == tool_validity(b)
            errors.append(b.error or "")
            if new == 16:  # the unparsable rest of a call: recorded as no invalid call
                assert [c.error is not None for c in b.turns[-1].tool_calls] == [True]
    assert all("limits.continue_truncated=false" in e for e in errors[:2]), errors


def _malformed_then_answer(task):
    """A call that does not parse, then (if the episode goes on) the answer."""

    def act(messages):
        if messages[-1]["role"] == "user":
            return {"role": "assistant", "content": '<tool_call>\n{"name": "calculator", \n'}
        return {"role": "assistant", "content": str(task.data["answer"])}

    return act


def test_malformed_calls_as_text_is_what_an_agent_sees(chat):
    """``rollout.malformed_calls=as_text``: the built-in loop treats an unparsable call as an
    OpenAI-compatible server shows it to an agent (plain text, so the turn is the final answer);
    ``feedback`` (the default) shows the model the parse error and goes on."""
    tasks = Calc.make_tasks("train", 2, seed=0)
    engine = ScriptedEngine(chat, policy_factory=_malformed_then_answer)
    as_text = dataclasses.replace(ROLLOUT, group_size=1, malformed_calls="as_text")
    builtin, agent = _both(engine, chat, tasks, rollout=as_text)
    feedback, _ = _both(
        engine, chat, tasks, rollout=dataclasses.replace(as_text, malformed_calls="feedback")
    )
    for a, b, f in zip(builtin, agent, feedback, strict=True):
        assert a.token_ids == b.token_ids and len(a.turns) == len(b.turns) == 1
        assert not a.success and not b.success and a.end_reason == b.end_reason
        for t in (a, b):
            assert [r.error_kind for r in t.turns[0].tool_results] == [ToolErrorKind.MALFORMED]
            assert tool_validity(t) == [-0.2]
        assert len(f.turns) == 2 and f.success  # the parse error was shown; the answer followed
    with pytest.raises(
        ValueError, match="rollout.malformed_calls='drop'; expected one of feedback, as_text"
    ):
        RolloutConfig(malformed_calls="drop")
