"""Fault injection through the real rollout path: N episodes, every one must end with a reason.

    python scripts/chaos.py                 # 1000 episodes (~1-2 min on 2 cores)
    python scripts/chaos.py --episodes 200 --json

Episodes run through ``rollout.Collector`` / ``Orchestrator`` with a model-free scripted policy and
the shipped tokenizer's chat format, against a calculator env with one extra ``probe`` tool. Per
tool call the policy picks, at random: a probe that raises (20%), one that hangs past the tool
timeout (5%), one that returns 1 MB (5%), a malformed tool call (5%), or the ordinary calculator
call; then it answers. On top: one env constructor that raises, one reward term that raises, and
a SQL episode running an uninterruptible ``printf('%.*c', 2147483647, 'x')`` concurrently.
Reported: hangs (episodes still running at the end), escaped exceptions, end reasons, the longest
event-loop stall (a 10 ms ticker's largest gap), peak threads and RSS. Exit status 1 when any
hang, escaped exception, episode without a reason, or loop stall over 1 s is seen.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import resource
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tool-timeout", type=float, default=0.5)
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out))
    ok = (
        out["hangs"] == 0
        and out["escaped_exceptions"] == 0
        and out["without_reason"] == 0
        and out["max_loop_stall_s"] <= 1.0
    )
    raise SystemExit(0 if ok else 1)


async def run(args) -> dict:
    from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
    from jaxrl_agents.envs import CalculatorEnv, SqlEnv, tool
    from jaxrl_agents.envs.calculator import oracle_policy
    from jaxrl_agents.rewards import RewardComposer, RewardConfig, TermConfig, register_reward_term
    from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine
    from jaxrl_agents.types import EndReason

    rng = random.Random(args.seed)
    built = {"n": 0}
    scored = {"n": 0}

    class ChaosEnv(CalculatorEnv):
        def __init__(self, **kw):
            built["n"] += 1
            if built["n"] == 7:
                raise RuntimeError("injected constructor failure")
            super().__init__(**kw)

        @tool
        def probe(self, mode: str) -> str:
            """Misbehave on purpose.

            Args:
                mode: raise | hang | big
            """
            if mode == "raise":
                raise RuntimeError("injected tool failure")
            if mode == "hang":
                time.sleep(args.tool_timeout * 4)  # outlives its timeout, then returns
                return "late"
            return "x" * 1_000_000

    @register_reward_term("chaos_reward")
    def chaos_reward(traj) -> float:
        scored["n"] += 1
        if scored["n"] == 11:
            raise ValueError("injected reward failure")
        return 0.0

    def policy_factory(task):
        solve = oracle_policy(task)

        def policy(messages):
            turn = sum(m["role"] == "assistant" for m in messages)
            if turn >= 2:
                return solve(messages)
            u = rng.random()
            if u < 0.20:
                mode = "raise"
            elif u < 0.25:
                mode = "hang"
            elif u < 0.30:
                mode = "big"
            elif u < 0.35:
                return {"role": "assistant", "content": '<tool_call>{"name": "calc", "argu'}
            else:
                return solve(messages)
            fn = {"name": "probe", "arguments": {"mode": mode}}
            return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": fn}]}

        return policy

    chat = ChatFormat(load_tiny_tokenizer())
    limits = RolloutConfig(
        group_size=1, max_turns=4, max_new_tokens=4096, max_total_tokens=1 << 22,
        episode_timeout_s=30.0, concurrency=64,
    )  # fmt: skip
    reward = RewardComposer(RewardConfig(terms=[TermConfig("outcome"), TermConfig("chaos_reward")]))
    env_kw = {"tool_timeout_s": args.tool_timeout, "tool_output_max_chars": 2000}
    calc = Collector(chat=chat, env_factory=lambda: ChaosEnv(**env_kw), rollout=limits,
                     reward=reward)  # fmt: skip
    tasks = CalculatorEnv.make_tasks("train", args.episodes - 1, seed=args.seed)

    sql_tasks = SqlEnv.make_tasks("train", 1, seed=args.seed)

    def attack(task):
        def policy(messages):
            if not any(m["role"] == "tool" for m in messages):
                q = "SELECT printf('%.*c', 2147483647, 'x')"
                fn = {"name": "run_sql", "arguments": {"query": q}}
                return {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "a", "function": fn}],
                }
            return {"role": "assistant", "content": "done"}

        return policy

    sql = Collector(chat=chat, env_factory=lambda: SqlEnv(tool_timeout_s=2.0), rollout=limits,
                    reward=reward)  # fmt: skip

    gaps = {"max": 0.0}
    stop = asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps["max"] = max(gaps["max"], now - last - 0.01)
            last = now

    peak = {"threads": threading.active_count()}

    async def watch_threads():
        while not stop.is_set():
            peak["threads"] = max(peak["threads"], threading.active_count())
            await asyncio.sleep(0.05)

    escaped = []

    async def guarded(coro):
        try:
            return await coro
        except BaseException as e:  # noqa: BLE001 - counting what escapes is the point
            escaped.append(repr(e))
            return None

    t0 = time.perf_counter()
    side = [asyncio.ensure_future(ticker()), asyncio.ensure_future(watch_threads())]
    eng = ScriptedEngine(chat, policy_factory=policy_factory)
    sql_eng = ScriptedEngine(chat, policy_factory=attack)
    jobs = [
        asyncio.ensure_future(guarded(_run(calc, eng, tasks))),
        asyncio.ensure_future(guarded(_run(sql, sql_eng, sql_tasks))),
    ]
    done, pending = await asyncio.wait(jobs, timeout=600)
    hangs = sum(1 for _ in pending)
    for p in pending:
        p.cancel()
    stop.set()
    await asyncio.gather(*side, return_exceptions=True)
    results = [j.result() if j in done else None for j in jobs]
    trajs = [t for r in results if r for t in r]
    ends = collections.Counter(t.end_reason.value for t in trajs)
    sql_traj = results[1][0] if results[1] else None
    out = {
        "episodes": len(trajs),
        "hangs": hangs,
        "escaped_exceptions": len(escaped),
        "without_reason": sum(not isinstance(t.end_reason, EndReason) for t in trajs),
        "end_reasons": dict(sorted(ends.items())),
        "tool_errors": sum(1 for t in trajs for r in t.tool_results if not r.ok),
        "max_loop_stall_s": round(gaps["max"], 3),
        "peak_threads": peak["threads"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "sql_attack_wall_s": round(sql_traj.timings.get("wall_s", -1), 2) if sql_traj else None,
        "sql_attack_result": (
            sql_traj.tool_results[0].content[:80] if sql_traj and sql_traj.tool_results else None
        ),  # fmt: skip
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    for k, v in out.items():
        print(f"{k:>20}: {v}")
    return out


async def _run(collector, engine, tasks):
    orch = collector.orchestrator(engine, greedy=True, group_size=1)
    trajs = await orch.run(tasks, group_size=1, seed=0)
    await collector.score(trajs)
    return trajs


if __name__ == "__main__":
    main()
