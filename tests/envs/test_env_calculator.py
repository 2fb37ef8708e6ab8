"""Calculator env: oracle solves, wrong/premature policies fail, splits disjoint, safe evaluator."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from jaxrl_agents.envs.base import calls_from_message, drive
from jaxrl_agents.envs.calculator import (
    CalculatorEnv,
    evaluate,
    oracle_policy,
    premature_guess,
    wrong_policy,
)
from jaxrl_agents.envs.tools import ToolError
from jaxrl_agents.types import Ann, ToolErrorKind


def _run(task, policy):
    return asyncio.run(drive(CalculatorEnv(), task, policy))


@pytest.mark.parametrize("two_step_frac, combined", [(0.0, False), (1.0, False), (1.0, True)])
def test_oracle_solves_every_task(two_step_frac, combined):
    tasks = CalculatorEnv.make_tasks("train", 40, seed=1, two_step_frac=two_step_frac)
    for task in tasks:
        verdict, messages, anns = _run(task, oracle_policy(task, combined=combined))
        assert verdict.success, (task.data, messages)
        assert verdict.info[Ann.MISSING_STEPS] == []
        assert verdict.info[Ann.EVIDENCE_IN_ANSWER] is True
        assert anns[-1][Ann.ANSWERED] and anns[-1][Ann.EVIDENCE_COMPLETE]
        # Plain-Python reference for the expected value.
        assert task.data["answer"] == eval(task.data["expression"])  # noqa: S307 - digits only
        n_calls = 1 if combined else len(task.data["steps"])
        assert len(anns) == n_calls + 1


def test_wrong_and_premature_policies_fail_and_are_annotated():
    tasks = CalculatorEnv.make_tasks("heldout", 40, two_step_frac=0.5)
    for task in tasks:
        verdict, messages, anns = _run(task, wrong_policy(task))
        assert not verdict.success
        assert len(messages) == 3  # system, user, immediate answer
        assert anns[0][Ann.ANSWERED] and anns[0][Ann.EVIDENCE_COMPLETE] is False
        assert verdict.info[Ann.MISSING_STEPS] == task.data["required_steps"]
        assert verdict.info[Ann.EVIDENCE_IN_ANSWER] is False


def test_premature_prob_with_numpy_rng():
    task = CalculatorEnv.make_tasks("train", 1)[0]
    rng = np.random.default_rng(0)
    first = [oracle_policy(task, premature_prob=0.3, rng=rng)([]) for _ in range(2000)]
    frac = sum("tool_calls" not in m for m in first) / len(first)
    assert 0.26 < frac < 0.34, frac
    for u in np.linspace(0, 0.999, 7):
        assert premature_guess(task, float(u)) != task.data["answer"]


def test_answer_parsing_accepts_sentence_and_commas():
    task = CalculatorEnv.make_tasks("train", 1)[0]
    ans = task.data["answer"]
    for text, ok in [
        (f"The answer is {ans}.", True),
        (f"{ans:,}", True),
        (f"{ans + 1}", False),
        ("no idea", False),
    ]:
        verdict, _, _ = _run(task, lambda m, t=text: {"role": "assistant", "content": t})
        assert verdict.success is ok, text


def test_splits_disjoint_and_deterministic():
    train = CalculatorEnv.make_tasks("train", 3000, two_step_frac=0.5)
    held = CalculatorEnv.make_tasks("heldout", 800, two_step_frac=0.5)
    keys_train = {t.data["expression"] for t in train}
    keys_held = {t.data["expression"] for t in held}
    assert keys_train.isdisjoint(keys_held)
    assert len(keys_train) == 3000 and len(keys_held) == 800
    again = CalculatorEnv.make_tasks("train", 50, two_step_frac=0.5)
    assert [t.data for t in again] == [t.data for t in train[:50]]
    assert [t.data for t in CalculatorEnv.make_tasks("train", 50, seed=1, two_step_frac=0.5)] != [
        t.data for t in again
    ]
    with pytest.raises(ValueError, match="split must be one of .*; got 'test'"):
        CalculatorEnv.make_tasks("test", 1)


def test_prompt_is_short():
    env = CalculatorEnv()
    task = CalculatorEnv.make_tasks("train", 1)[0]
    reset = asyncio.run(env.reset(task))
    text = reset.messages[0]["content"] + str(reset.tools)
    assert len(text) < 400, len(text)


def test_evaluate_matches_python_on_random_expressions():
    rng = random.Random(0)
    for _ in range(300):
        a, b, c = (rng.randint(1, 99) for _ in range(3))
        o1, o2 = rng.choice("+-*"), rng.choice("+-*/")
        expr = f"({a} {o1} {b}) {o2} {c}" if rng.random() < 0.5 else f"{a} {o1} {b} {o2} {c}"
        value, steps = evaluate(expr)
        assert value == pytest.approx(eval(expr))  # noqa: S307 - digits and operators only
        assert len(steps) == 2
    assert evaluate("37 x 12 - 5")[0] == 439
    assert evaluate("2^10")[0] == 1024
    assert evaluate("7/2")[0] == 3.5 and evaluate("6/3")[0] == 2


@pytest.mark.parametrize(
    "expr, match",
    [
        ("__import__('os').system('true')", "unsupported"),
        ("x + 1", "unsupported"),
        ("(1).real", "unsupported"),
        ("9**9**9", "power too large"),
        ("10**40", "power too large"),
        ("1/0", "division by zero"),
        ("1 +", "invalid expression"),
        ("1" * 300, "too long"),
    ],
)
def test_evaluate_rejects_unsafe_or_unbounded(expr, match):
    with pytest.raises(ToolError, match=match):
        evaluate(expr)


def test_tool_error_reaches_model_and_progress_tracks_steps():
    task = CalculatorEnv.make_tasks("train", 1, two_step_frac=1.0)[0]
    first_step = task.data["steps"][0]["expression"]
    env = CalculatorEnv()

    def call(expr):
        fn = {"name": "calculator", "arguments": {"expression": expr}}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": fn}]}

    async def go():
        await env.reset(task)
        out = []
        for expr in ("1/0", first_step):
            msg = call(expr)
            out.append(await env.step(msg, calls_from_message(msg)))
        return out

    s1, s2 = asyncio.run(go())
    assert s1.messages[0]["content"] == "Error: division by zero"
    assert s1.tool_results[0].error_kind is ToolErrorKind.TOOL_ERROR
    assert (s1.annotations[Ann.PROGRESS], s2.annotations[Ann.PROGRESS]) == (0.0, 0.5)
    # STATE_KEY is the observed state *before* the turn: the error the model read is part of it.
    assert s1.annotations[Ann.STATE_KEY] != s2.annotations[Ann.STATE_KEY]


@pytest.mark.parametrize(
    "expr, match",
    [
        ("1e999", r"number out of range \(overflows to inf\)"),
        ("-1e999", r"number out of range \(overflows to inf\)"),
        ("1e999 - 1e999", "number out of range"),  # would be nan
        ("0 * 1e999", "number out of range"),
        ("5 % 1e999", "number out of range"),
        ("1e308 * 10", r"result out of range: infinite \(inf\)"),
        ("1e200 * 1e200", r"result out of range: infinite \(inf\)"),
        ("1e-300 ** -2", r"result out of range \(overflow\)"),  # float pow raises OverflowError
        ("10**400 * 1.0", "power too large"),
    ],
)
def test_non_finite_results_and_overflow_are_tool_errors(expr, match):
    with pytest.raises(ToolError, match=match):
        evaluate(expr)


def test_evaluate_never_returns_non_finite_values():
    rng = random.Random(1)
    atoms = ["1e308", "1e-308", "1e999", "1e15", "0", "0.0", "-1e300", "7", "1e-300", "2.5"]
    for _ in range(2000):
        expr = f"({rng.choice(atoms)} {rng.choice('+-*/%')} {rng.choice(atoms)})"
        expr += f" {rng.choice(['+', '-', '*', '/', '//', '%', '**'])} {rng.choice(atoms)}"
        try:
            value, values = evaluate(expr)
        except ToolError:
            continue
        assert all(np.isfinite(v) for v in [value, *values]), expr


def test_non_finite_result_reaches_model_as_error_and_is_not_recorded():
    task = CalculatorEnv.make_tasks("train", 1)[0]
    env = CalculatorEnv()

    async def go():
        await env.reset(task)
        fn = {"name": "calculator", "arguments": {"expression": "1e999 - 1e999"}}
        msg = {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": fn}]}
        return await env.step(msg, calls_from_message(msg))

    step = asyncio.run(go())
    content = step.messages[0]["content"]
    assert content.startswith("Error: number out of range") and "nan" not in content
    assert step.tool_results[0].error_kind is ToolErrorKind.TOOL_ERROR
    assert env._values == [] and env._results == []
    assert step.annotations[Ann.PROGRESS] == 0.0


# -- chaining and transient faults (env.options) --------------------------------------------------


def _drive(env, task, policy, seed=0):
    return asyncio.run(drive(env, task, policy, seed=seed))


def test_one_op_per_call_refuses_combined_calls_and_the_oracle_chains():
    tasks = CalculatorEnv.make_tasks("train", 30, seed=2, two_step_frac=1.0)
    for task in tasks:
        verdict, messages, _ = _drive(
            CalculatorEnv(one_op_per_call=True), task, oracle_policy(task, combined=True)
        )
        first = next(m for m in messages if m["role"] == "tool")
        assert first["content"].startswith("Error") and "one operation per call" in first["content"]
        assert not verdict.success  # the combined call gave nothing; the answer has no evidence
        verdict, messages, anns = _drive(
            CalculatorEnv(one_op_per_call=True), task, oracle_policy(task)
        )
        assert verdict.success and len(anns) == 3  # two calls, then the answer
        assert verdict.info[Ann.SLICES] == ["two-step"] and verdict.info["faults"] == 0
    one = CalculatorEnv.make_tasks("train", 5, seed=2)[0]
    verdict, _, _ = _drive(CalculatorEnv(one_op_per_call=True), one, oracle_policy(one))
    assert verdict.success and verdict.info[Ann.SLICES] == ["one-step"]


def test_faults_are_transient_capped_replayable_and_sliced():
    tasks = CalculatorEnv.make_tasks("train", 200, seed=3, two_step_frac=0.5)
    hit = []
    for task in tasks:
        env = CalculatorEnv(fault_rate=0.4, max_faults=1)
        verdict, messages, anns = _drive(env, task, oracle_policy(task), seed=7)
        errors = [m for m in messages if m["role"] == "tool" and m["content"].startswith("Error")]
        assert verdict.success, messages  # the oracle retries after a fault
        assert len(errors) == verdict.info["faults"] <= 1
        assert ("fault-hit" in verdict.info[Ann.SLICES]) == bool(errors)
        if errors:
            assert "temporarily unavailable" in errors[0]["content"]
            assert len(anns) == len(task.data["steps"]) + 2  # one retry
        hit.append(bool(errors))
        again = _drive(CalculatorEnv(fault_rate=0.4), task, oracle_policy(task), seed=7)[1]
        assert again == messages  # same task and seed: the same faults
    # P(fault-hit) = 1 - 0.6^calls, one or two calls: between 0.4 and 0.64
    assert 0.3 < np.mean(hit) < 0.7, np.mean(hit)
    seeds = [
        _drive(CalculatorEnv(fault_rate=0.4), tasks[0], oracle_policy(tasks[0]), seed=s)[0]
        for s in range(40)
    ]
    assert 0 < sum("fault-hit" in v.info[Ann.SLICES] for v in seeds) < 40  # the seed draws


def test_fault_count_is_capped_and_bad_options_name_the_value():
    task = CalculatorEnv.make_tasks("train", 1, seed=0)[0]
    env = CalculatorEnv(fault_rate=1.0, max_faults=3)  # every call fails until the cap
    verdict, messages, _ = _drive(env, task, oracle_policy(task))
    assert verdict.success and verdict.info["faults"] == 3
    with pytest.raises(ValueError, match="fault_rate must be in \\[0, 1\\], got 1.5"):
        CalculatorEnv(fault_rate=1.5)
    with pytest.raises(ValueError, match="max_faults must be >= 0, got -1"):
        CalculatorEnv(max_faults=-1)


def test_state_rules_puts_the_tools_contract_in_every_episodes_prompt():
    task = CalculatorEnv.make_tasks("train", 1, seed=0, two_step_frac=1.0)[0]
    plain = _drive(CalculatorEnv(one_op_per_call=True), task, oracle_policy(task))[1]
    assert "one operation per call" not in plain[0]["content"]
    # The same contract whether or not this env injects faults: SFT's fault-free episodes and
    # RL's faulty ones share the prompt.
    prompts = set()
    for rate in (0.0, 0.5):
        env = CalculatorEnv(one_op_per_call=True, fault_rate=rate, state_rules=True)
        verdict, messages, _ = _drive(env, task, oracle_policy(task))
        assert verdict.success and messages[0]["role"] == "system"
        prompts.add(messages[0]["content"])
    (prompt,) = prompts
    assert prompt.startswith(plain[0]["content"])
    assert "one operation per call" in prompt and "call it again" in prompt
