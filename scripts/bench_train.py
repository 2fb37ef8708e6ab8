"""Train-step benchmark: packed vs one-trajectory-per-row batches, real-token throughput.

Runs the real jitted RL train step (chunked logprobs + PPO-clip, AdamW, clipping, non-finite
guard) on the same trajectories packed two ways by ``rollout.packing``: one trajectory per row
(padded to the smallest bucket holding the longest) and packed rows (first-fit decreasing, the
plan of ``plan_rows``), side by side in one run, the two layouts alternating step by step. Three
length mixes:

* ``demo``: the demo RL step's episodes: the calculator env's scripted oracle through the real
  rollout path (shipped tokenizer and chat template, 8 tasks x 8 samples per step, the demo's
  length buckets), so the lengths, prompts, tool replies and loss masks are the demo's.
* ``demo+512``: the same episodes with one more length bucket, 512, that only packed rows use
  (one trajectory per row still pads to the smallest bucket holding the longest): the demo's
  largest bucket, 384, holds two of its ~170-token episodes or three of its ~125-token ones, so
  rows of 384 are at best ~86% full; 512 holds three or four.
* ``synthetic``: ``--batch`` trajectories a step with lengths uniform in ``--mix`` (default
  64-1024 tokens), the loss on everything after a 16-token prompt.

    python scripts/bench_train.py                    # tiny model, both mixes, 10 steps each
    python scripts/bench_train.py --model 40m --batch 16 --steps 4 --json
    python scripts/bench_train.py --quick            # tiny model, 3 steps, small mixes (smoke)

Reported per layout: ``tok_s`` counts every computed position (R x T per step, the work the
accelerator does), ``real_tok_s`` only trajectory tokens, ``real_frac`` = real tokens / computed
positions. With ``--json`` the last line is one JSON object: ``real_frac`` / ``real_tok_s`` of the
packed layout on the synthetic mix (the headline), ``speedup`` (packed / unpacked real tok/s),
and every mix x layout under ``packing``. :func:`bench` (``scripts/bench_all.py``'s train rows)
is the cost of one fixed-length bucket on random one-per-row batches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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


# -- length mixes -------------------------------------------------------------------------------


class _Row:
    """The Trajectory fields ``pack`` reads (synthetic trajectories)."""

    def __init__(self, ids, mask, lps, group):
        self.token_ids, self.loss_mask, self.logprobs = ids, mask, lps
        self.turns: list = []
        self.reward, self.group_id = 0.0, group


def synthetic_steps(steps: int, batch: int, lo: int, hi: int, vocab: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        step = []
        for i, n in enumerate(rng.integers(lo, hi + 1, batch)):
            n = int(n)
            ids = rng.integers(1, vocab, n).tolist()
            mask = [0] * min(16, n - 1) + [1] * (n - min(16, n - 1))
            step.append(_Row(ids, mask, [-7.0 * m for m in mask], i // 8))
        out.append(step)
    return out


def demo_steps(steps: int, tasks: int, group: int, seed: int = 0):
    """``steps`` x ``tasks x group`` oracle episodes of the demo config through the rollout path,
    and the demo's length buckets."""
    import asyncio

    import numpy as np

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.build import build_chat, resolve_env
    from jaxrl_agents.jobs.system import seq_buckets
    from jaxrl_agents.rollout import Collector, ScriptedEngine

    cfg = to_run_config(compose("config", []))
    env = resolve_env(cfg.env)
    chat = build_chat(cfg.chat)
    oracle = env.oracle(cfg.env.oracle, rng=np.random.default_rng(seed))
    engine = ScriptedEngine(chat, policy_factory=oracle)
    orch = Collector(chat=chat, env_factory=env.factory, rollout=cfg.rollout).orchestrator(
        engine, greedy=True, group_size=group
    )
    out = []
    for s in range(steps):
        batch = env.tasks("train", tasks, seed=seed * 1000 + s)
        out.append(asyncio.run(orch.run(batch, group_size=group, seed=s)))
    return out, seq_buckets(cfg.trainer, cfg.rollout), len(chat.tokenizer)


