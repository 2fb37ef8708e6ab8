"""Each benchmark script runs in its smallest configuration and emits the fields that
BENCHMARKS.md and ``scripts/bench_all.py`` need (last stdout line = one JSON object)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, *args: str, timeout: int = 300) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_bench_rollout_fields():
    out = _run("bench_rollout.py", "--episodes", "8", "--turns", "2", "--quick")
    for key in ("wall_s_latency0", "wall_s_latency100", "extra_s", "bound_s", "compiles"):
        assert key in out, key
    assert out["wall_s_latency100"] > out["wall_s_latency0"] > 0
    # 8 episodes x 2 turns x 100 ms: overlapped, far below the 1.6 s a sequential loop would add
    assert out["extra_s"] < out["sequential_s"]


def test_bench_train_fields():
    out = _run("bench_train.py", "--quick", "--steps", "2", "--batch", "4", "--buckets", "64")
    for key in ("tok_s", "compiles", "steps"):
        assert key in out, key
    assert out["tok_s"] > 0 and out["results"][0]["compiles_after_warmup"] == 0


@pytest.mark.slow
def test_bench_sampler_fields():
    out = _run(
        "bench_sampler.py",
        "--repeats",
        "1",
        "--batch",
        "2",
        "--new-tokens",
        "8",
        "--prompt-len",
        "16",
        "--skip-tiny",
        "--skip-multiturn",
    )
    for key in ("ours_tok_s", "hf_tok_s", "ratio"):
        assert key in out, key
    assert out["ours_tok_s"] > 0 and out["hf_tok_s"] > 0


def test_scripts_have_help():
    for script in sorted(SCRIPTS.glob("*.py")):
        p = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0 and "usage" in p.stdout.lower(), (script.name, p.stderr[-500:])
