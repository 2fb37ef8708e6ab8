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
    env = {**os.environ, "XLA_FLAGS": os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"]}
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
    out = _run(
        "bench_rollout.py", "--workload", "latency", "--episodes", "8", "--turns", "2", "--quick"
    )
    for key in ("wall_s_latency0", "wall_s_latency100", "extra_s", "bound_s", "compiles"):
        assert key in out, key
    assert out["wall_s_latency100"] > out["wall_s_latency0"] > 0
    # 8 episodes x 2 turns x 100 ms: overlapped, far below the 1.6 s a sequential loop would add
    assert out["extra_s"] < out["sequential_s"]


def test_bench_rollout_group_and_arrival_fields():
    out = _run("bench_rollout.py", "--workload", "group,arrival", "--quick")
    for key in ("group_shared_s", "group_unshared_s", "group_ratio", "gap_chunked_s"):
        assert key in out, key
    assert out["group_shared_forks"] > 0 and out["group_unshared_forks"] == 0
    assert out["group_shared_shared_tokens"] > 0
    total = out["group_shared_prefill_tokens"] + out["group_shared_shared_tokens"]
    assert total == out["group_unshared_prefill_tokens"]
    assert (
        out["group_shared_compiles_after_warmup"]
        == 0
        == out["group_unshared_compiles_after_warmup"]
    )
    assert out["gap_unchunked_s"] > 0 and out["gap_chunked_s"] > 0


def test_bench_train_fields():
    out = _run("bench_train.py", "--quick", "--steps", "2", "--batch", "4", "--buckets", "64")
    for key in ("tok_s", "compiles", "steps"):
        assert key in out, key
    assert out["tok_s"] > 0 and out["results"][0]["compiles_after_warmup"] == 0


def test_bench_attention_fields():
    """Both programs run on the same batch; the blocked one gives the square's logits."""
    out = _run("bench_attention.py", "--lengths", "320", "--tokens", "640", "--steps", "1")
    row = out["rows"]["320"]
    assert row["rows"] == 2 and row["speedup"] > 0
    assert row["blocked_median_s"] > 0 and row["square_median_s"] > 0
    assert row["max_logit_diff"] < 1e-4, row


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


def test_profile_decode_splits_a_step_by_kind():
    """The decode profile finds the decode programs' ops in the trace and sorts them by the
    functions that made them: matmuls, the head, attention; the floors come with it."""
    out = _run(
        "profile_decode.py",
        *("--model", "tiny", "--batch", "2", "--new-tokens", "6", "--prompt-len", "8"),
        *("--decode-chunk", "4", "--repeats", "1"),
    )
    ms = out["per_step_ms"]
    for kind in ("layer matmuls", "vocabulary head matmul", "attention over the cache"):
        assert ms[kind] > 0, (kind, ms)
    assert out["in_ops_ms"] <= out["program_ms"] * 1.5 and out["decode_steps_traced"] >= 5
    # 2 layers x (fused q/k/v, o, fused gate/up, down) and one head, 2 rows each
    assert out["matmul_shapes"]["2x128x1200"] == 1 and len(out["matmul_shapes"]) == 5
    assert out["floor_layer_matmuls_ms"] > 0 and out["peak_gflops"] > 0


def test_scripts_have_help():
    for script in sorted(SCRIPTS.glob("*.py")):
        p = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0 and "usage" in p.stdout.lower(), (script.name, p.stderr[-500:])


def test_bench_gpu_smoke_and_render(tmp_path):
    """The GPU script's smoke section runs on CPU, writes the fields its tables need, and
    ``--render`` turns a result file into BENCHMARKS.md's GPU block."""
    out = tmp_path / "gpu.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_gpu.py"), "--out", str(out), "--only", "smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XLA_FLAGS": os.environ["JAXRL_TEST_XLA_FLAGS_ONE_DEVICE"]},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["errors"] == [] and {"jax", "flax", "torch"} <= set(data["versions"])
    dec, train = data["smoke"]
    for key in ("ours_tok_s", "hf_tok_s", "roofline_tok_s", "ratio_vs_hf", "compiles"):
        assert dec[key] > 0, key
    # same weights, greedy: bf16 logprobs agree with transformers' teacher-forced forward
    assert dec["logprob_abs_diff_vs_hf_max"] < 0.1
    assert train["tok_s"] > 0 and train["compiles_after_warmup"] == 0
    # render: the smoke rows as the decode/train rows of a result file
    data["decode"], data["train"] = [dec], [train]
    out.write_text(json.dumps(data))
    md = tmp_path / "B.md"
    md.write_text("# B\n<!-- gpu:start -->\nold\n<!-- gpu:end -->\ntail\n")
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_gpu.py"), "--render", str(out)]
        + ["--benchmarks-md", str(md)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    text = md.read_text()
    assert "old" not in text and text.endswith("tail\n")
    assert (
        "| [1] | tiny (0.00B) unrolled | 4 |" in text and "| [1] | tiny | 4 x 128 | False |" in text
    )


def test_bench_lora_fields():
    """Both variants in their own processes on the tiny model; the adapters' trainable state is
    a small fraction of full fine-tuning's."""
    out = _run("bench_lora.py", "--quick", "--lora-dtype", "bfloat16", "--top-layers", "1")
    for key in ("update_speedup", "step_speedup", "trainable_state_frac", "train_peak_rss_frac"):
        assert out[key] > 0, key
    for v in ("full", "lora"):
        assert out[v]["update_s"] > 0 and out[v]["rollout_s"] > 0 and out[v]["logprobs_s"] > 0
    assert out["lora"]["trainable_params"] < 0.05 * out["full"]["trainable_params"]
    assert out["trainable_state_frac"] < 0.05
    assert out["lora"]["rollout_unmerged_s"] > 0  # the unmerged sampler measured too
    # --lora-dtype: LoRA again at its own compute dtype, against full fine-tuning at --dtype
    bf16 = out["lora_bfloat16"]
    assert bf16["dtype"] == "bfloat16" and out["full"]["dtype"] == "float32"
    assert bf16["trainable_state_bytes"] == out["lora"]["trainable_state_bytes"]  # fp32 adapters
    assert out["lora_bfloat16_step_speedup"] == out["full"]["step_s"] / bf16["step_s"]
    # --top-layers 1: adapters on the last of the two layers, half the adapter parameters
    top = out["lora_top1"]
    assert top["top_layers"] == 1 and 2 * top["trainable_params"] == out["lora"]["trainable_params"]
    assert out["lora_top1_update_speedup"] == out["full"]["update_s"] / top["update_s"]


def test_bench_peers_tabulates_a_harness_run(tmp_path):
    """The side-by-side table of a peers-harness results folder (the peers themselves are never
    a test dependency): medians over rounds, ratios the right way round, token agreement."""
    for tag, ours, vllm in (("r1", (500.0, 10.0, 30.0), (600.0, 9.0, 27.0)),
                            ("r2", (520.0, 11.0, 31.0), (640.0, 9.5, 28.0))):  # fmt: skip
        for eng, (tok_s, mt, group) in (("ours", ours), ("vllm_inproc", vllm)):
            row = {"batch_tok_s": tok_s, "mt_total_s": mt, "group_s": group, "version": eng}
            (tmp_path / f"{eng}.{tag}.json").write_text(json.dumps(row))
    toks = {"batch": [[1, 2], [3, 4]], "multiturn": [[[1], [2]], [[3], [4]]]}
    (tmp_path / "ours.r1.tokens.json").write_text(json.dumps(toks))
    toks["batch"][1] = [3, 5]
    (tmp_path / "vllm_inproc.r1.tokens.json").write_text(json.dumps(toks))
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_peers.py"), "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    rows = {line.split("|")[1].strip()[:5]: line for line in p.stdout.splitlines() if "|" in line}
    assert "| 510 tok/s | 620 tok/s | 0.82x |" in rows["batch"]  # higher is better: 510 / 620
    assert "| 10.5 s | 9.25 s | 0.88x |" in rows["16 se"]  # lower is better: 9.25 / 10.5
    assert "| 30.5 s | 27.5 s | 0.90x |" in rows["RL gr"]
    assert "batch 1/2 rows; multiturn 4/4 rows" in p.stdout and "Rounds: 2" in p.stdout
