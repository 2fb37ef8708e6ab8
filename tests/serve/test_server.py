"""The OpenAI-compatible server driven by the real openai client, over a scripted engine (the
calculator env's oracle behind the sampler's session interface): exact token capture of a
multi-turn tool-using agent, rewritten histories, n > 1, limits, auth, and failing agents."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from serve_helpers import Calc, Recorder, calculator_agent, serve

from jaxrl_agents.envs.calculator import oracle_policy
from jaxrl_agents.generation.config import GenerationResult
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.serve import ServeLimits, Server, env_judge, openai_client, run_agents
from jaxrl_agents.serve.agent_rollout import run_agent_episode
from jaxrl_agents.types import EndReason


def _oracle(chat):
    return Recorder(ScriptedEngine(chat, policy_factory=oracle_policy))


def test_tool_using_agent_is_recorded_token_for_token(chat):
    tasks = Calc.make_tasks("heldout", 3, seed=1)
    engine = _oracle(chat)

    async def body(server):
        return await run_agents(
            server, calculator_agent, tasks, group_size=2, timeout_s=30, verify=env_judge(Calc)
        )

    runs = serve(engine, chat, body)
    assert len(runs) == 6 and engine.opened == engine.closed  # every slot released
    streams: dict[int, tuple[list[int], list[int]]] = {}
    for number, new, res in engine.calls:  # each session: fed ids, then sampled ids, in order
        ids, mask = streams.setdefault(number, ([], []))
        ids += new + res.token_ids
        mask += [0] * len(new) + [1] * len(res.token_ids)
    for run in runs:
        t = run.trajectory
        assert t.end_reason == EndReason.ANSWERED and t.success, t.error
        assert len(t.turns) >= 2 and t.tool_calls and run.record.rewrites == 0
        assert len(run.record.segments) == 1 and t.turns[0].tool_results
        # the template's incremental rendering of the final conversation, as the orchestrator's
        enc = chat.encode_conversation(t.messages, t.tools)
        assert t.token_ids == enc.ids and t.loss_mask == enc.loss_mask
        assert [(u.start, u.end) for u in t.turns] == enc.turn_spans
        # exactly what the engine was fed and sampled, in order, on one session
        assert (t.token_ids, t.loss_mask) in streams.values()
        assert t.prompt_len == len(chat.prompt_ids(t.messages[:2], t.tools))
        assert t.verdict.info["answer_text"] == t.messages[-1]["content"]


def _call(client, messages, **kw):
    return client.chat.completions.create(model="policy", messages=messages, **kw)


def test_rewritten_history_starts_a_counted_segment(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]
    engine = _oracle(chat)

    async def body(server):
        key = server.open_episode(task)
        client = openai_client(server, key, timeout_s=30)
        env = Calc()
        reset = await env.reset(task)
        msgs = list(reset.messages)
        first = (await _call(client, msgs, tools=reset.tools)).choices[0].message
        call = first.tool_calls[0]
        tool = {"role": "tool", "tool_call_id": call.id, "name": "calculator", "content": "7"}
        # echoed as the SDK returns it, with content None and the arguments re-spaced: continues
        echoed = first.model_dump(exclude_none=True)
        echoed["content"] = None
        args = json.loads(call.function.arguments)
        echoed["tool_calls"][0]["function"]["arguments"] = json.dumps(args, indent=2)
        await _call(client, [*msgs, echoed, tool], tools=reset.tools)
        assert server.store.rewrites(key) == 0
        # the agent edits its earlier assistant message: a new segment, counted
        edited = {
            "role": "assistant",
            "content": "let me think",
            "tool_calls": echoed["tool_calls"],
        }
        await _call(client, [*msgs, edited, tool], tools=reset.tools)
        assert server.store.rewrites(key) == 1
        # trimming the history is a rewrite too
        await _call(client, msgs[:1] + msgs[1:], tools=reset.tools)
        record = await server.close_episode(key)
        await client.close()
        return record, server.stats

    record, stats = serve(engine, chat, body)
    assert record.rewrites == 2 and stats["rewrites"] == 2
    assert [s.reason for s in record.segments] == ["first", "rewrite", "rewrite"]
    assert [len(s.turns) for s in record.segments] == [2, 1, 1]
    second = record.segments[1]
    assert second.token_ids[: second.prompt_len] == chat.prompt_ids(
        second.messages[:4], second.tools
    )
    assert second.messages[2]["content"] == "let me think"
    assert sum(second.loss_mask) == second.turns[0].end - second.turns[0].start


def test_n_choices_keep_the_one_continued(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]
    rec = _oracle(chat)

    async def body(server):
        key = server.open_episode(task)
        client = openai_client(server, key, timeout_s=30)
        reset = await Calc().reset(task)
        msgs = list(reset.messages)
        resp = await _call(client, msgs, tools=reset.tools, n=3)
        assert [c.index for c in resp.choices] == [0, 1, 2]
        assert {c.finish_reason for c in resp.choices} == {"tool_calls"}
        picked = resp.choices[2].message
        tool = {"role": "tool", "tool_call_id": picked.tool_calls[0].id, "content": "7"}
        await _call(client, [*msgs, picked, tool], tools=reset.tools)
        record = await server.close_episode(key)
        await client.close()
        return record

    record = serve(rec, chat, body)
    (seg,) = record.segments
    assert record.rewrites == 0 and len(seg.turns) == 2
    third = [r for n, _, r in rec.calls if n == 3]  # the third choice's session
    assert seg.token_ids[seg.turns[0].start : seg.turns[0].end] == third[0].token_ids
    assert [n for n, _, _ in rec.calls] == [1, 2, 3, 3]  # the kept session continued
    assert rec.opened == rec.closed == 3


def test_limits_auth_and_unknown_episodes(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]
    limits = ServeLimits(max_n=2, max_tokens=32, max_messages=4, max_body_bytes=4096)

    async def body(server):
        key = server.open_episode(task)
        msgs = [{"role": "user", "content": "hi"}]
        good = openai_client(server, key, timeout_s=30)
        good.api_key = "s3cret"
        wrong = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="nope", default_headers={"X-Episode-Id": key}
        )
        with pytest.raises(openai.AuthenticationError):
            await _call(wrong, msgs)
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        models = await good.models.list()
        assert [m.id for m in models.data] == ["policy"]
        with pytest.raises(openai.BadRequestError, match=r"n=3 .*limits.max_n=2"):
            await _call(good, msgs, n=3)
        with pytest.raises(openai.BadRequestError, match=r"max_tokens=99 .*limits.max_tokens=32"):
            await _call(good, msgs, max_tokens=99)
        with pytest.raises(openai.BadRequestError, match=r"5 messages > limits.max_messages=4"):
            await _call(good, msgs * 5)
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            await _call(good, msgs, tool_choice="required")
        unknown = openai.AsyncOpenAI(
            base_url=server.base_url, api_key="s3cret", default_headers={"X-Episode-Id": "ep-x"}
        )
        with pytest.raises(openai.NotFoundError, match="unknown episode"):
            await _call(unknown, msgs)
        # the key in the body (extra_body) works as well as the header
        plain = openai.AsyncOpenAI(base_url=server.base_url, api_key="s3cret")
        with pytest.raises(openai.BadRequestError, match="no episode key"):
            await _call(plain, msgs)
        resp = await _call(plain, msgs, extra_body={"episode_id": key})
        assert resp.choices[0].finish_reason == "stop"
        usage = resp.usage
        assert usage.prompt_tokens == len(chat.prompt_ids(msgs))
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
        async with httpx.AsyncClient() as h:
            r = await h.post(
                server.base_url + "/chat/completions",
                content=b"x" * 5000,
                headers={"Authorization": "Bearer s3cret", "X-Episode-Id": key},
            )
        assert r.status_code == 413 and "limits.max_body_bytes=4096" in r.json()["error"]["message"]
        await server.close_episode(key)
        with pytest.raises(openai.NotFoundError):  # closed: unknown from now on
            await _call(good, msgs)
        for c in (good, wrong, unknown, plain):
            await c.close()

    serve(_oracle(chat), chat, body, api_key="s3cret", limits=limits)


def test_non_loopback_bind_needs_a_key(chat):
    engine = _oracle(chat)
    with pytest.raises(ValueError, match=r"host='0.0.0.0' without an api_key"):
        Server(engine, chat, host="0.0.0.0")
    Server(engine, chat, host="0.0.0.0", api_key="k")  # allowed with a key (not started)
    Server(engine, chat, host="localhost")


def test_failing_agents_end_only_their_episode(chat):
    tasks = Calc.make_tasks("train", 2, seed=0)

    async def agent(client, task):
        answer = await calculator_agent(client, task)
        if task.id == tasks[0].id:
            raise RuntimeError("agent crashed")
        return answer

    async def hanging(client, task):
        reset = await Calc().reset(task)
        await _call(client, reset.messages, tools=reset.tools)
        await asyncio.sleep(3600)

    async def body(server):
        runs = await run_agents(server, agent, tasks, group_size=2, timeout_s=20)
        hung = await run_agent_episode(server, hanging, tasks[0], timeout_s=0.5)
        return runs, hung, server.stats

    runs, hung, stats = serve(_oracle(chat), chat, body)
    ends = [r.trajectory.end_reason for r in runs]
    assert ends == [EndReason.ENV_ERROR] * 2 + [EndReason.ANSWERED] * 2
    assert all("agent crashed" in r.trajectory.error for r in runs[:2])
    assert all(r.trajectory.turns and sum(r.trajectory.loss_mask) > 0 for r in runs)  # kept
    assert hung.trajectory.end_reason == EndReason.EPISODE_TIMEOUT
    assert len(hung.trajectory.turns) == 1
    assert stats["episodes"] == 5 and stats["rewrites"] == 0


def test_tool_choice_none_parses_no_calls(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]

    async def body(server):
        key = server.open_episode(task)
        client = openai_client(server, key, timeout_s=30)
        reset = await Calc().reset(task)
        resp = await _call(client, reset.messages, tools=reset.tools, tool_choice="none")
        await client.close()
        return resp, await server.close_episode(key)

    resp, record = serve(_oracle(chat), chat, body)
    (choice,) = resp.choices
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "calculator" in choice.message.content  # the call's markup, as text
    (seg,) = record.segments
    assert seg.turns[0].tool_calls == [] and seg.tools == reset_tools(task)


def reset_tools(task):
    return asyncio.run(Calc().reset(task)).tools


def test_one_request_at_a_time_per_episode(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]
    engine = Recorder(ScriptedEngine(chat, policy_factory=oracle_policy, latency_s=0.5))

    async def body(server):
        key = server.open_episode(task)
        client = openai_client(server, key, timeout_s=30)
        reset = await Calc().reset(task)
        both = await asyncio.gather(
            _call(client, reset.messages, tools=reset.tools),
            _call(client, reset.messages, tools=reset.tools),
            return_exceptions=True,
        )
        await client.close()
        return both, await server.close_episode(key)

    both, record = serve(engine, chat, body)
    errors = [r for r in both if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], openai.ConflictError)
    assert "in flight" in str(errors[0])
    assert len(record.segments) == 1 and engine.opened == engine.closed == 1


def test_continuing_a_cut_off_turn_starts_an_uncounted_segment(chat):
    task = Calc.make_tasks("train", 1, seed=0)[0]

    async def body(server):
        key = server.open_episode(task)
        client = openai_client(server, key, timeout_s=30)
        reset = await Calc().reset(task)
        msgs = list(reset.messages)
        cut = await _call(client, msgs, tools=reset.tools, max_tokens=3)
        assert cut.choices[0].finish_reason == "length"
        more = [*msgs, cut.choices[0].message, {"role": "user", "content": "Go on."}]
        await _call(client, more, tools=reset.tools)
        await client.close()
        return await server.close_episode(key)

    record = serve(_oracle(chat), chat, body)
    assert record.rewrites == 0
    assert [s.reason for s in record.segments] == ["first", "cut_off"]
    first, second = record.segments
    assert first.turns[0].finish_reason == "length" and sum(first.loss_mask) == 3
    assert second.prompt_len == len(chat.prompt_ids(second.messages[:4], second.tools))


class _Says:
    """An engine whose every turn is ``ids`` ending the turn (``finish_reason`` stop)."""

    def __init__(self, ids):
        self.ids = ids

    async def open_session(self):
        return self

    async def generate(self, new_ids, params):
        return GenerationResult(list(self.ids), [-0.5] * len(self.ids), "stop")

    async def close(self):
        pass


def test_stop_strings_end_the_text_and_the_segment(chat):
    said = chat.encode("The answer is 7") + chat.encode_plain(" END")

    async def body(server):
        key = server.open_episode()
        client = openai_client(server, key, timeout_s=30)
        msgs = [{"role": "user", "content": "hi"}]
        resp = await _call(client, msgs, stop=[" END"], logprobs=True)
        choice = resp.choices[0]
        more = [*msgs, choice.message, {"role": "user", "content": "and?"}]
        await _call(client, more, stop=" END")
        with pytest.raises(openai.BadRequestError, match="limits.max_stop=4"):
            await _call(client, more, stop=["a", "b", "c", "d", "e"])
        await client.close()
        return choice, await server.close_episode(key)

    choice, record = serve(_Says(said), chat, body)
    assert choice.message.content == "The answer is 7" and choice.finish_reason == "stop"
    assert [t.logprob for t in choice.logprobs.content] == [-0.5] * len(said)
    # no stop token after the stop string: the template cannot continue that turn
    assert [s.reason for s in record.segments] == ["first", "cut_off"] and record.rewrites == 0
    assert record.segments[0].token_ids[-len(said) :] == said
