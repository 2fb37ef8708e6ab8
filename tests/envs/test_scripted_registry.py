"""Scripted policies are registered per env class (``register_scripted``) and found by the
scripted engine's lookups (``oracle_for``, ``scripted_factory``)."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from jaxrl_agents.envs import (
    ENVIRONMENTS,
    CalculatorEnv,
    Env,
    SqlEnv,
    calculator,
    register_scripted,
    research,
    scripted_policies,
    scripted_policy,
    sql,
    travel,
)
from jaxrl_agents.envs.base import drive
from jaxrl_agents.rollout.scripted import SCRIPTED_POLICIES, oracle_for, scripted_factory


def _answer(text: str):
    return lambda task: lambda messages: {"role": "assistant", "content": text}


@pytest.mark.parametrize(
    ("cls", "module"),
    [
        (CalculatorEnv, calculator),
        (SqlEnv, sql),
        (ENVIRONMENTS["research"], research),
        (ENVIRONMENTS["travel"], travel),
    ],
)
def test_builtin_envs_register_their_oracle_and_wrong_policy(cls, module):
    policies = scripted_policies(cls)
    assert policies["oracle"] is module.oracle_policy is oracle_for(cls)
    assert policies["wrong"] is module.wrong_policy is scripted_factory("wrong", cls)
    # the class keeps its public path (EnvBinding.label, reports)
    assert cls.__module__ == module.__name__


def test_user_env_registers_as_call_and_decorator_and_subclasses_inherit():
    class MyEnv(Env):
        name = "my_registry_env"

    oracle = register_scripted(MyEnv, "oracle", _answer("42"))

    @register_scripted(MyEnv, "shy")
    def shy(task):
        return lambda messages: {"role": "assistant", "content": "no idea"}

    class Child(MyEnv):
        pass

    assert oracle_for(MyEnv) is oracle and oracle_for(Child) is oracle
    assert scripted_factory("shy", Child) is shy
    own = register_scripted(Child, "oracle", _answer("7"))
    assert oracle_for(Child) is own and oracle_for(MyEnv) is oracle


def test_subclass_of_a_builtin_env_inherits_its_oracle():
    class MyCalc(CalculatorEnv):
        pass

    task = MyCalc.make_tasks("train", 1)[0]
    verdict, _, _ = asyncio.run(drive(MyCalc(), task, oracle_for(MyCalc)(task)))
    assert verdict.success


def test_missing_oracle_names_the_env_and_what_is_registered():
    class Bare(Env):
        name = "bare_registry_env"

    none = r"Bare has no scripted policy 'oracle' \(registered: none\)"
    with pytest.raises(ValueError, match=none):
        oracle_for(Bare)
    register_scripted(Bare, "wrong", _answer("0"))
    with pytest.raises(ValueError, match=r"'oracle' \(registered: wrong\)"):
        scripted_factory("loop", Bare)
    bogus = r"SqlEnv has no scripted policy 'bogus' \(registered: oracle, wrong\)"
    with pytest.raises(ValueError, match=bogus):
        scripted_factory("bogus", SqlEnv)
    assert "loop" in SCRIPTED_POLICIES


def test_register_scripted_checks_its_arguments():
    with pytest.raises(TypeError, match="Env subclass"):
        register_scripted(object, "oracle", _answer("1"))
    with pytest.raises(ValueError, match="without dots"):
        register_scripted(SqlEnv, "pkg.factory", _answer("1"))


def test_unregistered_env_finds_the_oracle_policy_convention(monkeypatch):
    """Without a registration, an ``oracle_policy`` / ``wrong_policy`` attribute of the class or a
    function of its module (the nearest class in the MRO first)."""
    module = types.ModuleType("my_registry_example")
    module.oracle_policy = _answer("module")
    monkeypatch.setitem(sys.modules, module.__name__, module)

    class ByModule(Env):
        name = "by_module_registry_env"

    ByModule.__module__ = module.__name__

    class ByAttribute(ByModule):
        wrong_policy = staticmethod(_answer("attribute"))

    assert scripted_policy(ByModule, "oracle") is module.oracle_policy
    assert "wrong" not in scripted_policies(ByModule)
    assert scripted_policies(ByAttribute) == {
        "oracle": module.oracle_policy,
        "wrong": ByAttribute.wrong_policy,
    }
    registered = register_scripted(ByAttribute, "oracle", _answer("registered"))
    assert oracle_for(ByAttribute) is registered and oracle_for(ByModule) is module.oracle_policy


def _flaky(env, fails: int):
    """``env``'s tools time out on the first ``fails`` calls of each tool name."""
    from jaxrl_agents.types import ToolErrorKind, ToolResult

    real, seen = env.tools.execute, {}

    async def execute(call, **kw):
        seen[call.name] = seen.get(call.name, 0) + 1
        if seen[call.name] <= fails:
            msg = f"Error: {call.name} timed out after 10 s"
            return ToolResult(call, msg, ToolErrorKind.TIMEOUT, 10.0)
        return await real(call, **kw)

    env.tools.execute = execute
    return env


