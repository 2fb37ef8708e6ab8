"""Non-RL baselines of the train job: rejection-sampling fine-tuning (``trainer.rl.stage=rft``,
``jobs.baselines``) and SFT on the annotator's verdict-filtered data (``trainer.sft.filter``)."""

from __future__ import annotations

import asyncio
import json

import jax
import numpy as np
from train_cli import FAST
from train_cli import main_in_process as _main

from jaxrl_agents.cli.app import compose
from jaxrl_agents.cli.train import to_run_config
from jaxrl_agents.envs.calculator import oracle_policy, wrong_policy
from jaxrl_agents.jobs.baselines import rft
from jaxrl_agents.jobs.config import JobAborted
from jaxrl_agents.jobs.run import Run
from jaxrl_agents.jobs.system import build_train
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.types import read_jsonl


def _run(tmp_path, *extra):
    cfg = to_run_config(compose("config", [*FAST, f"run_dir={tmp_path}", *extra]))
    system = build_train(cfg)
    run = Run(cfg, system)
    return run, run.fresh_state(system.initial_params, run.rl_tx)


def test_rft_keeps_the_verified_episodes_of_the_rl_budget_and_trains_on_them(tmp_path):
    run, state = _run(tmp_path / "rft", "trainer.rl.steps=2", "trainer.rl.tasks_per_step=4")
    solved = {t.id for t in run.train_tasks[::2]}  # a policy that solves every other task

    def half(task):
        return oracle_policy(task) if task.id in solved else wrong_policy(task)

    engine = ScriptedEngine(run.sys.chat, policy_factory=half)
    before = jax.tree.map(np.asarray, state.params)
    after = asyncio.run(rft(run, engine, state))
    # the RL stage's budget: 2 steps x 4 tasks x group 2; the verdict keeps the solved half
    assert run.record.stages["rft"] == {"episodes": 16, "kept": 8, "kept_frac": 0.5}
    kept = list(read_jsonl(tmp_path / "rft" / "trajectories" / "rft_kept_step000002.jsonl"))
    assert len(kept) == 8 and all(t.success and t.task.id in solved for t in kept)
    changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, after.params)
    assert all(jax.tree.leaves(changed))  # 2 SFT steps on the kept episodes moved every weight
    run.ckpt.wait()
    assert run.ckpt.latest_step() == run.tr.sft.steps + 2  # checkpointed as RL's last step
    rows = [json.loads(x) for x in (tmp_path / "rft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("stage") == "rft"] == [2]


def test_rft_with_dynamic_sampling_samples_every_round_rl_may_sample(tmp_path):
    """With ``trainer.rl.dynamic_sampling`` RL's budget is up to ``dynamic_max_rounds`` rounds a
    step: RFT samples all of them, on the tasks an RL step's refills draw."""
    run, state = _run(
        tmp_path / "dyn",
        "trainer.rl.steps=2",
        "trainer.rl.tasks_per_step=2",
        "trainer.rl.dynamic_sampling=true",
        "trainer.rl.dynamic_max_rounds=3",
    )
    seen: dict[str, list[str]] = {"rl": [], "rft": []}
    phase = ["rl"]

    def wrong(task):  # every group uninformative: an RL step runs all of its rounds
        seen[phase[0]].append(task.id)
        return wrong_policy(task)

    engine = ScriptedEngine(run.sys.chat, policy_factory=wrong)
    source = run.step_source(dynamic=True)
    for s in range(2):
        _, counts = asyncio.run(source.step(engine, s, version=0))
        assert counts["dynamic/refill_rounds"] == 2
    phase[0] = "rft"
    try:
        asyncio.run(rft(run, engine, state))
    except JobAborted as e:  # nothing solved: the count of what was sampled is in the line
        assert "none of the 24 episodes" in str(e)  # 2 steps x 3 rounds x 2 tasks x group 2
    else:
        raise AssertionError("expected JobAborted")
    assert len(seen["rft"]) == 24 and sorted(seen["rft"]) == sorted(seen["rl"])


def test_rft_without_a_success_stops_in_one_line(tmp_path):
    run, state = _run(tmp_path / "none", "trainer.rl.steps=1", "trainer.rl.tasks_per_step=2")
    engine = ScriptedEngine(run.sys.chat, policy_factory=wrong_policy)
    try:
        asyncio.run(rft(run, engine, state))
    except JobAborted as e:
        assert "RFT: none of the 4 episodes sampled from the starting policy succeeded" in str(e)
    else:
        raise AssertionError("expected JobAborted")


def test_sft_filter_keeps_the_verified_annotator_episodes(tmp_path, monkeypatch, capsys):
    # the demo annotator answers 90% of the coin problems without the tool (a wrong number)
    run = tmp_path / "verified"
    argv = [*FAST, f"run_dir={run}", "trainer.sft.filter=verified", "trainer.rl.steps=0"]
    assert _main(argv, monkeypatch) == 0, capsys.readouterr().err[-600:]
    stages = json.loads((run / "stages.json").read_text())
    counts = stages["sft_filter"]
    assert 0 < counts["verified"] < counts["answered"]
    assert stages["sft_data"]["oracle_rows"] == counts["verified"]
    assert f"{counts['verified']} of {counts['answered']} answered episodes verified" in (
        capsys.readouterr().out
    )


def test_bad_baseline_keys_name_the_valid_values(tmp_path, monkeypatch, capsys):
    for key, valid in (
        ("trainer.rl.stage=sft", "valid: rl, rft"),
        ("trainer.sft.filter=all", "valid: answered, verified"),
    ):
        assert _main([*FAST, f"run_dir={tmp_path / 'x'}", key], monkeypatch) not in (0, None)
        assert valid in capsys.readouterr().err


def test_rl_options_reach_the_training_episodes_and_not_the_evaluations(tmp_path):
    """``env.rl_options`` (here: a fault on every call) is the env of the RL and RFT step
    source; held-out evaluation keeps ``env.options`` (no faults)."""
    run, _ = _run(
        tmp_path / "rl_options",
        "trainer.rl.tasks_per_step=4",
        "+env.rl_options={fault_rate: 1.0}",
    )
    engine = ScriptedEngine(run.sys.chat, policy_factory=oracle_policy)
    roll, _ = asyncio.run(run.step_source(dynamic=False).step(engine, 0, version=0))
    trained = run.sys.collector.everyone(roll)
    assert len(trained) == 8 and all(t.info["faults"] == 1 for t in trained)
    _, held_out = asyncio.run(run.evaluate(engine, version=0))
    assert held_out and all(t.info["faults"] == 0 for t in held_out)
