"""Run folders are safe: a sweep's jobs never share one, a folder refuses a different config
(and writes nothing before refusing), a resumed run keeps the SFT policy as its KL reference and
logs every step once.

Runs go through the user's command: ``python -m jaxrl_agents.cli.train`` in subprocesses where a
kill -9 or a multirun is involved, the entry point's ``main()`` in-process otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from train_cli import FAST
from train_cli import main_in_process as _main


def _env():
    return {**os.environ, "XLA_FLAGS": os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"],
            "PYTHONUNBUFFERED": "1"}  # fmt: skip


def _cli(*args, cwd=None, timeout=400):
    cmd = [sys.executable, "-m", "jaxrl_agents.cli.train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd,
                          timeout=timeout)  # fmt: skip


def test_multirun_jobs_get_their_own_folders(tmp_path):
    # a list override in the folder name: brackets become parentheses (orbax cannot restore
    # checkpoints from a path with brackets)
    buckets = "trainer.batching.seq_buckets=[128,256,384]"
    p = _cli("-m", "advantage=grpo,rloo", *FAST, "trainer.rl.steps=1", buckets, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming" not in p.stdout, p.stdout[-2000:]
    runs = sorted((tmp_path / "multirun" / "demo").glob("advantage=*"))
    assert [r.name.split(",")[0] for r in runs] == ["advantage=grpo", "advantage=rloo"]
    assert all("trainer.batching.seq_buckets=(128,256,384)" in r.name for r in runs), runs
    again = _cli("-m", "advantage=grpo", *FAST, "trainer.rl.steps=1", buckets, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from checkpoint: stage=rl step=1" in again.stdout  # its checkpoint restores
    bad = _cli(*FAST, "run_dir='runs/x[1]'", cwd=tmp_path)
    assert bad.returncode == 2 and "run_dir='runs/x[1]': orbax cannot restore" in bad.stderr
    for run in runs:
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["advantage"]["name"] == run.name.split(",")[0].split("=")[1]
        assert cfg["run_dir"] == str(run)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["rl_heldout_success"] is not None
        env = summary["environment"]  # what produced the numbers, beside the config
        assert env["packages"]["jax"] == jax.__version__ and env["backend"] == "cpu"
        assert env["devices"] == "1 x cpu" and env["cpu_count"] == os.cpu_count()
        assert env["cpus_usable"] == len(os.sched_getaffinity(0))
        rl = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rl if r["stage"] == "rl"] == [1]  # trained, not resumed


def test_a_different_config_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    argv = [*FAST, "trainer.rl.steps=1", f"run_dir={run}"]
    assert _main(argv, monkeypatch) == 0
    before = {p: p.read_bytes() for p in (run / "config.json", run / "metrics.jsonl")}
    capsys.readouterr()
    assert _main([*argv, "optimizer.lr=5e-4"], monkeypatch) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "optimizer.lr: 0.0001 -> 0.0005" in err[0], err
    assert "trainer.checkpoint.allow_config_change=true" in err[0]
    assert {p: p.read_bytes() for p in before} == before  # nothing overwritten
    # Asked for explicitly, it resumes (and finds the run already done).
    code = _main(
        [*argv, "optimizer.lr=5e-4", "trainer.checkpoint.allow_config_change=true"], monkeypatch
    )
    assert code == 0
    assert "resuming from checkpoint: stage=rl step=1" in capsys.readouterr().out
    # trainer.checkpoint.resume=false on a folder with checkpoints: refused, not overwritten.
    assert _main([*argv, "trainer.checkpoint.resume=false"], monkeypatch) == 2
    assert "trainer.checkpoint.resume=false" in capsys.readouterr().err


def test_a_run_made_before_a_key_existed_resumes_at_its_default(tmp_path, capsys):
    """After an upgrade that added a config key, a run folder whose config.json lacks it resumes
    when the key is at its default (the old behaviour), and is refused at any other value."""
    import dataclasses

    from jaxrl_agents.jobs.config import ConfigError, RunConfig, TrainerSpec
    from jaxrl_agents.jobs.records import RunRecord
    from jaxrl_agents.jobs.trainer_spec import SFTSpec

    cfg = RunConfig(run_dir=str(tmp_path))
    old = json.loads(json.dumps(dataclasses.asdict(cfg)))
    del old["trainer"]["rl"]["start_min_success"], old["trainer"]["sft"]["lr"]  # "added" since
    (tmp_path / "config.json").write_text(json.dumps(old))
    RunRecord(tmp_path).check_config(cfg, has_checkpoints=True)
    out = capsys.readouterr().out
    assert ("resuming a run made before these keys existed, at their defaults: "
            "trainer.rl.start_min_success=0.0, trainer.sft.lr=0.001") in out  # fmt: skip
    bumped = dataclasses.replace(cfg, trainer=TrainerSpec(sft=SFTSpec(lr=2e-3)))
    with pytest.raises(ConfigError, match=r"trainer.sft.lr: '<absent>' -> 0.002"):
        RunRecord(tmp_path).check_config(bumped, has_checkpoints=True)


def test_kill_and_resume_keeps_the_sft_reference_and_logs_each_step_once(tmp_path):
    from jaxrl_agents.jobs.restore import load_policy

    run = tmp_path / "killed"
    args = [*FAST, f"run_dir={run}", "trainer.rl.steps=8", "trainer.eval.every=0",
            "trainer.checkpoint.every=2", "loss.kl_coef=0.05"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxrl_agents.cli.train", *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=_env(), text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 300
    # kill -9 once RL step 2's checkpoint (global step 4 + 2) is there, usually with step 3
    # logged and step 4 not yet checkpointed: those rows come again after the resume
    while time.time() < deadline and not (run / "checkpoints" / "latest" / "6").exists():
        time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    p = _cli(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from checkpoint: stage=rl step=" in p.stdout
    resumed_at = int(p.stdout.split("resuming from checkpoint: stage=rl step=")[1].split()[0])
    assert 2 <= resumed_at < 8, p.stdout[-2000:]  # the kill came mid-RL
    stages = json.loads((run / "stages.json").read_text())
    assert stages["kl_reference"]["from"] == "sft"
    # the same machine and build: no warning, nothing noted beside the first environment
    assert "another machine or build" not in p.stderr and "resumed_environments" not in stages
    sft_model, _, meta = load_policy(run, which="sft")
    from flax import nnx

    leaves = [np.asarray(v.get_value(), np.float64) for _, v in nnx.to_flat_state(
        nnx.state(sft_model, nnx.Param))]  # fmt: skip
    assert stages["kl_reference"]["checksum"] == pytest.approx(sum(x.sum() for x in leaves),
                                                               rel=0, abs=0)  # fmt: skip
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["stage"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), keys  # no duplicate rows after the resume
    assert [s for st, s in keys if st == "rl"] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_record_killed_mid_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """The run folder's JSON records are written beside the old file, then renamed over it: a
    kill during the write (here the write raising after half its text) leaves the previous
    record whole, which a resume reads. A record that is not JSON stops in one line naming it."""
    import pathlib

    from jaxrl_agents.jobs.config import ConfigError
    from jaxrl_agents.jobs.records import RunRecord

    rec = RunRecord(tmp_path)
    rec.set("sft_from", {"run": "a"})
    rec.save()
    real = pathlib.Path.write_text

    def killed(self, text, *a, **k):
        real(self, text[: len(text) // 2], *a, **k)
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(pathlib.Path, "write_text", killed)
    rec.set("rl_gate", {"passed": True})
    with pytest.raises(KeyboardInterrupt):
        rec.save()
    monkeypatch.undo()
    assert RunRecord(tmp_path).stages == {"sft_from": {"run": "a"}}
    (tmp_path / "stages.json").write_text('{"sft_from": ')  # a file cut short elsewhere
    with pytest.raises(ConfigError, match=r"stages\.json is not valid JSON") as e:
        RunRecord(tmp_path)
    assert "\n" not in str(e.value)


def test_a_resume_on_another_machine_or_build_is_noted_and_warned(tmp_path, capsys):
    """``stages.json`` keeps the environment a run started in; a resume in another one (another
    CPU, jaxlib, XLA flags) warns in one line naming what changed and is noted beside it."""
    from jaxrl_agents.jobs.records import RunRecord, environment

    env = environment()
    assert env["packages"]["jaxlib"] is not None and env["cpu"]
    RunRecord(tmp_path).note_environment(env)
    RunRecord(tmp_path).note_environment(environment())  # a resume on the same machine
    assert capsys.readouterr().err == ""
    moved = {**env, "cpu": "Other CPU", "xla_flags": "--xla_cpu_enable_fast_math=true"}
    RunRecord(tmp_path).note_environment(moved)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "on another machine or build" in err[0], err
    assert f"cpu: {env['cpu']!r} -> 'Other CPU'" in err[0] and "xla_flags" in err[0]
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert stages["environment"] == env and stages["resumed_environments"] == [moved]
    # a folder whose run started before this record: noted as recorded at the resume
    old = tmp_path / "old"
    old.mkdir()
    (old / "stages.json").write_text(json.dumps({"oracle_needs": {"turns": 4}}))
    RunRecord(old).note_environment(env)
    assert json.loads((old / "stages.json").read_text())["environment"] == {
        **env, "recorded_at": "resume"}  # fmt: skip
    assert capsys.readouterr().err == ""