# -- the benchmark ------------------------------------------------------------------------------


def _setup(spec: dict, *, dtype: str, remat: bool, seed: int, attention: str = "auto"):
    """A fresh Qwen2-shaped model of ``spec``: ``(cfg, graphdef, rest, tx, train state)``;
    ``attention``: ``ModelConfig.attention`` (auto: fused on GPU, the reference einsums on CPU)."""
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.training.step import OptimizerConfig, init_train_state

    cfg = ModelConfig.from_hf_config(
        dict(model_type="qwen2", tie_word_embeddings=True, max_position_embeddings=4096, **spec)
    )
    if dtype != "float32":
        cfg = cfg.replace(dtype=dtype)
    if remat:
        cfg = cfg.replace(remat=True)
    cfg = cfg.replace(attention=attention)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-5, warmup_steps=1).build()
    return cfg, graphdef, rest, tx, init_train_state(params, tx)


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
    attention: str = "auto",
):
    """Cost vs sequence length (``scripts/bench_all.py``): random one-per-row batches of
    lengths drawn from ``[min(buckets) / 2, max(buckets))``, every position counted.
    ``attention``: ``ModelConfig.attention`` (the row records which kernel it resolved to)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_agents.algos import LossConfig
    from jaxrl_agents.batches import TrainBatch
    from jaxrl_agents.rollout.packing import bucket_for
    from jaxrl_agents.training.objectives import rl_loss
    from jaxrl_agents.training.step import (
        LossInputs,
        make_train_step,
    )

    spec = MODELS[name]
    from jaxrl_agents.models.decoder import fused_attention

    cfg, graphdef, rest, tx, state = _setup(
        spec, dtype=dtype, remat=remat, seed=seed, attention=attention
    )
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
        "attention": attention,
        "attention_kernel": fused_attention(cfg) or "reference",
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


def bench_packing(
    name: str,
    *,
    steps: int,
    batch: int,
    buckets: list[int],
    mix: tuple[int, int],
    demo: tuple[int, int],
    demo_extra: int,
    dtype: str,
    seed: int = 0,
    chunk: int | None = None,
    remat: bool = False,
) -> dict:
    """The packed vs one-per-row comparison on the demo-like and synthetic mixes (``main``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_agents.algos import LossConfig
    from jaxrl_agents.rollout.packing import pack, plan_rows
    from jaxrl_agents.training.objectives import rl_loss
    from jaxrl_agents.training.step import (
        LossInputs,
        make_train_step,
    )

    spec = dict(MODELS[name])
    demo_trajs, demo_buckets, demo_vocab = demo_steps(steps, *demo, seed=seed)
    spec["vocab_size"] = max(spec["vocab_size"], demo_vocab)
    cfg, graphdef, rest, tx, state = _setup(spec, dtype=dtype, remat=remat, seed=seed)
    chunk = chunk or min(math.gcd(*buckets, *demo_buckets, demo_extra), 128)  # divides every row
    step = make_train_step(
        graphdef, tx, rl_loss(LossConfig(name="ppo_clip"), chunk=chunk), rest=rest
    )
    compiled = step._cache_size  # programs in the jit cache (one per distinct batch shape)
    rng = np.random.default_rng(seed)
    lo, hi = min(mix[0], max(buckets) // 2), min(mix[1], max(buckets))
    mixes = {"demo": (demo_trajs, demo_buckets)}
    if demo_extra and demo_extra not in demo_buckets:
        mixes[f"demo+{demo_extra}"] = (demo_trajs, sorted([*demo_buckets, demo_extra]))
    mixes["synthetic"] = (synthetic_steps(steps, batch, lo, hi, spec["vocab_size"], seed), buckets)

    def device(b):
        adv = rng.standard_normal(b.loss_mask.shape).astype(np.float32) * b.loss_mask
        return jax.tree.map(jnp.asarray, b._replace(advantages=adv))

    layouts: dict[tuple[str, str], list] = {}
    for mix_name, (per_step, bk) in mixes.items():
        for layout in ("unpacked", "packed"):
            batches = []
            for trajs in per_step:
                lengths = [len(t.token_ids) - 1 for t in trajs]
                plan = None
                if layout == "packed":
                    plan = plan_rows([lengths], buckets=bk, max_rows=len(trajs))
                b = pack(trajs, buckets=bk, rows=plan).batch
                batches.append((device(b), int((b.segment_ids > 0).sum()), b.input_ids.size))
            layouts[(mix_name, layout)] = batches

    def run(b):
        st, m = step(state, b, LossInputs(denom=jnp.maximum(jnp.sum(b.loss_mask), 1.0)))
        jax.block_until_ready(m["loss"])
        return st

    # Warm-up: compile every shape the timed steps use, so they are steady state.
    seen = set()
    for batches in layouts.values():
        for b, _, _ in batches:
            if b.input_ids.shape not in seen:
                seen.add(b.input_ids.shape)
                state = run(b)
    compiles_warm = compiled()
    times: dict[tuple[str, str], list[float]] = {k: [] for k in layouts}
    for mix_name in mixes:
        for s in range(steps):
            for layout in ("unpacked", "packed"):  # alternate: both see the same machine noise
                b = layouts[(mix_name, layout)][s][0]
                t = time.perf_counter()
                state = run(b)
                times[(mix_name, layout)].append(time.perf_counter() - t)

    P = n_params(spec)
    packing: dict[str, dict] = {}
    for (mix_name, layout), batches in layouts.items():
        ts = times[(mix_name, layout)]
        real = [r for _, r, _ in batches]
        pos = [p for _, _, p in batches]
        tok_s = [p / t for p, t in zip(pos, ts, strict=True)]
        real_s = [r / t for r, t in zip(real, ts, strict=True)]
        shapes = sorted({tuple(b.input_ids.shape) for b, _, _ in batches})
        packing.setdefault(mix_name, {})[layout] = {
            "real_frac": sum(real) / sum(pos),
            "real_frac_min": min(r / p for r, p in zip(real, pos, strict=True)),
            "real_tok_s": sum(real) / sum(ts),
            "real_tok_s_median": statistics.median(real_s),
            "real_tok_s_p10": float(np.percentile(real_s, 10)),
            "real_tok_s_p90": float(np.percentile(real_s, 90)),
            "tok_s": statistics.median(tok_s),
            "step_s_median": statistics.median(ts),
            "shapes": [list(x) for x in shapes],
            "trajectories_per_step": len(mixes[mix_name][0][0]),
        }
    for mix_name, v in packing.items():
        v["speedup"] = v["packed"]["real_tok_s"] / v["unpacked"]["real_tok_s"]
        # step by step (same trajectories, run back to back): robust to a machine's load drift
        paired = [
            u / p
            for u, p in zip(times[(mix_name, "unpacked")], times[(mix_name, "packed")], strict=True)
        ]
        v["speedup_paired_median"] = statistics.median(paired)
        v["speedup_paired_p10"] = float(np.percentile(paired, 10))
        v["speedup_paired_p90"] = float(np.percentile(paired, 90))
    syn = packing["synthetic"]["packed"]
    out = {
        "model": name,
        "params": P,
        "batch": batch,
        "buckets": buckets,
        "demo_buckets": demo_buckets,
        "demo_extra_bucket": demo_extra,
        "mix": [lo, hi],
        "steps": steps,
        "dtype": dtype,
        "logprob_chunk": chunk,
        "remat": remat,
        "tok_s": syn["tok_s"],
        "real_tok_s": syn["real_tok_s"],
        "real_frac": syn["real_frac"],
        "speedup": packing["synthetic"]["speedup"],
        "packing": packing,
        "compiles": compiled(),
        "compiles_after_warmup": compiled() - compiles_warm,
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
    }
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in out["device"]), None)
    if peak:
        out["mfu"] = out["tok_s"] * 6 * P / peak  # fwd + bwd matmuls (attention not counted)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--model", choices=[*MODELS, "all"], default="tiny", help="'all' = tiny and 40m"
    )
    ap.add_argument("--steps", type=int, default=10, help="timed steps per mix and layout")
    ap.add_argument("--batch", type=int, default=64, help="trajectories per synthetic step")
    ap.add_argument(
        "--buckets",
        type=int,
        nargs="+",
        default=[128, 256, 512, 1024],
        help="length buckets of the synthetic mix",
    )
    ap.add_argument(
        "--mix",
        type=int,
        nargs=2,
        default=[64, 1024],
        metavar=("LO", "HI"),
        help="synthetic trajectory lengths, uniform (clipped to the buckets)",
    )
    ap.add_argument(
        "--demo",
        type=int,
        nargs=2,
        default=[8, 8],
        metavar=("TASKS", "GROUP"),
        help="demo-like step: tasks x samples of oracle episodes",
    )
    ap.add_argument(
        "--demo-extra-bucket",
        type=int,
        default=512,
        help="a longer row length for the demo's packed rows (0: none)",
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quick", action="store_true", help="tiny model, 3 steps, small mixes")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()
    names = ["tiny"] if args.quick else (["tiny", "40m"] if args.model == "all" else [args.model])
    steps = min(args.steps, 3) if args.quick else args.steps
    demo = (2, 4) if args.quick else tuple(args.demo)
    batch = min(args.batch, 16) if args.quick else args.batch
    buckets = sorted(args.buckets)
    if args.quick and max(buckets) > 256:
        buckets = [b for b in buckets if b <= 256] or [min(buckets)]
    results = []
    for name in names:
        r = bench_packing(
            name,
            steps=steps,
            batch=batch,
            buckets=buckets,
            mix=tuple(args.mix),
            demo=demo,
            demo_extra=0 if args.quick else args.demo_extra_bucket,
            dtype=args.dtype,
        )
        results.append(r)
        print(
            f"{name} ({r['params'] / 1e6:.1f}M params), {r['steps']} steps per mix and "
            f"layout, {r['compiles']} compiles ({r['compiles_after_warmup']} after "
            "warm-up):"
        )
        for mix_name, v in r["packing"].items():
            for layout in ("unpacked", "packed"):
                x = v[layout]
                print(
                    f"  {mix_name:>9} {layout:>8}: real_frac {x['real_frac']:.3f} "
                    f"(min {x['real_frac_min']:.3f}), real {x['real_tok_s']:.0f} tok/s "
                    f"(median {x['real_tok_s_median']:.0f}, p10 {x['real_tok_s_p10']:.0f}, "
                    f"p90 {x['real_tok_s_p90']:.0f}), all positions {x['tok_s']:.0f} tok/s, "
                    f"{x['step_s_median']:.3f} s/step, shapes {x['shapes']}"
                )
            med, p10, p90 = (v[f"speedup_paired_{k}"] for k in ("median", "p10", "p90"))
            print(
                f"  {mix_name:>9} packed / unpacked real tok/s: {v['speedup']:.2f}x "
                f"(step by step: median {med:.2f}x, p10 {p10:.2f}x, p90 {p90:.2f}x)"
            )
    if args.json:
        head = results[0]
        print(
            json.dumps(
                {
                    "tok_s": head["tok_s"],
                    "real_tok_s": head["real_tok_s"],
                    "real_frac": head["real_frac"],
                    "speedup": head["speedup"],
                    "compiles": head["compiles"],
                    "steps": head["steps"],
                    "results": results,
                    "machine": f"{platform.machine()} {os.cpu_count()} cpus",
                }
            )
        )


if __name__ == "__main__":
    main()
