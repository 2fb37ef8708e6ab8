"""Path matrix, env x reward: every env preset under configs/env with every reward preset under
configs/reward (the folders are enumerated, so a new file is covered automatically). Episodes of
the env's scripted oracle and of a scripted policy that fails (``wrong`` where the env has one,
else ``loop``) run through the rollout collector with the composed reward: every trajectory ends
with a reason, every reward and term is finite, and the oracle outscores the failing policy."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ENVS = sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml"))
REWARDS = sorted(p.stem for p in (CONFIGS / "reward").glob("*.yaml"))


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("env", ENVS)
def test_env_x_reward(env, reward):
    from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.build import build_reward, resolve_env
    from jaxrl_agents.rollout import Collector, ScriptedEngine
    from jaxrl_agents.rollout.scripted import scripted_factory
    from jaxrl_agents.types import EndReason

    cfg = to_run_config(compose("config", [f"env={env}", f"reward={reward}"]))
    binding = resolve_env(cfg.env)
    chat = ChatFormat(load_tiny_tokenizer())
    # A model judge (reward=judged) is the train job's to build; a constant judge stands in.
    judges = {cfg.judge.name: lambda traj: 0.5}
    collector = Collector(
        chat=chat,
        env_factory=binding.factory,
        rollout=cfg.rollout,
        reward=build_reward(cfg.reward, judges),
    )
    tasks = binding.tasks("heldout", 6, seed=0)

    async def run(name):
        try:
            factory = scripted_factory(name, binding.cls)
        except ValueError:
            factory = scripted_factory("loop", binding.cls)
        orch = collector.orchestrator(ScriptedEngine(chat, policy_factory=factory), greedy=True,
                                      group_size=1)  # fmt: skip
        trajs = await orch.run(tasks, group_size=1, seed=0)
        await collector.score(trajs)
        return trajs

    good, bad = asyncio.run(run("oracle")), asyncio.run(run("wrong"))
    for t in good + bad:
        assert isinstance(t.end_reason, EndReason) and t.end_reason != EndReason.REWARD_ERROR
        assert math.isfinite(t.reward), (t.reward, t.reward_terms)
        assert all(math.isfinite(v) for v in t.reward_terms.values()), t.reward_terms
        assert set(t.reward_terms) == {term.name for term in cfg.reward.terms}
    assert all(t.end_reason == EndReason.ANSWERED and t.success for t in good)
    mean = lambda ts: sum(t.reward for t in ts) / len(ts)
    assert mean(good) > mean(bad), (mean(good), mean(bad))
