"""Every benchmark in one process, one table; with ``--write`` the table in BENCHMARKS.md rewritten.

Rows compare against a side-by-side baseline measured in the same run:

* sampler throughput: ours vs transformers ``generate`` (PyTorch, same weights, same dtype);
* multi-turn: incremental prefill vs re-prefilling the whole context every turn;
* rollout: tool latency 100 ms vs 0 ms (is latency hidden by concurrency?);
* train step: tokens/s vs sequence length (and MFU vs the analytic peak on a GPU).

Scaling sections: decode throughput vs engine slots; time per turn vs turn index; rollout wall time
vs tool latency and concurrency; train-step cost vs sequence length; peak host RSS (and device
memory where the backend reports it).

    python scripts/bench_all.py --quick          # < 5 min on 2 CPU cores, printed only
    python scripts/bench_all.py --write          # the full set (~15-25 min on 2 CPU cores), and
                                                 # its table replaces BENCHMARKS.md's
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
START, END = "<!-- bench_all:start -->", "<!-- bench_all:end -->"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_mem_mb() -> float | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return peak / 2**20 if peak else None


def _row(section, config, ours, baseline, unit, *, spread="", note=""):
    ratio = ours / baseline if baseline else None
    return dict(
        section=section,
        config=config,
        ours=ours,
        baseline=baseline,
        unit=unit,
        ratio=ratio,
        spread=spread,
        note=note,
        rss_mb=round(peak_rss_mb()),
        device_mb=device_mem_mb(),
    )


def sampler_rows(quick: bool) -> list[dict]:
    import bench_sampler as bs

    rows = []
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        shape = bs.TINY if quick else bs.BIG
        name = "tiny" if quick else "40M"
        hf, ours = bs.make_pair(shape, os.path.join(tmp, "m"))
        for batch in [1, 4, 16] if not quick else [4, 16]:
            r = bs.throughput(
                hf,
                ours,
                batch=batch,
                prompt_len=64,
                new=64 if quick else 128,
                repeats=repeats,
                chunk=32,
            )
            rows.append(
                _row(
                    "sampler: decode tok/s vs slots",
                    f"{name} batch {batch}",
                    r["ours_tok_s"],
                    r["hf_tok_s"],
                    "tok/s",
                    note="baseline: transformers generate",
                )
            )
        m = bs.multi_turn(
            ours,
            sessions=8 if quick else 16,
            prompt_len=64,
            turns=4 if quick else 8,
            append=48,
            new=32,
            repeats=repeats,
            chunk=32,
        )
        # Every turn: flat with incremental prefill, growing with re-prefill.
        turns = zip(m["per_turn_s"], m["reprefill_per_turn_s"], strict=True)
        for i, (inc, full) in enumerate(turns, start=1):
            rows.append(
                _row("multi-turn: time per turn vs turn index", f"{name} turn {i}", inc, full,
                     "s", note="baseline: re-prefill the whole context")
            )  # fmt: skip
    return rows


def rollout_rows(quick: bool) -> list[dict]:
    import bench_rollout as br

    rows = []
    for episodes in [16] if quick else [16, 64]:
        engine, orch, tasks, env_cls = br.build(episodes, 4, 16)

        async def run(engine=engine, orch=orch, tasks=tasks, env_cls=env_cls):
            async with engine:
                await br._measure(engine, orch, tasks, env_cls, 0.0, 1)
                out = {}
                for lat in [0.0, 0.05, 0.1] if not quick else [0.0, 0.1]:
                    out[lat] = await br._measure(
                        engine, orch, tasks, env_cls, lat, 1 if quick else 3
                    )
                return out

        res = asyncio.run(run())
        base = statistics.median(res[0.0])
        for lat, times in res.items():
            if lat == 0.0:
                continue
            med = statistics.median(times)
            rows.append(
                _row(
                    "rollout: wall time vs tool latency",
                    f"{episodes} episodes x 4 turns, {lat * 1000:.0f} ms tools",
                    med,
                    base,
                    "s",
                    spread=f"extra {med - base:.2f} s (bound {8 * lat:.2f} s)",
                    note="baseline: 0 ms tools",
                )
            )
    return rows


def train_rows(quick: bool) -> list[dict]:
    from bench_train import bench

    rows = []
    for T in [128, 256] if quick else [128, 256, 512]:
        r = bench(
            "tiny" if quick else "40m",
            steps=3 if quick else 10,
            batch=8,
            buckets=[T],
            dtype="float32",
        )
        rows.append(
            _row(
                "train step: cost vs sequence length",
                f"{r['model']} batch 8 x {T}",
                r["tok_s"],
                None,
                "tok/s",
                spread=f"p10 {r['tok_s_p10']:.0f} / p90 {r['tok_s_p90']:.0f}",
                note=f"{r['compiles']} compiles" + (f", MFU {r['mfu']:.1%}" if "mfu" in r else ""),
            )
        )
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| section | configuration | ours | baseline | ratio | spread | note | peak RSS MB |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    fmt = lambda x: "" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['section']} | {r['config']} | {fmt(r['ours'])} {r['unit']} | "
            f"{fmt(r['baseline'])} | {fmt(r['ratio'])} | {r['spread']} | {r['note']} | "
            f"{r['rss_mb']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smallest configurations (< 5 min)")
    ap.add_argument("--write", action="store_true", help="replace BENCHMARKS.md's table (full set)")
    ap.add_argument("--only", nargs="+", choices=["sampler", "rollout", "train"])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()
    import jax

    t0 = time.time()
    sections = args.only or ["sampler", "rollout", "train"]
    fns = {"sampler": sampler_rows, "rollout": rollout_rows, "train": train_rows}
    rows = []
    for s in sections:
        rows += fns[s](args.quick)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, {jax.default_backend()} "
        f"({jax.devices()[0].device_kind}), jax {jax.__version__}"
    )
    cmd = "python scripts/bench_all.py" + (" --quick" if args.quick else "")
    text = (
        f"Machine: {machine}. Command: `{cmd}`. Date: {time.strftime('%Y-%m-%d')}. "
        f"Wall time: {time.time() - t0:.0f} s.\n\n{table(rows)}\n"
    )
    print(text)
    if args.write and args.quick:
        ap.error("--write records the full set only: a --quick table would replace it")
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        doc = path.read_text() if path.exists() else "# Benchmarks\n"
        block = f"{START}\n{text}{END}"
        if START in doc and END in doc:
            doc = doc[: doc.index(START)] + block + doc[doc.index(END) + len(END) :]
        else:
            doc = doc.rstrip() + "\n\n## All benchmarks (scripts/bench_all.py)\n\n" + block + "\n"
        path.write_text(doc)
    if args.json:
        print(json.dumps({"rows": rows, "machine": machine, "wall_s": time.time() - t0}))


if __name__ == "__main__":
    main()
