"""One bad episode cannot end a run: an env constructor and a reward term that raise once are
counted, the job finishes; a share of failing episodes past the threshold stops it in one line.

The job runs in-process through ``jaxrl-train``'s own entry point (``cli.train.main``) on the smoke
trainer, with the env class and the reward term defined here (found by import path / registry).
"""

from __future__ import annotations

import json
import sys

import pytest

from jaxrl_agents.envs import CalculatorEnv
from jaxrl_agents.rewards import register_reward_term

SMOKE = ["trainer=smoke", "sampler.max_slots=16", "rollout.group_size=2", "mesh=single",
         "trainer.checkpoint.export=false", "trainer.eval.every=0"]  # fmt: skip
CALLS = {"env": 0, "reward": 0}


class FlakyEnv(CalculatorEnv):
    """Raises in its constructor once: in RL step 1. Constructions before it: 1 start-up check,
    16 oracle-fit episodes, 16 SFT golden episodes, 4 held-out and 4 validation episodes."""

    def __init__(self, **kw):
        CALLS["env"] += 1
        if CALLS["env"] == 43:
            raise RuntimeError("flaky constructor")
        super().__init__(**kw)


class BrokenEnv(CalculatorEnv):
    """Works for the start-up checks, the SFT stage and its evaluations, then always raises."""

    def __init__(self, **kw):
        CALLS["env"] += 1
        if CALLS["env"] > 41:
            raise RuntimeError("env service down")
        super().__init__(**kw)


@register_reward_term("flaky_once")
def flaky_once(traj) -> float:
    CALLS["reward"] += 1
    # after SFT 4 held-out + 4 validation, then 4 in RL step 1: the 2nd episode of RL step 2
    if CALLS["reward"] == 14:
        raise ValueError("flaky reward")
    return 0.0


def _main(argv, monkeypatch):
    from jaxrl_agents.cli import train as cli

    CALLS.update(env=0, reward=0)
    monkeypatch.setattr(sys, "argv", ["jaxrl-train", *SMOKE, *argv])
    try:
        cli.main()
    except SystemExit as e:
        return e.code
    return 0


def test_one_bad_constructor_and_reward_are_counted_and_the_job_finishes(
    tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    code = _main(
        [f"env.name={__name__}.FlakyEnv", f"run_dir={run}",
         "reward.terms=[{name: outcome}, {name: flaky_once}]"],
        monkeypatch,
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    assert (run / "summary.json").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["env_errors"] for r in rl] == [1, 0]
    assert [r["dropped"] for r in rl] == [1, 1]  # the env error has no tokens; the reward error
    assert "RL step 1: 1/4 episodes ended in errors" in out.err
    assert "flaky constructor" in out.err and "flaky reward" in out.err
    assert all(r["grad_norm"] == r["grad_norm"] for r in rl)  # finite: the update ran


def test_too_many_failing_episodes_stop_the_run_in_one_line(tmp_path, capsys, monkeypatch):
    code = _main([f"env.name={__name__}.BrokenEnv", f"run_dir={tmp_path / 'run'}"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "env service down" in lines[0], err[-2000:]
    assert "error_abort_frac" in lines[0] and "Traceback" not in err


@pytest.fixture(autouse=True)
def _unregister():
    yield
    from jaxrl_agents.rewards.terms import REWARD_TERMS

    REWARD_TERMS.pop("flaky_once", None)