@pytest.mark.parametrize("name", ["sql", "research", "travel"])
def test_oracles_retry_a_timed_out_call_and_still_solve(name):
    # A tool can pass its timeout on a loaded machine; the annotator issues the call again.
    env_cls = ENVIRONMENTS[name]
    for task in env_cls.make_tasks("heldout", 4):
        env = _flaky(env_cls(), fails=1)
        policy = scripted_policy(env_cls, "oracle")(task)
        verdict, messages, _ = asyncio.run(drive(env, task, policy, max_turns=20))
        assert verdict.success, (name, messages)
        errors = [m for m in messages if m["role"] == "tool" and m["content"].startswith("Error")]
        retries = [c for m in messages for c in m.get("tool_calls") or ()
                   if c["id"].startswith("retry_")]  # fmt: skip
        assert errors and len(retries) == len(errors), (name, messages)


def test_retry_timed_out_calls_shows_the_policy_every_call_as_succeeded_once():
    from jaxrl_agents.envs.registry import retry_timed_out_calls

    seen = []

    def inner(messages):
        seen.append(messages)
        return {"role": "assistant", "content": "done"}

    def call(i, name):
        return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": {}}}

    def tool(i, content):
        return {"role": "tool", "name": "f", "tool_call_id": f"x{i}", "content": content}

    policy = retry_timed_out_calls(inner, max_retries=2)
    first = {"role": "assistant", "content": "", "tool_calls": [call(0, "a"), call(1, "b")]}
    late = "Error: b timed out after 10 s"
    history = [{"role": "user", "content": "q"}, first, tool(0, "A"), tool(1, late)]
    retry = policy(history)
    assert [c["function"]["name"] for c in retry["tool_calls"]] == ["b"]  # only the failed one
    assert retry["tool_calls"][0]["id"] == "retry_call_1" and not seen
    history += [retry, tool(2, late)]
    assert policy(history)["tool_calls"][0]["function"]["name"] == "b"  # the second retry
    assert policy([*history, policy(history), tool(3, "B")]) == {
        "role": "assistant",
        "content": "done",
    }
    view = seen[-1]  # the retries left out, the last result in the failed call's place
    assert [m["role"] for m in view] == ["user", "assistant", "tool", "tool"]
    assert [m["content"] for m in view[2:]] == ["A", "B"]
    assert view[3]["tool_call_id"] == "x1"
    # after max_retries the policy sees the error
    seen.clear()
    out = [*history, policy(history), tool(3, late)]
    assert policy(out)["content"] == "done"
    assert seen[-1][3]["content"] == late
    # any other error is the policy's to read, at once
    seen.clear()
    unknown = "Error: unknown tool 'b'. Available: a"
    assert policy([*history[:3], tool(1, unknown)])["content"] == "done"
    assert seen[-1][-1]["content"] == unknown
    with pytest.raises(ValueError, match="max_retries=-1"):
        retry_timed_out_calls(inner, max_retries=-1)
