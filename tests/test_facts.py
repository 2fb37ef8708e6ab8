"""``jaxrl_agents.facts``: one definition of repeated call / premature answer / invalid call, and
the reward terms, the env's annotations and the evaluation taxonomy all agree with it."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_agents import facts
from jaxrl_agents.chat.tool_calls import parse_tool_calls
from jaxrl_agents.envs import REPEATED_CALLS, CalculatorEnv, tool
from jaxrl_agents.envs.base import calls_from_message
from jaxrl_agents.evaluation.summary import failure_modes
from jaxrl_agents.rewards.terms import loop, premature, tool_validity
from jaxrl_agents.types import (
    Ann,
    EndReason,
    Task,
    ToolCall,
    ToolErrorKind,
    ToolResult,
    Trajectory,
    Turn,
    Verdict,
)

PER_REPEAT = -0.1
PENALTY = -0.5
PER_INVALID = -0.2


def calc(expr: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expr})


def malformed() -> ToolCall:
    return ToolCall("", {}, raw="<tool_call>{oops", error="invalid JSON in tool call")


def turn(i: int, calls=(), errors=None, **ann) -> Turn:
    calls = list(calls)
    errors = list(errors) if errors is not None else [None] * len(calls)
    results = [ToolResult(c, "r", error_kind=e) for c, e in zip(calls, errors, strict=True)]
    return Turn(i, 10 * i, 10 * i + 5, tool_calls=calls, tool_results=results, annotations=ann)


def answer(i: int, *, evidence: bool | None = None) -> Turn:
    ann = {Ann.ANSWERED: True}
    if evidence is not None:
        ann[Ann.EVIDENCE_COMPLETE] = evidence
    return turn(i, **ann)


def trajectory(turns, *, end=EndReason.ANSWERED, success=False) -> Trajectory:
    return Trajectory(
        Task("t", "calculator", "heldout", {}),
        [],
        [],
        [],
        [],
        [],
        0,
        list(turns),
        end,
        verdict=Verdict(success=success),
    )


# name -> (trajectory, per-turn repeats, premature turn, invalid calls)
CASES = {
    "loop_whitespace": (
        [turn(0, [calc("37*12")]), turn(1, [calc(" 37 * 12 ")]), answer(2, evidence=True)],
        [0, 1, 0],
        None,
        0,
    ),
    "loop_number_spelling": (
        [turn(0, [ToolCall("scale", {"x": 12})]), turn(1, [ToolCall("scale", {"x": 12.0})])],
        [0, 1],
        None,
        0,
    ),
    "loop_case_of_name_and_args": (
        [
            turn(0, [ToolCall("search", {"q": "Capital of France"})]),
            turn(1, [ToolCall("Search", {"q": "capital of  FRANCE"})]),
            turn(2, [ToolCall("search", {"q": "capital of france"})]),
        ],
        [0, 1, 1],
        None,
        0,
    ),
    "loop_within_one_turn": (
        [turn(0, [calc("37*12"), calc("37 *12")]), answer(1, evidence=True)],
        [1, 0],
        None,
        0,
    ),
    "distinct_short_calls": (
        # a difflib ratio calls 37*12 / 37*13 near-duplicates; 12-37 reorders the operands
        [turn(0, [calc("37*12")]), turn(1, [calc("37*13")]), turn(2, [calc("12*37")])],
        [0, 0, 0],
        None,
        0,
    ),
    "distinct_nested_args": (
        [
            turn(0, [ToolCall("book", {"dates": [1, 2], "city": "Paris"})]),
            turn(1, [ToolCall("book", {"dates": [2, 1], "city": "Paris"})]),
            turn(2, [ToolCall("book", {"city": "paris", "dates": [1.0, 2]})]),
        ],
        [0, 0, 1],
        None,
        0,
    ),
    "premature_answer": ([answer(0, evidence=False)], [0], 0, 0),
    "answer_after_evidence": (
        # evidence is incomplete *before* turn 0's call; only the answer turn's value counts
        [turn(0, [calc("37*12")], **{Ann.EVIDENCE_COMPLETE: False}), answer(1, evidence=True)],
        [0, 0],
        None,
        0,
    ),
    "answer_without_annotations": (
        # no ANSWERED key anywhere: the fallback is the final tool-free turn of an ANSWERED episode
        [turn(0, [calc("1+1")]), turn(1, **{Ann.EVIDENCE_COMPLETE: False})],
        [0, 0],
        1,
        0,
    ),
    "invalid_calls": (
        [
            turn(
                0,
                [malformed(), ToolCall("calculater", {"expression": "1"}), calc("")],
                [ToolErrorKind.MALFORMED, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.BAD_ARGUMENTS],
            ),
            # env faults are not invalid calls; two identical malformed calls are not a loop
            turn(
                1,
                [calc("1/0"), calc("9**9**9"), malformed()],
                [ToolErrorKind.TOOL_ERROR, ToolErrorKind.TIMEOUT, ToolErrorKind.MALFORMED],
            ),
            answer(2, evidence=True),
        ],
        [0, 0, 0],
        None,
        4,
    ),
}
NO_ANSWER = {
    "no_answer_max_turns": (
        [turn(i, [calc("37*12")], **{Ann.EVIDENCE_COMPLETE: False}) for i in range(3)],
        [0, 1, 1],
        None,
        0,
    ),
}


def _check_agreement(traj: Trajectory, repeats: list[int], prem: int | None, invalid: int):
    modes = failure_modes(traj)
    # facts against the hand-derived expectation
    assert facts.repeated_call_counts(traj.turns) == repeats
    assert facts.repeated_calls(traj) == sum(repeats)
    assert facts.has_loop(traj) is (sum(repeats) > 0)
    assert facts.premature_turn(traj) == prem
    assert facts.invalid_calls(traj) == invalid
    # (a) loop reward <-> evaluation loop flag
    loop_turns = loop(traj, per_repeat=PER_REPEAT)
    assert loop_turns == pytest.approx([PER_REPEAT * n for n in repeats])
    assert sum(loop_turns) == pytest.approx(PER_REPEAT * facts.repeated_calls(traj))
    assert (sum(loop_turns) != 0) is modes["loop"]
    # (b) premature reward <-> evaluation premature flag, on the answer turn
    prem_turns = premature(traj, penalty=PENALTY)
    expected = [0.0] * len(traj.turns)
    if prem is not None:
        expected[prem] = PENALTY
    assert prem_turns == expected
    assert (sum(prem_turns) != 0) is modes["premature"]
    # (c) tool validity reward <-> evaluation invalid_call flag, per turn
    validity = tool_validity(traj, per_invalid=PER_INVALID)
    assert validity == pytest.approx([PER_INVALID * facts.invalid_calls(t) for t in traj.turns])
    assert sum(validity) == pytest.approx(PER_INVALID * invalid)
    assert (sum(validity) != 0) is modes["invalid_call"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_reward_and_evaluation_agree(name):
    turns, repeats, prem, invalid = CASES[name]
    _check_agreement(trajectory(turns), repeats, prem, invalid)


@pytest.mark.parametrize("name", sorted(NO_ANSWER))
def test_episode_without_answer(name):
    turns, repeats, prem, invalid = NO_ANSWER[name]
    traj = trajectory(turns, end=EndReason.MAX_TURNS)
    assert facts.answer_turn(traj) is None
    assert failure_modes(traj)["no_answer"]
    _check_agreement(traj, repeats, prem, invalid)


def test_answer_turn_and_evidence():
    t = trajectory([turn(0, [calc("1")]), answer(1, evidence=True), answer(2, evidence=False)])
    assert facts.answer_turn(t) == 1  # the first ANSWERED turn, not a later one
    assert not facts.is_premature(t)
    assert facts.evidence_gathered(t)
    failed = trajectory([turn(0, [calc("1/0")], [ToolErrorKind.TOOL_ERROR]), answer(1)])
    assert not facts.evidence_gathered(failed)
    # a final turn with calls is no answer even in an ANSWERED episode (the env said done)
    assert facts.answer_turn(trajectory([turn(0, [calc("1")])])) is None
    assert facts.answer_turn(trajectory([turn(0)], end=EndReason.MAX_TURNS)) is None


def test_call_key():
    assert facts.call_key(calc("37 * 12")) == facts.call_key(calc("37*12"))
    assert facts.call_key(calc("37*12")) != facts.call_key(calc("37*13"))
    assert facts.call_key(calc("37-12")) != facts.call_key(calc("12-37"))
    assert facts.call_key(ToolCall("f", {"x": 12})) == facts.call_key(ToolCall("f", {"x": 12.0}))
    assert facts.call_key(ToolCall("f", {"x": True})) != facts.call_key(ToolCall("f", {"x": 1}))
    assert facts.call_key(ToolCall("f", {"x": "1"})) != facts.call_key(ToolCall("f", {"x": 1}))
    assert facts.call_key(ToolCall("f", {"a": 1, "b": 2})) == facts.call_key(
        ToolCall("F ", {"b": 2.0, "a": 1})
    )
    assert facts.call_key(ToolCall("f", {})) != facts.call_key(ToolCall("g", {}))
    # exact signatures remain available for diagnostics
    t = trajectory([turn(0, [calc("37*12"), calc("37 * 12")])])
    assert facts.repeated_calls(t) == 1 and facts.repeated_calls(t, normalize=False) == 0


def test_decode_arguments_is_the_one_decoder():
    assert facts.decode_arguments({"a": 1}) == ({"a": 1}, None)
    assert facts.decode_arguments('{"a": [1, 2]}') == ({"a": [1, 2]}, None)
    assert facts.decode_arguments("  ") == ({}, None)
    for raw, reason in [
        ("{oops", "string that is not JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('"x"', "must be a JSON object, got str"),
        (12, "must be a JSON object, got int"),
        (None, "must be a JSON object, got NoneType"),
    ]:
        args, error = facts.decode_arguments(raw)
        assert args == {} and error is not None and reason in error, (raw, error)
        # the chat parser and the env's message decoder report the very same reason
        body = {"name": "calculator", "arguments": raw}
        _, (parsed,) = parse_tool_calls(f"<tool_call>{json.dumps(body)}</tool_call>")
        assert parsed.name == "calculator" and parsed.arguments == {}
        assert parsed.error == error
        msg = {"role": "assistant", "tool_calls": [{"id": "a", "function": body}]}
        (decoded,) = calls_from_message(msg)
        assert decoded.error == error and decoded.arguments == {}
    msg = {"tool_calls": [{"function": {"name": "calculator", "arguments": '{"expression": "2"}'}}]}
    (ok,) = calls_from_message(msg)
    assert ok.arguments == {"expression": "2"} and ok.error is None and ok.id == "call_0"


def test_facts_is_layer_one():
    """Only ``jaxrl_agents.types`` and the standard library (no jax / numpy at import)."""
    path = Path(__file__).resolve().parents[1] / "jaxrl_agents" / "facts.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    outside = {
        m
        for m in imported
        if m != "jaxrl_agents.types" and m.split(".")[0] not in sys.stdlib_module_names
    }
    assert not outside, outside
    code = (
        "import sys, jaxrl_agents.facts; "
        "bad = {'jax', 'numpy'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- (d) a real environment's annotations count the same repeats --------------------------------


class NumericCalculator(CalculatorEnv):
    """The calculator plus a numeric-argument tool (``12`` vs ``12.0``)."""

    @tool
    def double(self, x: float) -> str:
        """Double a number.

        Args:
            x: the number.
        """
        return str(2 * x)


def _spaced(expr: str) -> str:
    return re.sub(r"([^\d])", r" \1 ", expr)


async def _play(env: CalculatorEnv, task: Task, script) -> tuple[Trajectory, list[int]]:
    """Run ``script`` (a list of per-turn call lists, or a final answer string) through ``env``;
    return the trajectory built from what the env reported and its REPEATED_CALLS annotations."""
    await env.reset(task)
    turns, end = [], EndReason.MAX_TURNS
    for i, step_script in enumerate(script):
        if isinstance(step_script, str):
            step = await env.step({"role": "assistant", "content": step_script}, [])
            calls = []
        else:
            calls = list(step_script)
            msg = {"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in calls]}
            step = await env.step(msg, calls)
        turns.append(
            Turn(
                i,
                0,
                0,
                tool_calls=calls,
                tool_results=list(step.tool_results),
                annotations=dict(step.annotations),
            )
        )
        if step.done:
            end = EndReason.ANSWERED
            break
    traj = trajectory(turns, end=end)
    traj.verdict = await env.verify()
    assert traj.verdict.info["repeated_calls"] == sum(t.annotations[REPEATED_CALLS] for t in turns)
    return traj, [t.annotations[REPEATED_CALLS] for t in turns]


def _env_cases():
    two = CalculatorEnv.make_tasks("train", 1, seed=3, two_step_frac=1.0)[0]
    one = CalculatorEnv.make_tasks("train", 1, seed=3, two_step_frac=0.0)[0]
    s1, s2 = (s["expression"] for s in two.data["steps"])
    (o1,) = (s["expression"] for s in one.data["steps"])
    other = o1[:-1] + str((int(o1[-1]) + 1) % 10)  # 37*12 -> 37*13: one character apart
    return {
        # (task, script, per-turn repeats, premature turn, invalid calls)
        "loop_whitespace_then_solved": (
            two,
            [[calc(s1)], [calc(_spaced(s1))], [calc(s2)], str(two.data["answer"])],
            [0, 1, 0, 0],
            None,
            0,
        ),
        "premature": (two, ["42"], [0], 0, 0),
        "premature_after_one_step": (two, [[calc(s1)], "42"], [0, 0], 1, 0),
        "distinct_short_calls": (
            one,
            [[calc(o1)], [calc(other)], str(one.data["answer"])],
            [0, 0, 0],
            None,
            0,
        ),
        "numbers_and_same_turn": (
            one,
            [
                [ToolCall("double", {"x": 12}), ToolCall("double", {"x": 12.0})],
                [ToolCall("double", {"x": 12.0}), ToolCall("double", {"x": 13})],
            ],
            [1, 1],
            None,
            0,
        ),
        "invalid_and_no_answer": (
            one,
            [
                [ToolCall("calculater", {"expression": o1}), malformed()],
                [ToolCall("calculator", {"expr": o1}), malformed()],
                [ToolCall("calculater", {"expression": _spaced(o1)})],
            ],
            [0, 0, 1],  # an unknown-tool call is parsed (valid) and repeats; malformed never do
            None,
            5,
        ),
    }


ENV_CASES = _env_cases()


@pytest.mark.parametrize("name", sorted(ENV_CASES))
def test_env_annotations_match_facts(name):
    task, script, repeats, prem, invalid = ENV_CASES[name]
    traj, annotated = asyncio.run(_play(NumericCalculator(), task, script))
    # (d) the env's per-turn REPEATED_CALLS is facts' per-turn count, and sums to repeated_calls
    assert annotated == facts.repeated_call_counts(traj.turns) == repeats
    assert sum(annotated) == facts.repeated_calls(traj)
    # the env's own annotations (EVIDENCE_COMPLETE, ANSWERED) drive premature the same way
    _check_agreement(traj, repeats, prem, invalid)
    if name.startswith("premature"):
        assert failure_modes(traj)["skipped_step"]


def test_a_call_again_after_its_transient_fault_is_a_retry_not_a_repeat():
    """The env and facts agree: the second call of ``o1`` follows its fault (a retry), the third
    follows its success (a repeat); the loop failure mode counts only the repeat."""
    (one,) = CalculatorEnv.make_tasks("train", 1, seed=3, two_step_frac=0.0)
    (o1,) = (s["expression"] for s in one.data["steps"])
    env = NumericCalculator(fault_rate=1.0, max_faults=1)  # the first call fails
    script = [[calc(o1)], [calc(o1)], str(one.data["answer"])]
    traj, annotated = asyncio.run(_play(env, one, script))
    assert not traj.turns[0].tool_results[0].ok and traj.turns[1].tool_results[0].ok
    assert annotated == facts.repeated_call_counts(traj.turns) == [0, 0, 0]
    assert traj.verdict.success and not failure_modes(traj)["loop"]
    env = NumericCalculator(fault_rate=1.0, max_faults=1)
    script = [[calc(o1)], [calc(o1)], [calc(_spaced(o1))], str(one.data["answer"])]
    traj, annotated = asyncio.run(_play(env, one, script))
    assert annotated == facts.repeated_call_counts(traj.turns) == [0, 0, 1, 0]
    assert failure_modes(traj)["loop"]
