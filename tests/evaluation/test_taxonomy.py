"""Failure taxonomy and metrics on scripted policies with known behaviour (real rollout path)."""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import POLICIES, looping

from jaxrl_agents.envs.calculator import oracle_policy
from jaxrl_agents.evaluation.metrics import evaluation_metrics, pass_at_k, pass_at_ks
from jaxrl_agents.evaluation.summary import FAILURE_MODES, has_loop, summarize
from jaxrl_agents.types import ToolCall


def _expected(name: str, tasks) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(failure-mode counts, primary-cause counts, end reasons) derived from each policy's script
    and the task list (two-step tasks are the ones with a second required step)."""
    n = len(tasks)
    two = sum(len(t.data["steps"]) == 2 for t in tasks)
    modes = dict.fromkeys(FAILURE_MODES, 0)
    if name == "oracle":
        return modes, {}, {"answered": n}
    if name == "early":  # answers at once with a wrong number: every required step skipped
        modes.update(premature=n, skipped_step=n)
        return modes, {"premature": n}, {"answered": n}
    if name == "loop":  # repeats step 1 until max_turns: step 2 of two-step tasks never done
        modes.update(loop=n, no_answer=n, skipped_step=two)
        return modes, {"loop": n}, {"max_turns": n}
    if name == "context_loss":  # all steps done, answer ignores the tool's result
        modes.update(context_loss=n)
        return modes, {"context_loss": n}, {"answered": n}
    if name == "invalid":  # one unknown-tool call, then solved: flagged but not a failure
        modes.update(invalid_call=n)
        return modes, {}, {"answered": n}
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_taxonomy_counts_exact(name, tasks, rollout):
    trajs = rollout(POLICIES[name], tasks)
    s = summarize(trajs)
    modes, primary, ends = _expected(name, tasks)
    assert s["failure_modes"] == modes
    assert s["primary_failures"] == primary
    assert s["end_reasons"] == ends
    assert s["success"] == (1.0 if name in ("oracle", "invalid") else 0.0)


def test_episode_timeout_is_its_own_cause(tasks, rollout):
    # Each generate takes 0.2 s against a 0.05 s deadline: no turn ever completes.
    trajs = rollout(oracle_policy, tasks[:2], latency_s=0.2, timeout_s=0.05)
    s = summarize(trajs)
    assert s["end_reasons"] == {"episode_timeout": 2}
    assert s["primary_failures"] == {"episode_timeout": 2}
    assert s["failure_modes"]["no_answer"] == 2 and s["failure_modes"]["skipped_step"] == 2


def test_loop_detector_normalises_but_keeps_order():
    def traj_with(*exprs):
        from jaxrl_agents.types import EndReason, Task, Trajectory, Turn

        calls = [ToolCall("calculator", {"expression": e}) for e in exprs]
        turn = Turn(0, 0, 0, tool_calls=calls)
        return Trajectory(
            Task("t", "calculator", "heldout", {}),
            [],
            [],
            [],
            [],
            [],
            0,
            [turn],
            EndReason.MAX_TURNS,
        )

    assert has_loop(traj_with("37*12", "37 * 12"))
    assert not has_loop(traj_with("37*12", "37 * 12"), normalize=False)
    assert not has_loop(traj_with("37-12", "12-37"))  # order matters in arithmetic
    assert not has_loop(traj_with("37*12", "37*13"))  # a difflib ratio would call this a loop


def _pass_at_k_reference(n: int, c: int, k: int) -> float:
    """Probability that k draws without replacement include a success, by enumeration."""
    outcomes = [1] * c + [0] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in d) for d in draws) / len(draws)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 0, 1), (5, 1, 1), (5, 2, 3), (6, 3, 2), (4, 4, 4)])
def test_pass_at_k_matches_enumeration(n, c, k):
    assert math.isclose(pass_at_k(n, c, k), _pass_at_k_reference(n, c, k), abs_tol=1e-12)


def test_pass_at_k_over_sampled_groups(tasks, rollout):
    # Loop fails everything; oracle solves everything: pass@k is 0 and 1 for every k <= G.
    trajs = rollout(looping, tasks[:3], samples=3) + rollout(oracle_policy, tasks[3:5], samples=3)
    m = evaluation_metrics(trajs, ks=(1, 2, 3))
    assert m["tasks"] == 5 and m["samples_per_task"] == 3 and m["n"] == 15
    assert m["pass@1"] == pytest.approx(2 / 5) and m["pass@3"] == pytest.approx(2 / 5)
    assert m["turns"]["max"] == 4.0  # loop episodes hit max_turns
    with pytest.raises(ValueError, match="pass@4 needs >= 4 samples"):
        pass_at_ks(trajs, (4,))
