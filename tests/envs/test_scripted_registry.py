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
