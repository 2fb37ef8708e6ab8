"""One-shot GPU benchmark (run by ``scripts/gpu_check.sh``): decode throughput vs the HBM
roofline and vs transformers ``generate`` on the same GPU and weights, and train-step MFU.

No network and no Hydra: imports only jax, flax, optax, numpy, torch, transformers and this repo
(``PYTHONPATH=.``). Models are random Qwen2-shaped checkpoints (0.5B and ~1.5B shapes) created with
transformers, saved to a temp folder and loaded into ours, so both sides run identical bf16 weights.

    python scripts/bench_gpu.py --out gpu_results.json [--quick] [--only smoke|decode|train]
    python scripts/bench_gpu.py --render benchmarks/gpu_*.json  # rewrite the GPU tables

Every section runs under its own try/except and the JSON is rewritten after every row, so a
failure or a timeout still leaves everything measured so far (with the error) in the file.
``--only smoke`` runs a tiny model end to end (load, greedy decode vs transformers, two train
steps) in seconds: ``gpu_check.sh`` uses it to choose between the image's flax and a carried one.

Roofline: a decode step must stream every parameter byte and the live KV cache from HBM, so
``tok/s <= batch * BW / (param_bytes + kv_bytes)`` with BW = 4.8 TB/s (H200).
MFU: ``6 * params * tokens/s / 989e12`` (dense bf16 peak of H100/H200; attention FLOPs not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

HBM_BW = 4.8e12
from bench_train import MODELS  # noqa: E402  (the shared model shapes)

SHAPES = {k: dict(MODELS[k], tie_word_embeddings=True) for k in ("tiny", "0.5b", "1.5b")}


class Results:
    """The JSON being built; written to disk after every change."""

    def __init__(self, path: str, **head):
        self.path = Path(path)
        self.data = dict(head, smoke=[], decode=[], train=[], errors=[])
        self.save()

    def add(self, section: str, row: dict) -> None:
        print(json.dumps(row), flush=True)
        self.data[section].append(row)
        self.save()

    def error(self, where: str) -> None:
        tb = traceback.format_exc()
        print(f"[{where}] FAILED\n{tb}", flush=True)
        self.data["errors"].append({"where": where, "traceback": tb[-4000:]})
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2))


def _device(obj):
    return obj.cuda() if _cuda() else obj


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if _cuda():
        torch.cuda.synchronize()


def _pair(shape: dict, folder: str, dtype: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jaxrl_agents.models.hf_io import load_pretrained

    torch.manual_seed(0)
    tdtype = getattr(torch, dtype)
    hf = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=4096, **shape)).to(tdtype)
    hf.save_pretrained(folder)
    ours, _ = load_pretrained(folder, tokenizer=False, dtype=dtype, param_dtype=dtype)
    return _device(hf).eval(), ours


def _kv_bytes(shape: dict, batch: int, ctx: int, itemsize: int = 2) -> float:
    hd = shape["hidden_size"] // shape["num_attention_heads"]
    return (
        2 * shape["num_hidden_layers"] * batch * ctx * shape["num_key_value_heads"] * hd * itemsize
    )


def _peak_device_bytes() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _median_time(fn, repeats: int) -> tuple[float, float, float, object]:
    """(median, min, max) seconds of ``fn()`` over ``repeats`` runs, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times), out


def _hf_side(hf, prompts, res_ours, new: int, repeats: int) -> dict:
    """transformers generate on the same prompts (tok/s, median and range), greedy agreement
    and our per-token logprobs vs transformers' teacher-forced forward over our tokens."""
    import numpy as np
    import torch

    prompt = len(prompts[0])
    ids = _device(torch.tensor(prompts))
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    with torch.no_grad():
        hf.generate(ids, **kw)  # warm-up
        med, lo, hi, out = _median_time(
            lambda m=hf, x=ids, k=kw: m.generate(x, **k), max(1, repeats - 1)
        )
    hf_rows = out[:, prompt:].tolist()
    n_tok = len(hf_rows[0]) * len(prompts)
    seqs = torch.tensor([p + r.token_ids for p, r in zip(prompts, res_ours, strict=True)])
    with torch.no_grad():
        lp = torch.log_softmax(hf(_device(seqs)).logits[:, prompt - 1 : -1].float(), -1)
    hf_lp = lp.gather(-1, _device(seqs[:, prompt:, None]))[..., 0].cpu().numpy()
    lp_diff = np.abs(hf_lp - np.array([r.logprobs for r in res_ours]))
    k = min(16, new)  # greedy agreement on the first 16 tokens (bf16 near-ties can diverge)
    pairs = zip(res_ours, hf_rows, strict=True)
    return dict(
        hf_tok_s=n_tok / med,
        hf_tok_s_min=n_tok / hi,
        hf_tok_s_max=n_tok / lo,
        greedy_prefix16_agree=float(np.mean([r.token_ids[:k] == h[:k] for r, h in pairs])),
        logprob_abs_diff_vs_hf_median=float(np.median(lp_diff)),
        logprob_abs_diff_vs_hf_max=float(lp_diff.max()),
    )


