"""Where a decode step of the sampler goes, against this CPU's matmul floor for the same shapes.

The batch workload of ``scripts/bench_sampler.py`` / ``bench_peers.py`` (the 41.6M Qwen2-shaped
model, fp32, batch 16 x 64-token prompts -> 128 greedy tokens) runs once under ``jax.profiler``.
XLA:CPU records every executed op (a thunk, named after its HLO instruction); the optimized HLO
of the decode program (dumped by ``--xla_dump_to``) says what each instruction is and which line
of our code made it. The ops inside the decode programs are summed by kind per decode step:

- layer matmuls (q/k/v, o, gate/up, down) and the vocabulary head matmul;
- attention over the cache (scores, softmax, weighted values);
- KV-cache writes (the new token's K and V) and the window copy in and out of a chunk;
- sampling and log-probs (the head's logits to a token, its log-prob, the stop checks);
- the rest (norms, RoPE, activations, loop bookkeeping);

beside the decode programs' own time a step (the ops plus thunk dispatch and the loop's control)
and the step's wall time (``(t(new) - t(1)) / (new - 1)``, so the prefill cancels; the rest is
the host between chunks). The floors, timed on the same machine in the same process: one jitted
program of the step's matmuls with as many weight copies as the step reads (XLA's own rate on
exactly those shapes, the weights streaming from memory as in the step), the layers' and the
head's apart; a 2048-wide square matmul (the CPU's fp32 rate); a jitted sum over 400 MB (memory
bandwidth), for the weight bytes a step streams.

    python scripts/profile_decode.py                      # the table, and --json for one object
    python scripts/profile_decode.py --batch 16 --new-tokens 128 --json
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_sampler import BIG, TINY, make_pair, median_time  # noqa: E402  (no jax imported)

KINDS = (
    "layer matmuls",
    "vocabulary head matmul",
    "attention over the cache",
    "KV-cache writes and window copies",
    "sampling and log-probs",
    "norms, RoPE, activations, loop",
)

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+?)(?:\{[^}]*\})? (\w[\w\-]*)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_ROW = re.compile(r"^(\d+) (.*)$")


def stack_functions(text: str) -> dict[int, frozenset[str]]:
    """Each ``stack_frame_id`` of an HLO module's text -> the names of the functions on its
    stack (the module's FunctionNames / FileLocations / StackFrames tables; a frame's
    ``parent_frame_id`` is its parent's id plus one, 0 for none)."""
    tables: dict[str, dict[int, str]] = {}
    section = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section, tables[line] = line, {}
            continue
        m = _ROW.match(line) if section else None
        if not m:
            section = None if section and not line.strip() else section
            continue
        tables[section][int(m.group(1))] = m.group(2)
    names = {i: v.strip('"') for i, v in tables.get("FunctionNames", {}).items()}
    loc_fn = {
        i: names.get(int(re.search(r"function_name_id=(\d+)", v).group(1)), "")
        for i, v in tables.get("FileLocations", {}).items()
    }
    frames = {}
    for i, v in tables.get("StackFrames", {}).items():
        loc = int(re.search(r"file_location_id=(\d+)", v).group(1))
        parent = int(re.search(r"parent_frame_id=(\d+)", v).group(1)) - 1
        frames[i] = (loc_fn.get(loc, ""), parent)
    out: dict[int, frozenset[str]] = {}
    for i in frames:
        fns, j, seen = set(), i, set()
        while j in frames and j not in seen:
            seen.add(j)
            fns.add(frames[j][0])
            j = frames[j][1]
        out[i] = frozenset(fns)
    return out


def parse_hlo(text: str) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """``(instructions, computations)`` of an optimized HLO module's text: every instruction's
    name -> {op, shape, calls, functions (the Python functions on the stack that made it),
    text}, and each computation's instructions."""
    stacks = stack_functions(text)
    instrs: dict[str, dict] = {}
    comps: dict[str, list[dict]] = collections.defaultdict(list)
    current = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:
            current = m.group(1)
            continue
        m = _INSTR.match(line)
        if not m or current is None:
            continue
        name, shape, op, rest = m.groups()
        calls = re.search(r"calls=%?([\w.\-]+)", rest)
        frame = re.search(r"stack_frame_id=(\d+)", rest)
        ins = {
            "name": name,
            "op": op,
            "shape": shape,
            "calls": calls.group(1) if calls else None,
            "functions": stacks.get(int(frame.group(1)), frozenset()) if frame else frozenset(),
            "text": rest,
        }
        instrs[name] = ins
        comps[current].append(ins)
    return instrs, comps


def dims(shape: str) -> list[int]:
    """``f32[16,1,512]{2,1,0}`` -> [16, 1, 512]."""
    m = re.search(r"\[([\d,]*)\]", shape)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


def members(ins: dict, comps: dict[str, list[dict]]) -> list[dict]:
    """The instruction and, for a fusion, every instruction of its fused computation (nested)."""
    out, todo = [ins], [ins.get("calls")]
    while todo:
        c = todo.pop()
        for m in comps.get(c, []) if c else []:
            out.append(m)
            if m["op"] == "fusion":
                todo.append(m["calls"])
    return out


ATTENTION = {"gqa_attention", "_attend", "ragged_decode_attention"}
WRITES = {"forward_unrolled.<locals>.write", "mask_and_writes", "_cut_window", "_put_window"}
SAMPLING = {"sample", "_ends_with_any", "_finish_reason", "filter_logits", "inverse_cdf_sample"}


def classify(ins: dict, comps: dict[str, list[dict]]) -> str | None:
    """The kind of an executed instruction, from the functions that made it and its members
    (None: control flow, whose body ops are counted themselves)."""
    if ins["op"] in ("while", "conditional", "call", "parameter", "tuple", "constant"):
        return None
    ms = members(ins, comps)
    fns = frozenset().union(*(m["functions"] for m in ms))
    if any(m["op"] in ("dot", "convolution") for m in ms):
        if "logits_unrolled" in fns:
            return "vocabulary head matmul"
        if fns & ATTENTION and not fns & {"_qkv", "_mlp"}:
            return "attention over the cache"
        return "layer matmuls"
    if fns & ATTENTION:
        return "attention over the cache"
    if fns & WRITES:
        return "KV-cache writes and window copies"
    if fns & SAMPLING or any(f.startswith("sample.") for f in fns):
        return "sampling and log-probs"
    return "norms, RoPE, activations, loop"


def trace_events(folder: str) -> list[dict]:
    (path,) = glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True)
    data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def floors(
    dots: dict[tuple[int, int, int], int], vocab: int, square: int = 2048, sum_mb: int = 400
) -> dict:
    """XLA's time for the step's matmuls alone, one jitted program of every (M, K, N) dot with
    its own weights (as many copies as the step has, so the weights stream from memory as in
    the step), the layers' and the head's apart; the CPU's fp32 rate on a large square matmul
    and the memory bandwidth of a jitted sum."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)

    def program(shapes):
        xs = [jnp.asarray(rng.standard_normal((m, k)), jnp.float32) for m, k, _ in shapes]
        ws = [jnp.asarray(rng.standard_normal((k, n)), jnp.float32) for _, k, n in shapes]
        f = jax.jit(lambda xs, ws: [x @ w for x, w in zip(xs, ws, strict=True)])
        return median_time(lambda: jax.block_until_ready(f(xs, ws)), 50)

    layers = [s for s, c in sorted(dots.items()) for _ in range(c) if s[2] != vocab]
    head = [s for s, c in sorted(dots.items()) for _ in range(c) if s[2] == vocab]
    f = jax.jit(lambda x, w: x @ w)
    big = jnp.ones((square, square), jnp.float32)
    t_big = median_time(lambda: f(big, big).block_until_ready(), 5)
    buf = jnp.ones((sum_mb * 2**18,), jnp.float32)
    s = jax.jit(jnp.sum)
    t_sum = median_time(lambda: s(buf).block_until_ready(), 5)
    return {
        "layers_s": program(layers) if layers else 0.0,
        "head_s": program(head) if head else 0.0,
        "peak_gflops": 2 * square**3 / t_big / 1e9,
        "bandwidth_gbs": buf.nbytes / t_sum / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--decode-chunk", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="wall-time runs (medians)")
    ap.add_argument(
        "--model", choices=("40m", "tiny"), default="40m", help="tiny: the demo's shape (tests)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()

    dump_dir = tempfile.TemporaryDirectory(prefix="hlo_")  # removed at the end, as the trace
    dump = dump_dir.name
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
    ).strip()
    import jax
    import numpy as np

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        shape = BIG if args.model == "40m" else TINY
        hf, ours = make_pair(shape, os.path.join(tmp, "model"))
        n_params = sum(p.numel() for p in hf.parameters())
        del hf
    B, P, N = args.batch, args.prompt_len, args.new_tokens
    engine = Engine(
        ours,
        EngineConfig(
            max_slots=B, max_seq_len=P + N, prefill_buckets=(P,), decode_chunk=args.decode_chunk
        ),
    )
    prompts = np.random.default_rng(0).integers(0, shape["vocab_size"], (B, P)).tolist()

    def run(new):
        return engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_new_tokens=new))

    t_full = median_time(lambda: run(N), args.repeats)
    t_one = median_time(lambda: run(1), args.repeats)
    step_s = (t_full - t_one) / (N - 1)

    with tempfile.TemporaryDirectory(prefix="trace_") as prof:
        with jax.profiler.trace(prof, create_perfetto_trace=True):
            t0 = time.perf_counter()
            run(N)
            traced_s = time.perf_counter() - t0
        events = trace_events(prof)

    # every program's optimized HLO; the decode programs' (one per attention window used) say
    # what each op is
    parsed = {
        p: parse_hlo(Path(p).read_text())
        for p in sorted(glob.glob(os.path.join(dump, "*after_optimizations.txt")))
    }
    decode_mods = [p for p in parsed if ".jit_decode." in os.path.basename(p)]
    instrs: dict[str, dict] = {}
    comps: dict[str, list[dict]] = {}
    for p in decode_mods:
        instrs.update(parsed[p][0])
        comps.update(parsed[p][1])
    others = set().union(*(set(parsed[p][0]) for p in parsed if p not in decode_mods))
    only_decode = set(instrs) - others
    # A program's ops run inside one top-level ThunkExecutor::Execute (dispatch is asynchronous,
    # so the Python-side call spans say nothing): an execution is a decode program's when it
    # ran ops that only the decode programs have.
    runs = sorted(
        (e["ts"], e["ts"] + e["dur"], e["tid"])
        for e in events
        if e["name"] == "ThunkExecutor::Execute"
    )
    tops = [
        r for r in runs if not any(o[2] == r[2] and o[0] <= r[0] and r[1] <= o[1] and o != r
                                   for o in runs)
    ]  # fmt: skip
    leaf = [e for e in events if e["name"] in instrs or e["name"] in others]
    decode_ops, program_s = [], 0.0
    for a_, b_, _ in tops:
        inside = [e for e in leaf if a_ <= e["ts"] <= b_]
        if any(e["name"] in only_decode for e in inside):
            decode_ops += [e for e in inside if e["name"] in instrs]
            program_s += (b_ - a_) / 1e6

    totals: collections.Counter = collections.Counter()
    head_calls = 0
    dot_shapes: collections.Counter = collections.Counter()
    kinds = {name: classify(instrs[name], comps) for name in {e["name"] for e in decode_ops}}
    for e in decode_ops:
        kind = kinds[e["name"]]
        if kind is None:
            continue
        totals[kind] += e["dur"] / 1e6
        if kind == "vocabulary head matmul":
            head_calls += 1
    steps = head_calls or (N - 1)
    # the matmul shapes of one decode step: each dot of one decode module (the modules differ
    # only in the attention window), as [M, K] x [K, N]; attention's batched dots excluded
    one = parsed[decode_mods[0]][0] if decode_mods else {}
    for ins in one.values():
        if ins["op"] != "dot" or "lhs_batch_dims" in ins["text"]:
            continue
        lhs = re.match(r"%?([\w.\-]+)", ins["text"].strip())
        lhs_shape = dims(one[lhs.group(1)]["shape"]) if lhs and lhs.group(1) in one else None
        contract = re.search(r"lhs_contracting_dims=\{([\d,]+)\}", ins["text"])
        if not lhs_shape or not contract:
            continue
        k = math.prod(lhs_shape[int(i)] for i in contract.group(1).split(","))
        m = math.prod(lhs_shape) // k
        dot_shapes[(m, k, math.prod(dims(ins["shape"])) // m)] += 1
    small = args.model == "tiny"
    fl = floors(dict(dot_shapes), shape["vocab_size"], 512 if small else 2048, 16 if small else 400)
    flops = sum(2 * m * k * n * c for (m, k, n), c in dot_shapes.items())
    weight_bytes = 4 * n_params
    per_step = {k: totals[k] / steps for k in KINDS}
    in_ops = sum(per_step.values())
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus ({platform.processor() or '?'})",
        "jax": jax.__version__,
        "params_M": round(n_params / 1e6, 1),
        "batch": B,
        "prompt_len": P,
        "new_tokens": N,
        "tok_s": B * N / t_full,
        "step_ms": 1e3 * step_s,
        "traced_run_s": traced_s,
        "decode_steps_traced": steps,
        "per_step_ms": {k: 1e3 * v for k, v in per_step.items()},
        "program_ms": 1e3 * program_s / steps,
        "in_ops_ms": 1e3 * in_ops,
        "floor_layer_matmuls_ms": 1e3 * fl["layers_s"],
        "floor_head_ms": 1e3 * fl["head_s"],
        "step_flops_G": flops / 1e9,
        "peak_gflops": fl["peak_gflops"],
        "floor_at_peak_ms": 1e3 * flops / (fl["peak_gflops"] * 1e9),
        "bandwidth_gbs": fl["bandwidth_gbs"],
        "floor_weight_stream_ms": 1e3 * weight_bytes / (fl["bandwidth_gbs"] * 1e9),
        "matmul_shapes": {f"{m}x{k}x{n}": c for (m, k, n), c in sorted(dot_shapes.items())},
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"{result['machine']}, jax {result['jax']}; {result['params_M']}M params, batch {B}")
    print(f"decode step {result['step_ms']:.2f} ms ({result['tok_s']:.0f} tok/s end to end)")
    for k in KINDS:
        print(f"  {k:<36} {result['per_step_ms'][k]:7.2f} ms")
    print(
        f"  ops {result['in_ops_ms']:.2f} ms of the traced decode programs' "
        f"{result['program_ms']:.2f} ms a step (the rest: thunk dispatch, the loop's control)"
    )
    print(
        f"floors: the layer matmuls alone {result['floor_layer_matmuls_ms']:.2f} ms, the head "
        f"alone {result['floor_head_ms']:.2f} ms; {result['step_flops_G']:.2f} GFLOP at the "
        f"{result['peak_gflops']:.0f} GFLOP/s of a square matmul: "
        f"{result['floor_at_peak_ms']:.2f} ms; weights {weight_bytes / 1e6:.0f} MB at "
        f"{result['bandwidth_gbs']:.1f} GB/s: "
        f"{result['floor_weight_stream_ms']:.2f} ms"
    )
    if args.json:
        print(json.dumps(result))
    dump_dir.cleanup()  # last: XLA dumps every program it compiles (the floors' too)


if __name__ == "__main__":
    main()
