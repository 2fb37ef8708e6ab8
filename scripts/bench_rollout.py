"""Rollout benchmarks: tool latency under concurrency, shared group prompts, decode stalls.

Three workloads (``--workload``, default all):

latency  64 concurrent episodes x 4 turns run through the real orchestrator and the real JAX
         sampler engine (tiny random Qwen2-shaped model, shipped tokenizer, fixed 16 sampled tokens
         per turn). The environment answers every turn with a tool result after an asynchronous
         sleep of 0 ms or 100 ms. If latency is overlapped, the 100 ms run costs about
         ``turns x latency`` more wall time (0.4 s), not ``episodes x turns x latency`` (25.6 s).
         Target: extra <= 2 x turns x latency.
group    The RL group pattern the orchestrator produces (G episodes of one task open their
         sessions at once and send the same prompt): 16 tasks x G=8 sessions, synthetic
         512-token prompts identical within a group and different across groups, 4 turns of 32
         sampled tokens with a 48-token tool result between turns, on a random ~40M-parameter
         Qwen2-shaped model (8 layers, hidden 512, 8/4 heads, MLP 1536, vocab 32000, tied: the
         shape of ``bench_sampler.py``'s model). Two engines in one process, ``share_prefixes``
         on and off, alternating; wall time of the whole round. Target: shared <= 0.5 x unshared.
arrival  8 sessions decode 128-token turns; after their second decode chunk a 1024-token prompt
         arrives. Longest time between two consecutive decode-chunk results while they run
         (``Engine.stats["max_token_gap_s"]``: what a running session waits between two batches
         of tokens; the median interval is one plain chunk), chunked prefill
         (``prefill_chunk_tokens`` = 256) vs whole-prompt prefill, same model.

Medians over ``--repeats`` runs after a warm-up run (compilation excluded). ``--quick``: one
repeat, and the group / arrival workloads on a tiny model at small sizes (a smoke test).

    python scripts/bench_rollout.py                     # all three workloads
    python scripts/bench_rollout.py --workload group --json   # last line: one JSON object
    python scripts/bench_rollout.py --workload group,arrival --quick
    python scripts/bench_rollout.py --episodes 16 --repeats 1 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time

import bench_sampler  # scripts/ is on sys.path when a script runs

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build(episodes: int, turns: int, new_tokens: int):
    from flax import nnx

    from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams
    from jaxrl_agents.models import ModelConfig, Transformer
    from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
    from jaxrl_agents.types import EnvReset, EnvStep, Task, Verdict

    tok = load_tiny_tokenizer()
    chat = ChatFormat(tok)
    cfg = ModelConfig.from_hf_config(
        dict(
            model_type="qwen2",
            vocab_size=len(tok),
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        )
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    max_len = 64 + turns * (new_tokens + 48)
    engine = Engine(
        model,
        EngineConfig(
            max_slots=episodes, max_seq_len=max_len, prefill_buckets=(32, 64, 128), decode_chunk=8
        ),
    )

    class SleepyEnv:
        """Every turn: one tool result after ``latency`` seconds of asynchronous waiting."""

        latency = 0.0

        async def reset(self, task, *, seed=0):
            self.turn = 0
            msgs = [{"role": "user", "content": f"Task {task.id}: look things up, then answer."}]
            return EnvReset(messages=msgs, tools=[])

        async def step(self, message, calls):
            self.turn += 1
            await asyncio.sleep(SleepyEnv.latency)
            done = self.turn >= turns
            msgs = (
                []
                if done
                else [
                    {
                        "role": "tool",
                        "name": "lookup",
                        "tool_call_id": "c",
                        "content": f"result {self.turn}",
                    }
                ]
            )
            return EnvStep(messages=msgs, done=done)

        async def verify(self):
            return Verdict(success=True)

        async def close(self):
            pass

    def params(n, seed):
        # No stop ids: every turn samples exactly new_tokens tokens (a fixed, comparable load).
        return SamplingParams(temperature=1.0, max_new_tokens=min(n, new_tokens), seed=seed)

    class FixedTurns:
        """Sessions whose fixed-length turns count as finished (a random model never samples the
        stop token; the benchmark measures overlap, not text)."""

        def __init__(self, session):
            self.session = session

        async def generate(self, ids, sp):
            res = await self.session.generate(ids, sp)
            if res.finish_reason == "length":
                res.finish_reason = "stop"
            return res

        async def close(self):
            await self.session.close()

    class FixedTurnEngine:
        async def open_session(self):
            return FixedTurns(await engine.open_session())

    orch = Orchestrator(
        engine=FixedTurnEngine(),
        chat=chat,
        env_factory=SleepyEnv,
        cfg=RolloutConfig(
            group_size=1,
            max_turns=turns,
            max_new_tokens=new_tokens,
            max_total_tokens=max_len,
            concurrency=episodes,
        ),
        sampling_params=params,
    )
    tasks = [Task(id=str(i), env="bench", split="train", data={}) for i in range(episodes)]
    return engine, orch, tasks, SleepyEnv


async def _measure(engine, orch, tasks, env_cls, latency: float, repeats: int) -> list[float]:
    env_cls.latency = latency
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        trajs = await orch.run(tasks, group_size=1)
        times.append(time.perf_counter() - t)
        assert all(len(x.turns) == orch.cfg.max_turns for x in trajs), "episodes ended early"
    return times


QWEN2_40M = dict(model_type="qwen2", **bench_sampler.BIG)  # the sampler benchmark's shapes
TINY = dict(model_type="qwen2", **bench_sampler.TINY)


def random_model(shape: dict):
    """A randomly initialised fp32 model of HF config ``shape`` and its parameter count."""
    import jax
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer

    model = Transformer(ModelConfig.from_hf_config(shape), rngs=nnx.Rngs(0))
    return model, sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _spread(times: list[float]) -> dict:
    return dict(median=statistics.median(times), min=min(times), max=max(times), all=times)


def group_bench(
    model, *, tasks, group, prompt_len, turns, new, tool, chunk, repeats, windows=None
) -> dict:
    """Wall time of one round of ``tasks x group`` episodes, prefixes shared vs not
    (``windows``: ``EngineConfig.decode_windows``)."""
    import dataclasses

    import numpy as np

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    vocab = model.cfg.vocab_size
    slots = tasks * group
    rows = tuple(r for r in (8, 16, 32, 64, 128, 256) if r < slots)
    cfg = EngineConfig(
        max_slots=slots,
        max_seq_len=prompt_len + turns * (new + tool),
        prefill_buckets=(tool, 128, prompt_len),  # a tool turn prefills exactly `tool` tokens
        decode_chunk=chunk,
        prefill_rows=rows,  # so 16 group leaders are prefilled as 16 rows, not 32
        decode_windows=windows,
    )
    engines = {
        "shared": Engine(model, cfg),
        "unshared": Engine(model, dataclasses.replace(cfg, share_prefixes=False)),
    }
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, vocab, (tasks, prompt_len)).tolist()  # one per group
    tools = rng.integers(0, vocab, (tasks, group, turns, tool)).tolist()

    def round_(engine) -> float:
        async def episode(t, k):
            session = await engine.open_session()
            try:
                ids = prompts[t]
                for turn in range(turns):
                    sp = SamplingParams(
                        temperature=1.0, max_new_tokens=new, seed=(t * group + k) * 1009 + turn
                    )
                    res = await session.generate(ids, sp)
                    assert len(res.token_ids) == new, res.finish_reason
                    ids = tools[t][k][turn]
            finally:
                await session.close()

        async def main():
            async with engine:
                await asyncio.gather(*(episode(t, k) for t in range(tasks) for k in range(group)))

        engine.reset_stats()
        t0 = time.perf_counter()
        asyncio.run(main())
        return time.perf_counter() - t0

    for engine in engines.values():
        round_(engine)  # warm-up: compiles every program a round uses
    compiled = {name: e.compile_count for name, e in engines.items()}
    times = {name: [] for name in engines}
    for _ in range(repeats):  # alternate, so load drift hits both alike
        for name, engine in engines.items():
            times[name].append(round_(engine))
            print(f"  group {name}: {times[name][-1]:.2f} s  {engine.stats}", flush=True)
    out = {}
    for name, engine in engines.items():
        st = _spread(times[name])
        out[f"group_{name}_s"] = st["median"]
        out[f"group_{name}_min_s"], out[f"group_{name}_max_s"] = st["min"], st["max"]
        out[f"group_{name}_all_s"] = st["all"]
        for key in ("prefill_tokens", "shared_tokens", "forks"):
            out[f"group_{name}_{key}"] = engine.stats[key]
        out[f"group_{name}_compiles_after_warmup"] = engine.compile_count - compiled[name]
        out[f"group_{name}_compiles"] = engine.compile_count
    out["group_ratio"] = out["group_shared_s"] / out["group_unshared_s"]
    out["group_shape"] = dict(
        tasks=tasks, group=group, prompt_len=prompt_len, turns=turns, new=new, tool=tool
    )
    return out


def arrival_bench(
    model, *, runners, runner_prompt, runner_new, long_len, budget, chunk, repeats, windows=None
) -> dict:
    """Longest decode gap of running sessions when a long prompt arrives, chunked vs not
    (prefix sharing off: nothing to share, and no fork program to compile)."""
    import dataclasses

    import numpy as np

    from jaxrl_agents.generation import Engine, EngineConfig, SamplingParams

    vocab = model.cfg.vocab_size
    cfg = EngineConfig(
        max_slots=runners + 1,
        max_seq_len=long_len + 4 * chunk,
        prefill_buckets=(32, 256, 512),
        decode_chunk=chunk,
        decode_windows=windows,
        share_prefixes=False,
    )
    engines = {
        "chunked": Engine(model, dataclasses.replace(cfg, prefill_chunk_tokens=budget)),
        "unchunked": Engine(model, dataclasses.replace(cfg, prefill_chunk_tokens=None)),
    }
    rng = np.random.default_rng(1)
    shorts = rng.integers(0, vocab, (runners, runner_prompt)).tolist()
    long = rng.integers(0, vocab, long_len).tolist()
    stamps = {}  # engine name -> when each decode chunk's tokens reached the host
    for name, engine in engines.items():

        def timed(*a, inner=engine._run_decode, log=stamps.setdefault(name, [])):
            out = inner(*a)
            log.append(time.perf_counter())
            return out

        engine._run_decode = timed

    def round_(name) -> dict:
        engine, got = engines[name], {}
        stamps[name].clear()

        async def runner(i):
            s = await engine.open_session()
            t0 = time.perf_counter()
            await s.generate(shorts[i], SamplingParams(max_new_tokens=runner_new, seed=i))
            got.setdefault("runner_s", []).append(time.perf_counter() - t0)
            await s.close()

        async def arrival():
            while engine.stats["decode_dispatches"] < 2:
                await asyncio.sleep(0.001)
            s = await engine.open_session()
            t0 = time.perf_counter()
            await s.generate(long, SamplingParams(max_new_tokens=chunk, seed=99))
            got["long_s"] = time.perf_counter() - t0
            await s.close()

        async def main():
            async with engine:
                await asyncio.gather(*(runner(i) for i in range(runners)), arrival())

        engine.reset_stats()
        asyncio.run(main())
        return dict(
            gap=engine.stats["max_token_gap_s"],
            interval=float(np.median(np.diff(stamps[name]))),
            runner=max(got["runner_s"]),
            long=got["long_s"],
        )

    for name in engines:
        round_(name)  # warm-up
    res = {name: [] for name in engines}
    for _ in range(repeats):
        for name in engines:
            res[name].append(round_(name))
            print(f"  arrival {name}: {res[name][-1]}", flush=True)
    out = {}
    for name, runs in res.items():
        gaps = _spread([r["gap"] for r in runs])
        out[f"gap_{name}_s"] = gaps["median"]
        out[f"gap_{name}_min_s"], out[f"gap_{name}_max_s"] = gaps["min"], gaps["max"]
        out[f"gap_{name}_all_s"] = gaps["all"]
        out[f"arrival_{name}_chunk_interval_s"] = statistics.median(r["interval"] for r in runs)
        out[f"arrival_{name}_runner_turn_s"] = statistics.median(r["runner"] for r in runs)
        out[f"arrival_{name}_long_turn_s"] = statistics.median(r["long"] for r in runs)
    out["gap_ratio"] = out["gap_chunked_s"] / out["gap_unchunked_s"]
    out["arrival_shape"] = dict(
        runners=runners, runner_new=runner_new, long_len=long_len, budget=budget, chunk=chunk
    )
    return out


def latency_bench(args, repeats: int) -> dict:
    engine, orch, tasks, env_cls = build(args.episodes, args.turns, args.new_tokens)

    async def run():
        async with engine:
            await _measure(engine, orch, tasks, env_cls, 0.0, 1)  # warm-up: compile
            t0 = await _measure(engine, orch, tasks, env_cls, 0.0, repeats)
            t1 = await _measure(engine, orch, tasks, env_cls, args.latency_ms / 1000, repeats)
            return t0, t1

    t0, t1 = asyncio.run(run())
    lat = args.latency_ms / 1000
    w0, w1 = statistics.median(t0), statistics.median(t1)
    out = {
        "episodes": args.episodes,
        "turns": args.turns,
        "latency_ms": args.latency_ms,
        "wall_s_latency0": w0,
        "wall_s_latency100": w1,
        "wall_s_latency0_all": t0,
        "wall_s_latency100_all": t1,
        "extra_s": w1 - w0,
        "bound_s": 2 * args.turns * lat,
        "sequential_s": args.episodes * args.turns * lat,
        "compiles": engine.compile_count,
    }
    out["within_bound"] = out["extra_s"] <= out["bound_s"]
    print(
        f"{args.episodes} episodes x {args.turns} turns: "
        f"latency 0 -> {w0:.2f} s, latency {args.latency_ms:.0f} ms -> {w1:.2f} s "
        f"(extra {out['extra_s']:.2f} s; bound {out['bound_s']:.2f} s; "
        f"sequential would add {out['sequential_s']:.1f} s)",
        flush=True,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--workload",
        type=lambda s: s.split(","),
        default="all",
        help="latency, group, arrival, a comma list of them, or all (default)",
    )
    ap.add_argument("--episodes", type=int, default=64, help="latency: concurrent episodes")
    ap.add_argument("--turns", type=int, default=4, help="latency: turns per episode")
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--new-tokens", type=int, default=16, help="latency: tokens per turn")
    ap.add_argument("--tasks", type=int, default=16, help="group: tasks (groups)")
    ap.add_argument("--group", type=int, default=8, help="group: samples per task (G)")
    ap.add_argument("--prompt-len", type=int, default=512, help="group: prompt tokens")
    ap.add_argument("--chunk-tokens", type=int, default=256, help="arrival: prefill_chunk_tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repeat, tiny sizes (smoke test)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()
    work = {"latency", "group", "arrival"} if args.workload == ["all"] else set(args.workload)
    if not work or work - {"latency", "group", "arrival"}:
        ap.error(f"--workload {','.join(args.workload)}: expected latency, group, arrival or all")
    repeats = 1 if args.quick else args.repeats
    if args.quick:  # engines of one shape compile identical programs: compile each once
        import tempfile

        import jax

        cache = tempfile.TemporaryDirectory(prefix="bench_rollout")  # removed when main ends
        jax.config.update("jax_compilation_cache_dir", cache.name)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    out = {"machine": f"{platform.machine()} {os.cpu_count()} cpus"}
    if "latency" in work:
        out.update(latency_bench(args, repeats))
    if work & {"group", "arrival"}:
        model, n_params = random_model(TINY if args.quick else QWEN2_40M)
        out["model_params_M"] = round(n_params / 1e6, 1)
    if "group" in work:
        shape = dict(tasks=args.tasks, group=args.group, prompt_len=args.prompt_len)
        shape.update(turns=4, new=32, tool=48, chunk=16)
        if args.quick:
            shape.update(tasks=2, group=4, prompt_len=64, turns=2, new=8, tool=8, chunk=8)
            shape.update(windows=())  # one decode program: a fast smoke test
        g = group_bench(model, **shape, repeats=repeats)
        out.update(g)
        print(
            f"group {shape['tasks']} tasks x G={shape['group']}, {shape['prompt_len']}-token "
            f"prompts ({out['model_params_M']}M params): shared {g['group_shared_s']:.2f} s "
            f"[{g['group_shared_min_s']:.2f}-{g['group_shared_max_s']:.2f}], unshared "
            f"{g['group_unshared_s']:.2f} s [{g['group_unshared_min_s']:.2f}-"
            f"{g['group_unshared_max_s']:.2f}], ratio {g['group_ratio']:.2f}",
            flush=True,
        )
    if "arrival" in work:
        shape = dict(runners=8, runner_prompt=32, runner_new=128, long_len=1024, chunk=16)
        if args.quick:
            shape.update(runners=2, runner_new=24, long_len=160, chunk=4, windows=())
        budget = 32 if args.quick else args.chunk_tokens
        a = arrival_bench(model, **shape, budget=budget, repeats=repeats)
        out.update(a)
        print(
            f"arrival of a {shape['long_len']}-token prompt: longest wait between decode "
            f"chunks' tokens chunked ({budget} tokens) {a['gap_chunked_s']:.3f} s "
            f"[{a['gap_chunked_min_s']:.3f}-{a['gap_chunked_max_s']:.3f}], unchunked "
            f"{a['gap_unchunked_s']:.3f} s [{a['gap_unchunked_min_s']:.3f}-"
            f"{a['gap_unchunked_max_s']:.3f}]; a plain chunk "
            f"{a['arrival_unchunked_chunk_interval_s']:.3f} s",
            flush=True,
        )
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
