"""Train-step benchmark: tokens/s, compile count and (on GPU) model FLOPs utilisation.

Runs the real jitted RL train step (chunked logprobs + PPO-clip, AdamW, clipping, non-finite
guard) over ``--steps`` batches whose lengths vary, as rollouts do; lengths are bucketed, so the
number of compiled programs is bounded by the buckets touched, not by the steps.

    python scripts/bench_train.py                    # tiny + ~40M models, 50 steps each
    python scripts/bench_train.py --model 40m --steps 20 --json
    python scripts/bench_train.py --quick            # tiny model, 6 steps (smoke test)

Reported ``tok_s`` counts every position of the padded batch (B x T per step), the work the
accelerator actually does; ``real_tok_s`` counts only non-padding tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

MODELS = {
    # hidden, layers, heads, kv heads, mlp, vocab
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        vocab_size=1280,
    ),
    "40m": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
        vocab_size=32000,
    ),
    "0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    ),
    "1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
    ),
}
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12}


def n_params(m: dict) -> int:
    d, f, L, V = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["vocab_size"]
    hd = d // m["num_attention_heads"]
    attn = d * d * 2 + 2 * d * m["num_key_value_heads"] * hd
    return L * (attn + 3 * d * f) + V * d


def bench(
    name: str,
    *,
    steps: int,
    batch: int,
    buckets: list[int],
    dtype: str,
    seed: int = 0,
    chunk: int | None = None,
    remat: bool = False,
):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxrl_agents.algos import LossConfig
    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.rollout.packing import TrainBatch, bucket_for
    from jaxrl_agents.training.objectives import rl_loss
    from jaxrl_agents.training.step import (
        LossInputs,
        OptimizerConfig,
        init_train_state,
        make_train_step,
    )

    spec = MODELS[name]
    cfg = ModelConfig.from_hf_config(
        dict(model_type="qwen2", tie_word_embeddings=True, max_position_embeddings=4096, **spec)
    )
    if dtype != "float32":
        cfg = cfg.replace(dtype=dtype)
    if remat:
        cfg = cfg.replace(remat=True)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-5, warmup_steps=1).build()
    state = init_train_state(params, tx)
    loss_cfg = LossConfig(name="ppo_clip")
    step = make_train_step(graphdef, tx, rl_loss(loss_cfg, chunk=chunk or min(buckets)), rest=rest)
    compiled = step._cache_size  # programs in the jit cache (one per distinct batch shape)
    rng = np.random.default_rng(seed)

    def make_batch():
        lens = rng.integers(min(buckets) // 2, max(buckets), batch)
        T = bucket_for(int(lens.max()), buckets)
        ids = rng.integers(1, spec["vocab_size"], (batch, T)).astype(np.int32)
        seg = (np.arange(T)[None] < lens[:, None]).astype(np.int32)
        mask = seg * (np.arange(T)[None] >= 16)
        return TrainBatch(
            input_ids=ids,
            positions=np.broadcast_to(np.arange(T, dtype=np.int32), (batch, T)),
            segment_ids=seg,
            target_ids=np.roll(ids, -1, 1),
            loss_mask=mask.astype(np.float32),
            old_logprobs=np.full((batch, T), -7.0, np.float32),
            advantages=rng.standard_normal((batch, T)).astype(np.float32),
            returns=np.zeros((batch, T), np.float32),
            turn_ids=np.where(mask > 0, 0, -1).astype(np.int32),
        ), int(seg.sum())

    # Warm-up: compile every bucket once so the timed steps are steady state.
    for T in buckets:
        b, _ = make_batch()
        b = b._replace(
            **{
                k: getattr(b, k)[:, :T]
                if getattr(b, k).shape[1] >= T
                else np.pad(getattr(b, k), ((0, 0), (0, T - getattr(b, k).shape[1])))
                for k in b._fields
            }
        )
        state, m = step(state, jax.tree.map(jnp.asarray, b), LossInputs(denom=jnp.float32(1000)))
    jax.block_until_ready(state.params)
    compiles_warm = compiled()
    times, toks, real = [], [], []
    for _ in range(steps):
        b, n_real = make_batch()
        b = jax.tree.map(jnp.asarray, b)
        t = time.perf_counter()
        state, m = step(state, b, LossInputs(denom=jnp.sum(b.loss_mask)))
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t)
        toks.append(b.input_ids.size)
        real.append(n_real)
    tok_s = [n / t for n, t in zip(toks, times, strict=True)]
    P = n_params(spec)
    flops_per_tok = 6 * P  # fwd + bwd of the matmuls (attention scores not counted)
    out = {
        "model": name,
        "params": P,
        "batch": batch,
        "buckets": buckets,
        "steps": steps,
        "dtype": dtype,
        "logprob_chunk": chunk or min(buckets),
        "remat": remat,
        "tok_s": statistics.median(tok_s),
        "tok_s_p10": float(np.percentile(tok_s, 10)),
        "tok_s_p90": float(np.percentile(tok_s, 90)),
        "real_tok_s": sum(real) / sum(times),
        "step_s_median": statistics.median(times),
        "compiles": compiled(),
        "compiles_after_warmup": compiled() - compiles_warm,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
    }
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in out["device"]), None)
    if peak:
        out["mfu"] = out["tok_s"] * flops_per_tok / peak
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--model",
        choices=[*MODELS, "all"],
        default="all",
        help="'all' = tiny and 40m (CPU defaults)",
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--buckets", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quick", action="store_true", help="tiny model, 6 steps")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()
    names = ["tiny"] if args.quick else (["tiny", "40m"] if args.model == "all" else [args.model])
    steps = 6 if args.quick else args.steps
    results = []
    for name in names:
        r = bench(name, steps=steps, batch=args.batch, buckets=args.buckets, dtype=args.dtype)
        results.append(r)
        mfu = f", MFU {r['mfu']:.1%}" if "mfu" in r else ""
        print(
            f"{name:>5} ({r['params'] / 1e6:.1f}M params): {r['tok_s']:.0f} tok/s median "
            f"(p10 {r['tok_s_p10']:.0f}, p90 {r['tok_s_p90']:.0f}), {r['step_s_median']:.3f} "
            f"s/step, {r['compiles']} compiles ({r['compiles_after_warmup']} after warm-up) "
            f"over {r['steps']} steps{mfu}"
        )
    if args.json:
        head = results[0]
        print(
            json.dumps(
                {
                    "tok_s": head["tok_s"],
                    "compiles": head["compiles"],
                    "steps": head["steps"],
                    "results": results,
                    "machine": f"{platform.machine()} {os.cpu_count()} cpus",
                }
            )
        )


if __name__ == "__main__":
    main()
