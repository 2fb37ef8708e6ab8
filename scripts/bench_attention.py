#!/usr/bin/env python
"""Query-blocked causal attention vs the one ``[T, T]`` square, side by side in one run.

The cache-free forward (SFT, RL scoring and updates) attends one block of
``attention.QUERY_BLOCK`` queries at a time over the keys up to the block's end
(``attention._attend_causal_blocks``), instead of the whole square. This script times the real
jitted SFT train step of a model (chunked logprobs, AdamW, clipping) on rows of several lengths
holding the same number of tokens, with the blocks (``blocked``) and with ``QUERY_BLOCK`` raised
past the row length (``square``, the previous behaviour), the two alternating step by step. It
reports per row length the median step time of each, the spread (min-max), the ratio, and the
largest logit difference between the two programs on the same batch.

    python scripts/bench_attention.py                    # tiny model, 6144 tokens a step
    python scripts/bench_attention.py --lengths 512 1024 2048 --steps 5 --json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without an installed package
    sys.path.insert(0, str(REPO))

import bench_sampler  # noqa: E402  (scripts/ is on sys.path when a script runs)

# the demo's tiny shape (bench_sampler's), with the shipped tokenizer's vocabulary and room for
# the longest rows
TINY = {
    **bench_sampler.TINY,
    "model_type": "qwen2",
    "vocab_size": 1280,
    "max_position_embeddings": 4096,
}


def batch_of(rows: int, length: int, *, seed: int = 0):
    """``rows`` rows of ``length`` tokens, each two packed segments and a little padding."""
    import numpy as np

    from jaxrl_agents.batches import TrainBatch

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, TINY["vocab_size"], (rows, length)).astype(np.int32)
    cut, pad = length * 3 // 5, length - length // 16
    seg = np.ones((rows, length), np.int32)
    seg[:, cut:] = 2
    seg[:, pad:] = 0
    pos = np.where(np.arange(length) < cut, np.arange(length), np.arange(length) - cut)
    pos = np.tile(pos, (rows, 1)).astype(np.int32)
    f = np.zeros((rows, length), np.float32)
    return TrainBatch(
        input_ids=ids,
        positions=pos,
        segment_ids=seg,
        target_ids=np.roll(ids, -1, 1),
        loss_mask=(seg > 0).astype(np.float32),
        old_logprobs=f,
        advantages=f,
        returns=f,
        turn_ids=np.zeros((rows, length), np.int32),
    )


def bench(lengths: list[int], tokens: int, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxrl_agents.models.attention as att
    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.training.objectives import sft_loss
    from jaxrl_agents.training.step import (
        LossInputs,
        OptimizerConfig,
        init_train_state,
        make_train_step,
    )

    cfg = ModelConfig.from_hf_config(TINY).replace(attention="reference")
    graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-4).build()
    block = att.QUERY_BLOCK
    out = {}
    for length in lengths:
        batch = jax.tree.map(jnp.asarray, batch_of(max(tokens // length, 1), length))
        extra = LossInputs(denom=jnp.sum(batch.loss_mask))
        progs = {}
        for name, qb in (("blocked", block), ("square", 1 << 30)):
            att.QUERY_BLOCK = qb  # read while tracing: each program keeps its own
            step = make_train_step(graphdef, tx, sft_loss(chunk=64), rest=rest)
            state = init_train_state(jax.tree.map(jnp.copy, params), tx)
            state, m = step(state, batch, extra)  # compile
            jax.block_until_ready(m)
            fwd = jax.jit(
                lambda p, b: nnx.merge(graphdef, p, rest)(
                    b.input_ids, b.positions, segment_ids=b.segment_ids
                )[0]
            )
            progs[name] = [step, state, fwd(params, batch), []]
        att.QUERY_BLOCK = block
        for _ in range(steps):
            for p in progs.values():
                t = time.perf_counter()
                p[1], m = p[0](p[1], batch, extra)
                jax.block_until_ready(m)
                p[3].append(time.perf_counter() - t)
        valid = batch.segment_ids > 0
        gap = progs["blocked"][2] - progs["square"][2]
        diff = float(jnp.max(jnp.abs(jnp.where(valid[..., None], gap, 0))))
        row = {"rows": int(batch.input_ids.shape[0]), "length": length, "max_logit_diff": diff}
        for name, p in progs.items():
            row[f"{name}_median_s"] = statistics.median(p[3])
            row[f"{name}_spread_s"] = [min(p[3]), max(p[3])]
        row["speedup"] = row["square_median_s"] / row["blocked_median_s"]
        out[str(length)] = row
        print(
            f"T={length:5d} x {row['rows']:3d} rows: blocked {row['blocked_median_s']:.3f} s "
            f"({row['blocked_spread_s'][0]:.3f}-{row['blocked_spread_s'][1]:.3f}), square "
            f"{row['square_median_s']:.3f} s ({row['square_spread_s'][0]:.3f}-"
            f"{row['square_spread_s'][1]:.3f}), {row['speedup']:.2f}x, max |logit diff| "
            f"{diff:.1e}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--tokens", type=int, default=6144, help="tokens a step (rows x length)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per program and length")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    import jax

    rows = bench(args.lengths, args.tokens, args.steps)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": platform.processor() or platform.machine(),
                    "backend": jax.default_backend(),
                    "rows": rows,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
