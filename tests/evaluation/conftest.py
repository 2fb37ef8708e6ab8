"""Scripted policies with known behaviour, run through the real orchestrator + calculator env +
the shipped tokenizer's ChatFormat (no model)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
from jaxrl_agents.envs.calculator import CalculatorEnv, oracle_policy, wrong_policy
from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
from jaxrl_agents.rollout.scripted import ScriptedEngine


@dataclasses.dataclass
class _Params:
    max_new_tokens: int
    seed: int


def _call(k: int, name: str, expression: str) -> dict:
    fn = {"name": name, "arguments": {"expression": expression}}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{k}", "function": fn}]}


def looping(task):
    """Repeats the first step's calculator call forever, alternating spacing (a near-duplicate
    that ``ToolCall.signature()`` alone would miss)."""
    expr = task.data["steps"][0]["expression"]

    def policy(messages):
        k = sum(m["role"] == "tool" for m in messages)
        return _call(k, "calculator", expr if k % 2 == 0 else expr.replace("*", " * "))

    return policy


def context_loss(task):
    """Does every step with the tool, then answers a number the tool never produced."""
    inner = oracle_policy(task)

    def policy(messages):
        msg = inner(messages)
        if msg.get("tool_calls"):
            return msg
        return {"role": "assistant", "content": str(task.data["answer"] + 1)}

    return policy


def invalid_then_correct(task):
    """First calls an unknown tool, then solves the task like the oracle."""
    inner = oracle_policy(task)

    def policy(messages):
        tool_msgs = [i for i, m in enumerate(messages) if m["role"] == "tool"]
        if not tool_msgs:
            return _call(0, "calc", task.data["steps"][0]["expression"])
        return inner([m for i, m in enumerate(messages) if i != tool_msgs[0]])

    return policy


POLICIES = {
    "oracle": oracle_policy,
    "early": wrong_policy,
    "loop": looping,
    "context_loss": context_loss,
    "invalid": invalid_then_correct,
}


@pytest.fixture(scope="session")
def chat():
    return ChatFormat(load_tiny_tokenizer())


@pytest.fixture(scope="session")
def tasks():
    return CalculatorEnv.make_tasks("heldout", 8, seed=0, two_step_frac=0.5)


@pytest.fixture(scope="session")
def rollout(chat):
    """``rollout(policy_factory, tasks, samples=1, latency_s=0, timeout_s=30) -> trajectories``."""

    def run(factory, tasks, *, samples=1, latency_s=0.0, timeout_s=30.0):
        cfg = RolloutConfig(
            group_size=samples,
            max_turns=4,
            max_new_tokens=96,
            max_total_tokens=2048,
            episode_timeout_s=timeout_s,
        )
        orch = Orchestrator(
            engine=ScriptedEngine(chat, policy_factory=factory, latency_s=latency_s),
            chat=chat,
            env_factory=CalculatorEnv,
            cfg=cfg,
            sampling_params=lambda n, seed: _Params(n, seed),
        )
        return asyncio.run(orch.run(tasks, seed=0))

    return run
