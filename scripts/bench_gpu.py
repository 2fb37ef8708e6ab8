"""One-shot GPU benchmark (run by ``scripts/gpu_check.sh``): decode throughput vs the HBM
roofline and vs transformers ``generate`` on the same GPU and weights, and train-step MFU.

No network and no Hydra: imports only jax, flax, optax, numpy, torch, transformers and this repo
(``PYTHONPATH=.``). Models are random Qwen2-shaped checkpoints (0.5B and ~1.5B shapes) created with
transformers, saved to a temp folder and loaded into ours, so both sides run identical bf16 weights.

    python scripts/bench_gpu.py --out gpu_results.json [--quick]

Roofline: a decode step must stream every parameter byte and the live KV cache from HBM, so
``tok/s <= batch * BW / (param_bytes + kv_bytes)`` with BW = 4.8 TB/s (H200).
MFU: ``6 * params * tokens/s / 989e12`` (dense bf16 peak of H100/H200; attention FLOPs not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

HBM_BW = 4.8e12
from bench_train import MODELS  # noqa: E402  (the shared model shapes)

SHAPES = {k: dict(MODELS[k], tie_word_embeddings=True) for k in ("0.5b", "1.5b")}


def _pair(shape: dict, folder: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jaxrl_agents.models.hf_io import load_pretrained

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(max_position_embeddings=4096, **shape)).to(torch.bfloat16)
    hf.save_pretrained(folder)
    ours, _ = load_pretrained(folder, tokenizer=False, dtype="bfloat16", param_dtype="bfloat16")
    return hf.cuda().eval(), ours


def _kv_bytes(shape: dict, batch: int, ctx: int) -> float:
    hd = shape["hidden_size"] // shape["num_attention_heads"]
    return 2 * shape["num_hidden_layers"] * batch * ctx * shape["num_key_value_heads"] * hd * 2


def decode_bench(name: str, shape: dict, batches: list[int], *, prompt: int, new: int) -> list:
    import numpy as np
    import torch

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    rows = []
    with tempfile.TemporaryDirectory() as d:
        hf, ours = _pair(shape, d)
        params = sum(p.numel() for p in hf.parameters())
        for b in batches:
            rng = np.random.default_rng(0)
            prompts = rng.integers(10, shape["vocab_size"] - 10, (b, prompt)).tolist()
            engine = Engine(
                ours,
                EngineConfig(
                    max_slots=b,
                    max_seq_len=prompt + new + 8,
                    prefill_buckets=(prompt,),
                    decode_chunk=32,
                ),
            )
            sp = SamplingParams(temperature=0.0, max_new_tokens=new)
            engine.generate_batch(prompts, sp)  # compile
            t = time.perf_counter()
            res = engine.generate_batch(prompts, sp)
            ours_s = time.perf_counter() - t
            n_tok = sum(len(r.token_ids) for r in res)
            ids = torch.tensor(prompts, device="cuda")
            kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
            with torch.no_grad():
                hf.generate(ids, **kw)
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = hf.generate(ids, **kw)
                torch.cuda.synchronize()
                hf_s = time.perf_counter() - t
            hf_tok = (out.shape[1] - prompt) * b
            ctx = prompt + new / 2
            roof = b * HBM_BW / (2 * params + _kv_bytes(shape, b, int(ctx)))
            row = dict(
                model=name,
                params=params,
                batch=b,
                ours_tok_s=n_tok / ours_s,
                hf_tok_s=hf_tok / hf_s,
                roofline_tok_s=roof,
                compiles=engine.compile_count,
            )
            row["ratio_vs_hf"] = row["ours_tok_s"] / row["hf_tok_s"]
            row["roofline_frac"] = row["ours_tok_s"] / roof
            print(json.dumps(row), flush=True)
            rows.append(row)
            del engine
        del hf, ours
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="gpu_results.json")
    ap.add_argument("--quick", action="store_true", help="0.5B only, batches 1 and 64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    import jax

    result = {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "decode": [],
        "train": [],
    }
    names = ["0.5b"] if args.quick else ["0.5b", "1.5b"]
    batches = [1, 64] if args.quick else [1, 64, 256]
    t0 = time.time()
    for name in names:
        result["decode"] += decode_bench(
            name, SHAPES[name], batches, prompt=args.prompt, new=args.new
        )
    from bench_train import bench

    for name in names:
        r = bench(name, steps=5 if args.quick else 10, batch=8, buckets=[1024], dtype="bfloat16")
        print(json.dumps(r), flush=True)
        result["train"].append(r)
    result["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.85")
    main()
