"""GiGPO anchor states (``Ann.STATE_KEY``): built from the observations by default, from the
env-internal ``state_digest`` only with ``EnvConfig.privileged_anchors``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from jaxrl_agents.envs import ENVIRONMENTS, CalculatorEnv, Env, SqlEnv, scripted_policy
from jaxrl_agents.envs.base import calls_from_message, drive
from jaxrl_agents.facts import call_key
from jaxrl_agents.types import Ann, Message, Task

Policy = Callable[[list[Message]], Message]


def _calls(*calls: tuple[str, dict[str, Any]]) -> Message:
    tool_calls = [
        {"id": f"c{i}", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)
    ]
    return {"role": "assistant", "content": "", "tool_calls": tool_calls}


def replay(*turns: Message, answer: str = "42") -> Policy:
    """A policy sending ``turns`` in order, then the final ``answer``."""
    script = [*turns, {"role": "assistant", "content": answer}]
    return lambda messages: script[sum(m["role"] == "assistant" for m in messages)]


def scripted(*turns: list[str]) -> Policy:
    """A policy making the given calculator calls, one list per turn, then answering."""
    return replay(*(_calls(*(("calculator", {"expression": e}) for e in t)) for t in turns))


def keys(env: Env, task: Task, policy: Policy) -> list[str]:
    """Per-turn ``STATE_KEY`` of one episode."""
    _, _, anns = asyncio.run(drive(env, task, policy))
    return [a[Ann.STATE_KEY] for a in anns]


CALC_TASK = CalculatorEnv.make_tasks("train", 1, two_step_frac=1.0)[0]


def test_identical_observations_share_keys_and_different_ones_do_not():
    a = keys(CalculatorEnv(), CALC_TASK, scripted(["2+3"], ["5*7"]))
    b = keys(CalculatorEnv(), CALC_TASK, scripted(["2 + 3"], ["5 * 7"]))  # same call keys
    c = keys(CalculatorEnv(), CALC_TASK, scripted(["2+3"], ["5*8"]))
    assert a == b and len(set(a)) == 3
    assert c[:2] == a[:2] and c[2] != a[2]  # the same until the observations part
    other = CalculatorEnv.make_tasks("train", 2, two_step_frac=1.0)[1]
    assert keys(CalculatorEnv(), other, scripted(["2+3"], ["5*7"]))[0] != a[0]


def test_the_observed_state_is_a_set_of_call_results():
    """Another order of the same lookups, or a repeated one, reaches the same anchor: a loop
    returns to its state (GiGPO's anchors are states, not paths)."""
    ab = keys(CalculatorEnv(), CALC_TASK, scripted(["2+3", "5*7"]))
    ba = keys(CalculatorEnv(), CALC_TASK, scripted(["5*7"], ["2+3"]))
    assert ab[1] == ba[2]
    loop = keys(CalculatorEnv(), CALC_TASK, scripted(["2+3"], ["2+3"], ["2 + 3"]))
    assert loop[0] != loop[1] == loop[2] == loop[3]


def test_a_failed_call_is_an_observation():
    """An error the model read changes the observed state; the privileged digest ignores it."""
    policy = scripted(["1/0"])
    default = keys(CalculatorEnv(), CALC_TASK, policy)
    privileged = keys(CalculatorEnv(privileged_anchors=True), CALC_TASK, policy)
    assert default[0] != default[1] and privileged[0] == privileged[1]


def observed_from_messages(messages: list[Message]) -> list[Any]:
    """What ``Env.observed_state`` must be, recomputed from the transcript alone."""
    pairs, calls = set(), {}
    for m in messages:
        if m["role"] == "assistant":
            calls = {c.id: c for c in calls_from_message(m)}
        elif m["role"] == "tool":
            pairs.add((call_key(calls[m["tool_call_id"]]), m["content"]))
    prompt = [m["content"] for m in messages if m["role"] in ("system", "user")]
    return [prompt, sorted(pairs)]


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_default_anchor_is_a_function_of_the_transcript(name):
    """Every built-in env, driven by its scripted solver: before each turn the observed state is
    what the transcript shows, and the key ignores env-internal state (``state_digest``)."""
    cls = ENVIRONMENTS[name]
    task = cls.make_tasks("train", 1, seed=3)[0]
    policy = scripted_policy(cls, "oracle")(task)

    async def go() -> list[str]:
        env, privileged = cls(), cls(privileged_anchors=True)
        messages = list((await env.reset(task)).messages)
        await privileged.reset(task)
        keys = []
        for _ in range(10):
            assert env.observed_state() == observed_from_messages(messages)
            message = policy(list(messages))
            messages.append(message)
            step = await env.step(message, calls_from_message(message))
            await privileged.step(message, calls_from_message(message))
            keys.append(step.annotations[Ann.STATE_KEY])
            if step.done:
                break
            messages.extend(step.messages)
        assert (await env.verify()).success
        before = privileged.state_key()
        for e in (env, privileged):  # env-internal state enters the privileged key only
            e.state_digest = lambda: ["changed"]
        assert env.state_key() == keys[-1] and privileged.state_key() != before
        await env.close()
        await privileged.close()
        return keys

    assert len(set(asyncio.run(go()))) > 1


def test_sql_privileged_bit_under_identical_observations():
    """Two episodes whose calls and results read alike (the calls differ only in the case of a
    string, which ``call_key`` ignores; the results are cut at ``tool_output_max_chars`` before
    the number) while only one query found the answer: ``query_answer``, set from rows the model
    never saw, splits the privileged anchors; the default ones stay together."""
    task = next(t for t in SqlEnv.make_tasks("train", 16) if "category_revenue" in t.data["key"])
    category = re.search(r"p\.category = '(\w+)'", task.data["sql"]).group(1)
    answer = str(task.data["answer"])
    decoy = re.sub(r"\d", "1", answer)  # a wrong total printed as wide as the right one
    assert decoy != answer

    def query(cat: str) -> str:
        inner = task.data["sql"].replace(f"'{category}'", f"'{cat}'")
        return f"SELECT IFNULL(({inner}), {decoy}) AS revenue_of_the_category"

    found, missed = query(category), query(category.upper())  # no row matches the upper case
    runs = {}
    for privileged in (False, True):
        for q in (found, missed):
            env = SqlEnv(tool_output_max_chars=16, privileged_anchors=privileged)
            policy = replay(_calls(("run_sql", {"query": q})), answer="I could not read it.")
            verdict, messages, anns = asyncio.run(drive(env, task, policy))
            assert answer not in messages[3]["content"] and not verdict.success
            runs[privileged, q] = (messages[3]["content"], anns[1][Ann.STATE_KEY])
    assert runs[False, found][0] == runs[False, missed][0]  # the model read the same
    assert runs[False, found][1] == runs[False, missed][1]
    assert runs[True, found][1] != runs[True, missed][1]  # query_answer differs


def test_sql_default_key_ignores_completed_steps():
    """Changing the env-internal steps and inspected tables moves only the privileged key."""
    task = SqlEnv.make_tasks("train", 1)[0]

    async def go(privileged: bool) -> tuple[str, str]:
        env = SqlEnv(privileged_anchors=privileged)
        await env.reset(task)
        call = _calls(("list_tables", {}))
        await env.step(call, calls_from_message(call))
        before = env.state_key()
        env._completed.add("query_answer")
        env._inspected.add("orders")
        after = env.state_key()
        await env.close()
        return before, after

    before, after = asyncio.run(go(False))
    assert before == after
    before, after = asyncio.run(go(True))
    assert before != after
