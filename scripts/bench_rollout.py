"""Rollout benchmark: is tool latency hidden by concurrency, or summed?

64 concurrent episodes x 4 turns run through the real orchestrator and the real JAX sampler
engine (tiny random Qwen2-shaped model, shipped tokenizer, fixed 16 sampled tokens per turn).
The environment answers every turn with a tool result after an asynchronous sleep of 0 ms or
100 ms. If latency is overlapped, the 100 ms run costs about ``turns x latency`` more wall time
(0.4 s), not ``episodes x turns x latency`` (25.6 s). Target: extra <= 2 x turns x latency.

    python scripts/bench_rollout.py                 # default: 64 episodes, 4 turns
    python scripts/bench_rollout.py --json          # last line: one JSON object
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repeat (smoke test)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
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
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
    }
    out["within_bound"] = out["extra_s"] <= out["bound_s"]
    print(
        f"{args.episodes} episodes x {args.turns} turns: "
        f"latency 0 -> {w0:.2f} s, latency {args.latency_ms:.0f} ms -> {w1:.2f} s "
        f"(extra {out['extra_s']:.2f} s; bound {out['bound_s']:.2f} s; "
        f"sequential would add {out['sequential_s']:.1f} s)"
    )
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