def decode_bench(
    res: Results,
    name: str,
    batches: list[int],
    *,
    prompt: int,
    new: int,
    repeats: int,
    section: str = "decode",
    dtype: str = "bfloat16",
    unroll: bool | None = None,
    with_hf: bool = True,
    decode_attention: str = "reference",
) -> None:
    import numpy as np
    import torch

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    shape = SHAPES[name]
    with tempfile.TemporaryDirectory() as d:
        hf, ours = _pair(shape, d, dtype)
        ours.cfg = ours.cfg.replace(decode_attention=decode_attention)
        params = sum(p.numel() for p in hf.parameters())
        itemsize = 2 if dtype == "bfloat16" else 4
        for b in batches:
            try:
                rng = np.random.default_rng(0)
                prompts = rng.integers(10, shape["vocab_size"] - 10, (b, prompt)).tolist()
                engine = Engine(
                    ours,
                    EngineConfig(
                        max_slots=b,
                        max_seq_len=prompt + new + 8,
                        prefill_buckets=(prompt,),
                        decode_chunk=64,
                        unroll_layers=unroll,
                    ),
                )
                sp = SamplingParams(temperature=0.0, max_new_tokens=new)
                t = time.perf_counter()
                engine.generate_batch(prompts, sp)  # compile
                first_s = time.perf_counter() - t
                med, lo, hi, res_ours = _median_time(
                    lambda e=engine, p=prompts, s=sp: e.generate_batch(p, s), repeats
                )
                n_tok = sum(len(r.token_ids) for r in res_ours)
                hf_stats = _hf_side(hf, prompts, res_ours, new, repeats) if with_hf else {}
                roof = (
                    b
                    * HBM_BW
                    / (itemsize * params + _kv_bytes(shape, b, prompt + new // 2, itemsize))
                )
                row = dict(
                    model=name,
                    params=params,
                    dtype=dtype,
                    batch=b,
                    prompt=prompt,
                    new_tokens=new,
                    ours_tok_s=n_tok / med,
                    ours_tok_s_min=n_tok / hi,
                    ours_tok_s_max=n_tok / lo,
                    roofline_tok_s=roof,
                    first_call_s=first_s,
                    compiles=engine.compile_count,
                    unrolled=engine.unrolled,
                    decode_attention=decode_attention,
                    xla_flags=os.environ.get("XLA_FLAGS", ""),
                    repeats=repeats,
                    **hf_stats,
                    jax_peak_bytes=_peak_device_bytes(),
                    torch_peak_bytes=torch.cuda.max_memory_allocated() if _cuda() else None,
                )
                row["roofline_frac"] = row["ours_tok_s"] / roof
                if with_hf:
                    row["ratio_vs_hf"] = row["ours_tok_s"] / row["hf_tok_s"]
                    row["hf_roofline_frac"] = row["hf_tok_s"] / roof
                res.add(section, row)
                del engine
            except Exception:
                res.error(f"{section} {name} batch={b}")
        del hf, ours
        if _cuda():
            torch.cuda.empty_cache()


def train_bench(
    res: Results, name: str, *, steps: int, batch: int, seq: int, remat: bool, section="train",
    attention: str = "auto",
):  # fmt: skip
    from bench_train import bench

    try:
        r = bench(
            name,
            steps=steps,
            batch=batch,
            buckets=[seq],
            dtype="bfloat16",
            chunk=min(seq, 256),
            remat=remat,
            attention=attention,
        )
        r["jax_peak_bytes"] = _peak_device_bytes()
        r["xla_flags"] = os.environ.get("XLA_FLAGS", "")
        res.add(section, r)
    except Exception:
        res.error(f"{section} {name} seq={seq} remat={remat} attention={attention}")


GPU_START, GPU_END = "<!-- gpu:start -->", "<!-- gpu:end -->"


def _command_buffers(flags: str) -> str:
    """A row label's note on XLA's command buffers (CUDA graphs) when the row's XLA_FLAGS set
    them (``scripts/gpu_check.sh``'s graphs phase), else nothing (XLA's default)."""
    for flag in flags.split():
        if flag.startswith("--xla_gpu_enable_command_buffer="):
            kinds = flag.split("=", 1)[1]
            return f" cmd-buffers {'off' if not kinds else kinds.lower().replace(',', '+')}"
    return ""


def render(files: list[str]) -> str:
    """Markdown tables of the decode and train rows of result files (as written by this script)."""
    dec, train, heads = [], [], []
    for i, f in enumerate(files, 1):
        data = json.loads(Path(f).read_text())
        v = data["versions"]
        heads.append(
            f"[{i}] `{Path(f).name}`: {data['device']}, jax {v['jax']}, flax {v['flax']}, torch "
            f"{v['torch']}, transformers {v['transformers']}; `{data['command']}`; {data['date']}"
        )
        dec += [dict(r, run=i) for r in data["decode"]]
        train += [dict(r, run=i) for r in data["train"]]
    out = ["Result files (machine, versions, command, date):", ""]
    out += [f"- {h}" for h in heads]
    if dec:
        out += [
            "",
            "Decode (bf16, greedy, 128-token prompts, 128 new tokens; ours = median of repeats, "
            "range in brackets):",
            "",
            "| run | model | batch | ours tok/s | transformers tok/s | ours / HF | roofline tok/s "
            "| ours / roofline | HF / roofline | logprob diff vs HF (median / max) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in dec:
            hf = "hf_tok_s" in r
            lp = (
                f"{r['logprob_abs_diff_vs_hf_median']:.3f} / {r['logprob_abs_diff_vs_hf_max']:.3f}"
                if "logprob_abs_diff_vs_hf_median" in r
                else "-"
            )
            layers = " unrolled" if r.get("unrolled") else ""
            layers += " pallas" if r.get("decode_attention") == "pallas" else ""
            layers += _command_buffers(r.get("xla_flags", ""))
            hf_cols = (
                f"{r['hf_tok_s']:.0f} | {r['ratio_vs_hf']:.2f}x" if hf else "- | -",
                f"{r['hf_roofline_frac']:.1%}" if hf else "-",
            )
            out.append(
                f"| [{r['run']}] | {r['model']} ({r['params'] / 1e9:.2f}B){layers} | {r['batch']} "
                f"| {r['ours_tok_s']:.0f} ({r['ours_tok_s_min']:.0f}-{r['ours_tok_s_max']:.0f}) "
                f"| {hf_cols[0]} | {r['roofline_tok_s']:.0f} | {r['roofline_frac']:.1%} "
                f"| {hf_cols[1]} | {lp} |"
            )
    if train:
        out += [
            "",
            "Train step (bf16 compute, fp32 params + AdamW, PPO-clip, 16k tokens per step, "
            "logprobs in 256-position chunks; MFU = 6 N tok/s / 989 TFLOP/s):",
            "",
            "| run | model | batch x seq | remat | attention | tok/s median (p10 / p90) | s/step "
            "| MFU | peak device GB | compiles |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in train:
            peak = f"{r['jax_peak_bytes'] / 1e9:.1f}" if r.get("jax_peak_bytes") else "-"
            out.append(
                f"| [{r['run']}] | {r['model']} | {r['batch']} x {r['buckets'][0]} "
                f"| {r.get('remat', False)} | {r.get('attention_kernel', '-')} "
                f"| {r['tok_s']:.0f} ({r['tok_s_p10']:.0f} / {r['tok_s_p90']:.0f}) "
                f"| {r['step_s_median']:.3f} | {r.get('mfu', 0):.1%} | {peak} | {r['compiles']} |"
            )
    return "\n".join(out)


def write_benchmarks_md(table: str, path: Path) -> None:
    text = path.read_text()
    if GPU_START not in text or GPU_END not in text:
        raise SystemExit(f"{path} has no {GPU_START} ... {GPU_END} block to rewrite")
    head, rest = text.split(GPU_START, 1)
    _, tail = rest.split(GPU_END, 1)
    path.write_text(f"{head}{GPU_START}\n{table}\n{GPU_END}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="gpu_results.json")
    ap.add_argument("--quick", action="store_true", help="0.5B only, batches 1 and 64")
    ap.add_argument("--only", choices=["smoke", "decode", "train"], default=None)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--unroll",
        choices=["auto", "true", "false", "both"],
        default="auto",
        help="EngineConfig.unroll_layers for the decode rows (both: one row each)",
    )
    ap.add_argument(
        "--decode-attention",
        choices=["reference", "pallas", "both"],
        default="reference",
        help="ModelConfig.decode_attention of the decode rows (both: one row each)",
    )
    ap.add_argument(
        "--train-attention",
        choices=["auto", "reference", "fused", "both"],
        default="auto",
        help="ModelConfig.attention of the train rows (auto: cuDNN fused on GPU; both: reference "
        "and fused, one row each)",
    )
    ap.add_argument(
        "--train-plan",
        nargs="+",
        metavar="MODEL:SEQ",
        help="train rows as model:sequence pairs, 16384 tokens a step (default 0.5b:512 "
        "0.5b:2048 1.5b:1024, and 1.5b:2048 with --remat)",
    )
    ap.add_argument("--models", nargs="+", choices=sorted(SHAPES), help="decode models")
    ap.add_argument("--batches", type=int, nargs="+", help="decode batch sizes (default 1 64 256)")
    ap.add_argument("--skip-hf", action="store_true", help="decode rows without transformers")
    ap.add_argument(
        "--remat",
        action="store_true",
        help="train with per-layer rematerialisation (long sequences fit: scores are recomputed)",
    )
    ap.add_argument(
        "--render",
        nargs="+",
        metavar="JSON",
        help="print the tables of these result files and rewrite BENCHMARKS.md's GPU block",
    )
    ap.add_argument(
        "--benchmarks-md",
        default=str(Path(__file__).resolve().parents[1] / "BENCHMARKS.md"),
        help="file whose GPU block --render rewrites",
    )
    args = ap.parse_args()
    if args.render:
        table = render(args.render)
        print(table)
        write_benchmarks_md(table, Path(args.benchmarks_md))
        return
    import flax
    import jax
    import torch
    import transformers

    res = Results(
        args.out,
        device=str(jax.devices()[0].device_kind),
        backend=jax.default_backend(),
        versions=dict(
            jax=jax.__version__,
            flax=flax.__version__,
            torch=torch.__version__,
            transformers=transformers.__version__,
            python=sys.version.split()[0],
        ),
        command=" ".join(sys.argv),
        date=time.strftime("%Y-%m-%d"),
        hbm_bw=HBM_BW,
    )
    t0 = time.time()
    sections = [args.only] if args.only else ["smoke", "decode", "train"]
    if "smoke" in sections:
        # tiny model end to end: load + greedy decode vs transformers + two train steps
        decode_bench(res, "tiny", [4], prompt=16, new=16, repeats=1, section="smoke")
        train_bench(res, "tiny", steps=2, batch=4, seq=128, remat=args.remat, section="smoke")
        if res.data["errors"]:
            res.data["wall_s"] = time.time() - t0
            res.save()
            sys.exit(3)  # gpu_check.sh retries with the carried flax wheel
    names = args.models or (["0.5b"] if args.quick else ["0.5b", "1.5b"])
    batches = args.batches or ([1, 64] if args.quick else [1, 64, 256])
    if "decode" in sections:
        unrolls = {"auto": [None], "true": [True], "false": [False], "both": [False, True]}
        kernels = ["reference", "pallas"] if args.decode_attention == "both" else [
            args.decode_attention]  # fmt: skip
        for name in names:
            for unroll in unrolls[args.unroll]:
                for kernel in kernels:
                    decode_bench(
                        res,
                        name,
                        batches,
                        prompt=args.prompt,
                        new=args.new,
                        repeats=args.repeats,
                        unroll=unroll,
                        with_hf=not args.skip_hf,
                        decode_attention=kernel,
                    )
    if "train" in sections:
        # 16k tokens per step; sequence-length scaling on the 0.5B shape
        plan = [("0.5b", 1024)] if args.quick else [("0.5b", 512), ("0.5b", 2048), ("1.5b", 1024)]
        if args.remat and not args.quick:
            plan.append(("1.5b", 2048))
        if args.train_plan:
            plan = [(p.split(":")[0], int(p.split(":")[1])) for p in args.train_plan]
        kinds = ["reference", "fused"] if args.train_attention == "both" else [
            args.train_attention]  # fmt: skip
        for name, seq in plan:
            for kind in kinds:
                train_bench(
                    res,
                    name,
                    steps=5 if args.quick else 6,
                    batch=16384 // seq,
                    seq=seq,
                    remat=args.remat,
                    attention=kind,
                )
    res.data["wall_s"] = time.time() - t0
    res.save()
    print(f"wrote {args.out} ({len(res.data['errors'])} errors)")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
    main()
