"""Real model families' chat templates (Qwen2.5-Instruct, Qwen3, Llama 3.1 Instruct) attached to a
test tokenizer with their special tokens: every env's scripted oracle solves its tasks through the
full rollout path (multi-turn, tool calls parsed, results rendered), the loss mask covers exactly
the sampled tokens, and the trajectory ids are exactly what the sampler was fed plus what it
sampled (zero drift, also for Qwen3, whose template rewrites earlier turns)."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from jaxrl_agents.chat import ChatFormat, detect_tool_parser, parse_tool_calls, split_reasoning
from jaxrl_agents.jobs.build import build_chat, check_oracle_limits, resolve_env
from jaxrl_agents.jobs.config import ChatSpec, ConfigError, EnvSpec
from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine
from jaxrl_agents.types import EndReason

FAMILIES = ["qwen2.5", "qwen3", "llama3.1"]
ENVS = ["calculator", "sql", "research", "travel"]
HERE = pathlib.Path(__file__).resolve().parents[1] / "data" / "chat_templates"
SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "chat_templates"
FREE = RolloutConfig(group_size=1, max_turns=24, max_new_tokens=1 << 14, max_total_tokens=1 << 18)


class Recording:
    """Wraps an engine; records, per episode, every (ids fed, ids sampled) pair of its session."""

    def __init__(self, inner):
        self.inner, self.sessions = inner, {}

    async def open_session(self):
        inner, log = await self.inner.open_session(), []
        sessions = self.sessions

        class Session:
            def bind(self, messages, task):
                sessions[task.id] = log
                inner.bind(messages, task)

            async def generate(self, new_ids, params):
                res = await inner.generate(new_ids, params)
                log.append((list(new_ids), list(res.token_ids)))
                return res

            async def close(self):
                await inner.close()

        return Session()


def rollouts(chat, env_name: str, n: int = 6, policy_factory=None):
    env = resolve_env(EnvSpec(name=env_name))
    engine = Recording(ScriptedEngine(chat, policy_factory=policy_factory or env.oracle({})))
    orch = Collector(chat=chat, env_factory=env.factory, rollout=FREE).orchestrator(
        engine, greedy=True, group_size=1
    )
    return asyncio.run(orch.run(env.tasks("heldout", n, seed=0), group_size=1)), engine


@pytest.fixture(scope="module", params=FAMILIES)
def family_chat(request, family_tokenizer):
    return request.param, build_chat(ChatSpec(tokenizer=str(family_tokenizer(request.param))))


def test_vendored_templates_equal_the_shared_copies():
    if not SHARED.is_dir():
        pytest.skip("no shared chat_templates folder beside this checkout")
    for path in sorted(SHARED.glob("*.jinja")):
        assert (HERE / path.name).read_bytes() == path.read_bytes(), path.name


def test_auto_detects_each_familys_tool_call_format(family_chat):
    family, chat = family_chat
    assert chat.tool_parser == ("llama3_json" if family == "llama3.1" else "hermes")
    assert chat.rewrites_history == (family == "qwen3")
    assert chat.reasoning == (family == "qwen3")


@pytest.mark.parametrize("env_name", ENVS)
def test_oracle_solves_every_env_through_the_rollout_path_with_zero_drift(family_chat, env_name):
    family, chat = family_chat
    trajs, engine = rollouts(chat, env_name)
    assert [t.end_reason for t in trajs] == [EndReason.ANSWERED] * len(trajs), [
        (t.end_reason.value, (t.error or "")[:200]) for t in trajs
    ]
    assert all(t.success for t in trajs), [t.verdict for t in trajs]
    assert max(len(t.turns) for t in trajs) >= 2  # multi-turn
    calls = [c for t in trajs for turn in t.turns for c in turn.tool_calls]
    assert calls and all(c.error is None for c in calls), [c.error for c in calls][:3]
    for t in trajs:
        log = engine.sessions[t.task.id]
        fed = [i for new, sampled in log for i in new + sampled]
        mask = [m for new, sampled in log for m in [0] * len(new) + [1] * len(sampled)]
        assert t.token_ids == fed  # the training ids are exactly what the sampler saw
        assert t.loss_mask == mask  # ... and the loss covers exactly the sampled tokens
        assert [t.token_ids[turn.start : turn.end] for turn in t.turns] == [s for _, s in log]
        text = chat.tokenizer.decode(t.token_ids)
        assert chat.encode(text) == t.token_ids  # no tokenization drift at any boundary
        # every tool result was rendered into the context the policy saw next
        # (Llama 3.1's template writes a tool result as a JSON string: either form counts)
        for turn in t.turns:
            for result in turn.tool_results:
                forms = (result.content, json.dumps(result.content, ensure_ascii=False))
                assert any(f in text for f in forms), result.content[:80]
        # SFT golden data of the same messages is the same token stream, every turn of it
        enc = chat.encode_conversation(t.messages, t.tools)
        assert enc.ids == t.token_ids and enc.loss_mask == t.loss_mask
        if not chat.rewrites_history:  # re-rendering equals the record (prefix templates)
            full = chat.encode(chat.render(t.messages, t.tools))
            assert full[: len(t.token_ids)] == t.token_ids


def test_qwen3_reasoning_is_kept_as_reasoning_and_not_sent_to_tools(family_tokenizer):
    chat = build_chat(ChatSpec(tokenizer=str(family_tokenizer("qwen3"))))
    env = resolve_env(EnvSpec(name="calculator"))
    oracle = env.oracle({})

    def thinking_oracle(task):
        policy = oracle(task)

        def act(messages):
            msg = dict(policy(messages))
            # a call written inside the reasoning must not run
            msg["reasoning_content"] = 'Plan: <tool_call>\n{"name": "nope", "arguments": {}}\n' \
                                       "</tool_call> then answer."  # fmt: skip
            return msg

        return act

    trajs, _ = rollouts(chat, "calculator", n=4, policy_factory=thinking_oracle)
    assert all(t.success for t in trajs), [(t.end_reason, t.error) for t in trajs]
    for t in trajs:
        for turn, msg in zip(t.turns, [m for m in t.messages if m["role"] == "assistant"],
                             strict=True):  # fmt: skip
            assert turn.text.startswith("<think>\nPlan: <tool_call>")
            assert msg["reasoning_content"].startswith("Plan: <tool_call>")
            assert "<think>" not in msg["content"] and "Plan" not in msg["content"]
            assert all(c.name != "nope" for c in turn.tool_calls)
    # the record keeps each turn's reasoning; re-rendering after a new user message would drop it
    first = trajs[0]
    assert chat.tokenizer.decode(first.token_ids).count("<think>\nPlan:") == len(first.turns)
    later = [*first.messages, {"role": "user", "content": "And times two?"}]
    assert chat.render(later, first.tools).count("<think>\nPlan:") == 0


def test_qwen3_thinking_switch(family_tokenizer):
    folder = str(family_tokenizer("qwen3"))
    off = build_chat(ChatSpec(tokenizer=folder, thinking=False))
    prompt = off.tokenizer.decode(off.prompt_ids([{"role": "user", "content": "Hi"}]))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    trajs, _ = rollouts(off, "calculator", n=4)
    assert all(t.success for t in trajs)
    assert all(not turn.text.startswith("<think>") for t in trajs for turn in t.turns)
    with pytest.raises(ConfigError, match="chat.thinking.*no enable_thinking switch"):
        build_chat(ChatSpec(tokenizer=str(family_tokenizer("qwen2.5")), thinking=False))


def test_split_reasoning():
    assert split_reasoning("<think>\nhm\n</think>\n\nAnswer") == ("hm", "Answer")
    assert split_reasoning("no think") == (None, "no think")
    assert split_reasoning("<think>\ncut off mid tho") == ("cut off mid tho", "")
    assert split_reasoning("hm</think>ok") == ("hm", "ok")  # prompt opened the block


def test_llama_stops_on_eom_and_eot_and_renders_ipython(family_tokenizer):
    chat = build_chat(ChatSpec(tokenizer=str(family_tokenizer("llama3.1"))))
    tok = chat.tokenizer
    eom, eot, end = (tok.convert_tokens_to_ids(t)
                     for t in ("<|eom_id|>", "<|eot_id|>", "<|end_of_text|>"))  # fmt: skip
    assert chat.stop_token == "<|eot_id|>" and chat.stop_token_ids[0] == eot
    assert {eom, eot, end} <= set(chat.stop_token_ids)
    cont = tok.decode(chat.continuation_ids([{"role": "tool", "content": "5"}]))
    assert cont.startswith("<|start_header_id|>ipython<|end_header_id|>\n\n")
    # an <|eom_id|>-ended tool-call turn goes through the orchestrator like an <|eot_id|> one
    from jaxrl_agents.rollout.orchestrator import decode_sampled

    sampled = chat.encode('<|python_tag|>{"name": "calculator", "parameters": {"expression": '
                          '"2+3"}}') + [eom]  # fmt: skip
    _, calls = chat.parse_assistant(decode_sampled(chat, sampled))
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "2+3"}, None)
    ]


def test_llama3_json_parser():
    def parse(text):
        content, calls = parse_tool_calls(text, format="llama3_json")
        return content, [(c.name, c.arguments, c.error is None) for c in calls]

    assert parse("The answer is 5.") == ("The answer is 5.", [])
    assert parse('{"name": "f", "parameters": {"x": 1}}') == ("", [("f", {"x": 1}, True)])
    assert parse('<|python_tag|>{"name": "f", "arguments": {"x": 1}}') == (
        "",
        [("f", {"x": 1}, True)],
    )
    assert parse('{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"y": 2}}')[1] == [
        ("f", {}, True), ("g", {"y": 2}, True)
    ]  # fmt: skip
    content, calls = parse_tool_calls('{"name": "f", "parameters": {"x": ', format="llama3_json")
    assert len(calls) == 1 and calls[0].name == "f" and "invalid JSON" in calls[0].error
    assert parse('{"answer": 5}') == ('{"answer": 5}', [])  # a JSON answer is not a call
    content, calls = parse_tool_calls('{"name": "f", "parameters": "oops"}', format="llama3_json")
    assert calls[0].error is not None


def test_auto_detection_is_one_format_or_a_clear_error():
    hermes = (HERE / "qwen2.5-instruct.jinja").read_text()
    llama = (HERE / "llama3.1-instruct.jinja").read_text()
    assert detect_tool_parser(hermes) == "hermes"
    assert detect_tool_parser(llama) == "llama3_json"
    with pytest.raises(ValueError, match=r"matches several \(hermes, llama3_json\)"):
        detect_tool_parser(hermes + llama)
    with pytest.raises(ValueError, match="matches none"):
        detect_tool_parser("{{ messages }}")


def test_template_parser_mismatch_is_found_before_any_episode(family_tokenizer):
    chat = build_chat(ChatSpec(tokenizer=str(family_tokenizer("llama3.1")), tool_parser="hermes"))
    env = resolve_env(EnvSpec(name="calculator"))
    with pytest.raises(ConfigError) as e:
        asyncio.run(check_oracle_limits(chat, env, {}, FREE, n=2))
    msg = str(e.value)
    assert "\n" not in msg
    assert "chat.template=(the tokenizer's own" in msg and "chat.tool_parser=hermes" in msg
    assert "set chat.tool_parser=llama3_json" in msg


def test_shipped_template_names_and_files(family_tokenizer, tmp_path):
    tiny = build_chat(ChatSpec(template="qwen2.5"))
    assert "You are Qwen" in tiny.render([{"role": "user", "content": "x"}])
    folder = family_tokenizer("qwen3")
    by_file = build_chat(ChatSpec(template=str(HERE / "qwen3.jinja"), tokenizer=str(folder)))
    assert by_file.chat_template == (HERE / "qwen3.jinja").read_text()
    with pytest.raises(ConfigError, match="chat.template=nope: .*neither a shipped template"):
        build_chat(ChatSpec(template="nope"))
    with pytest.raises(ConfigError, match="chat.tool_parser=xml: not a registered"):
        build_chat(ChatSpec(tool_parser="xml"))
    assert isinstance(tiny, ChatFormat)
