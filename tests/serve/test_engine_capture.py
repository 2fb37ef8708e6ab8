"""The server over the real JAX engine on a tiny model: the recorded ids are exactly the prompt
and continuation renderings plus the ids the engine sampled, and an RL update trains on them."""

from __future__ import annotations

import asyncio
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from serve_helpers import Calc, Recorder, calculator, tiny_policy

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.generation import Engine, EngineConfig
from jaxrl_agents.rollout.collector import Collector, Rollout
from jaxrl_agents.rollout.orchestrator import RolloutConfig
from jaxrl_agents.serve import Server, run_agents
from jaxrl_agents.serve.messages import template_message
from jaxrl_agents.training.step import OptimizerConfig, init_train_state
from jaxrl_agents.training.update import make_rl_update
from jaxrl_agents.types import EndReason


async def chatty_agent(client, task, logs):
    """Offers the calculator; runs any call the policy makes, else asks it to go on; returns
    the last text after three requests."""
    reset = await Calc().reset(task)
    messages = list(reset.messages)
    log = logs.setdefault(client.default_headers["X-Episode-Id"], [])
    msg = None
    for _ in range(3):
        log.append(list(messages))
        resp = await client.chat.completions.create(
            model="policy", messages=messages, tools=reset.tools, max_tokens=32
        )
        msg = resp.choices[0].message
        messages.append(msg)
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments)
            content = calculator(str(args.get("expression", "")))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if not msg.tool_calls:
            messages.append({"role": "user", "content": "Go on."})
    return msg.content


@pytest.fixture(scope="module")
def served(chat):
    model = tiny_policy(chat)
    engine = Engine(
        model,
        EngineConfig(max_slots=4, max_seq_len=512, prefill_buckets=(64, 256), decode_chunk=8),
    )
    rec = Recorder(engine)
    tasks = Calc.make_tasks("train", 2, seed=0)
    logs: dict[str, list] = {}

    def reward(traj):  # differs within each group, so the advantages are not all zero
        traj.reward = float(sum(traj.loss_mask) % 5)

    async def main():
        async with engine, Server(rec, chat) as server:
            runs = await run_agents(
                server,
                lambda client, task: chatty_agent(client, task, logs),
                tasks,
                group_size=2,
                timeout_s=120,
                reward_fn=reward,
            )
            return runs, server.stats

    runs, stats = asyncio.run(main())
    return model, rec, runs, logs, stats


def test_recorded_ids_are_the_renderings_and_the_sampled_ids(chat, served):
    _, rec, runs, logs, stats = served
    assert stats["rewrites"] == 0 and rec.opened == rec.closed == 4
    sessions: dict[int, list] = {}
    for number, new, res in rec.calls:
        sessions.setdefault(number, []).append((new, res))
    for run in runs:
        t, log = run.trajectory, logs[run.record.key]
        assert t.end_reason == EndReason.ANSWERED and len(run.record.segments) == 1, t.error
        assert len(t.turns) == 3 == len(log)
        tools = t.tools
        # the renderings, computed here from the agent's own requests
        rendered = [chat.prompt_ids([template_message(m, i) for i, m in enumerate(log[0])], tools)]
        for before, now in zip(log, log[1:], strict=False):
            new = [template_message(m, i) for i, m in enumerate(now[len(before) + 1 :])]
            rendered.append(chat.continuation_ids(new, tools))
        # a session fed exactly these renderings (the group's samples share them) whose
        # sampled ids fill the turns
        turns = [t.token_ids[u.start : u.end] for u in t.turns]
        calls = next(
            c
            for c in sessions.values()
            if [new for new, _ in c] == rendered and [r.token_ids for _, r in c] == turns
        )
        ids, mask, logprobs = [], [], []
        for new, res in calls:
            ids += new + res.token_ids
            mask += [0] * len(new) + [1] * len(res.token_ids)
            logprobs += [0.0] * len(new) + res.logprobs
        assert t.token_ids == ids and t.loss_mask == mask and t.logprobs == logprobs
        assert all(r.token_ids[-1] == chat.stop_token_ids[0] for _, r in calls)


def test_rl_update_trains_on_captured_trajectories(chat, served):
    model, _, runs, _, _ = served
    trajs = [r.trajectory for r in runs]
    assert len({t.reward for t in trajs}) > 1
    rollout = RolloutConfig(group_size=2, max_turns=4, max_new_tokens=32, max_total_tokens=512)
    collector = Collector(chat=chat, env_factory=Calc, rollout=rollout, seq_buckets=(512,))
    db = collector.device_batch(Rollout(trajs, 0, 0.0), rows=len(trajs), max_turns=4)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    before = jax.tree.map(np.asarray, params)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=0).build()
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=LossConfig(name="ppo_clip"),
        adv_cfg=AdvantageConfig(name="grpo"),
        epochs=1,
        minibatches=1,
        microbatches=1,
        logprob_chunk=128,
    )
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)
    state, met = update(state, db.batch, db.episodes, jax.random.key(0), None)
    assert np.isfinite(float(met.loss))
    # the captured logprobs are the sampler's: the learner's ratio at the same weights is 1
    assert float(met.ratio_mean) == pytest.approx(1.0, abs=1e-4)
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), state.params, before)
    assert any(jax.tree.leaves(changed))
