"""The Hydra app end to end on the tiny model: SFT then RL for a few steps, artefacts written,
the export loads in transformers, a killed run resumes, bad configs fail fast.

These run ``python -m jaxrl_agents.cli.train`` in subprocesses, exactly as a user would.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

SMOKE = ["trainer=smoke", "sampler.max_slots=16", "rollout.group_size=2", "mesh=single"]


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _train(run_dir, *overrides, check=True, timeout=400):
    cmd = [sys.executable, "-m", "jaxrl_agents.cli.train", *SMOKE, f"run_dir={run_dir}", *overrides]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(
            f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
        )
    return p


def _export_params(folder):
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run") / "smoke"
    p = _train(run_dir)
    return run_dir, p


def test_artefacts(smoke_run):
    run_dir, p = smoke_run
    assert p.stdout.strip().splitlines()[-1].startswith("run folder:"), p.stdout[-500:]
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("sft_heldout_success", "rl_heldout_success", "heldout_tasks", "seed", "wall_s"):
        assert key in summary, key
    assert summary["heldout_tasks"] == 4
    assert 0.0 <= summary["sft_heldout_success"] <= 1.0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stages = {r["stage"] for r in rows}
    assert {"sft", "rl", "eval"} <= stages
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for key in ("reward", "success", "loss", "grad_norm", "rollout_s", "train_s", "clip_frac"):
        assert key in rl[0], key
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert (
        sorted(
            int(p.name) for p in (run_dir / "checkpoints" / "latest").iterdir() if p.name.isdigit()
        )[-1]
        == 4 + 2
    )  # sft_steps + rl_steps
    assert list((run_dir / "trajectories").glob("*.jsonl"))
    # the SFT result is kept for base-vs-trained comparisons (jaxrl-eval run@sft)
    assert (run_dir / "checkpoints" / "sft" / "4").is_dir()


def test_export_loads_in_transformers_and_generates(smoke_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, _ = smoke_run
    export = run_dir / "hf_export"
    model = AutoModelForCausalLM.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
    assert torch.isfinite(model(**ids).logits).all()


def test_bad_configs_fail_fast(tmp_path):
    cases = [
        (["advantage.name=gpro"], "gpro"),
        (["mesh.shape=[3,1,1]"], "3"),
        (["model=hf", "model.path=/nonexistent/model"], "/nonexistent/model"),
        (["trainer.rl_stpes=3"], "rl_stpes"),
    ]
    for overrides, needle in cases:
        t = time.time()
        p = _train(tmp_path / "bad", *overrides, check=False, timeout=120)
        elapsed = time.time() - t
        assert p.returncode != 0, overrides
        err = p.stderr + p.stdout
        assert needle in err, (overrides, err[-2000:])
        assert "Traceback" not in p.stderr, (overrides, p.stderr[-2000:])
        assert elapsed < 60, (overrides, elapsed)


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    """kill -9 mid-RL, rerun the same command: it resumes and ends at the same parameters as an
    uninterrupted run (deterministic configuration: per-request sampling keys, fixed data order)."""
    overrides = ["trainer.rl.steps=4", "trainer.eval.every=0", "trainer.checkpoint.export=true"]
    ref = tmp_path / "ref"
    _train(ref, *overrides)

    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "jaxrl_agents.cli.train", *SMOKE, f"run_dir={run}", *overrides]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
        text=True,
        start_new_session=True,
    )
    latest = run / "checkpoints" / "latest"
    deadline = time.time() + 300
    # wait for the second RL checkpoint (global step sft_steps + 2 = 6), then kill -9
    while time.time() < deadline and not (latest / "6").exists():
        time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists()
    p = _train(run, *overrides)
    assert "resuming from checkpoint: stage=rl" in p.stdout, p.stdout[-2000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if r["stage"] == "rl") == 4
    a, b = _export_params(ref / "hf_export"), _export_params(run / "hf_export")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_overlap_and_kl_reference(tmp_path):
    """One-step-off-policy overlap records staleness 1 after the first step; a KL coefficient
    brings in the frozen reference and logs the KL."""
    run = tmp_path / "overlap"
    _train(
        run,
        "trainer.rl.off_policy_overlap=true",
        "trainer.rl.steps=3",
        "trainer.eval.every=0",
        "trainer.checkpoint.export=false",
        "loss.kl_coef=0.05",
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["staleness"] for r in rl] == [0.0, 1.0, 1.0]
    assert all("kl" in r for r in rl)
