"""Fault injection at the env level: every failure is a ToolResult the model reads, never an
exception out of ``step``, and a turn's wall time stays bounded."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from jaxrl_agents.envs import Env, tool
from jaxrl_agents.envs.tools import tool_deadline
from jaxrl_agents.envs.workers import WorkerPool, tool_pool
from jaxrl_agents.types import Ann, Task, ToolCall, ToolErrorKind, Verdict


class FaultyEnv(Env):
    name = "faulty"

    @tool
    def boom(self) -> str:
        """Always raises."""
        raise RuntimeError("disk on fire")

    @tool
    def hang_sync(self, seconds: float) -> str:
        """Blocks a thread.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "woke"

    @tool
    async def hang_async(self) -> str:
        """Never returns."""
        await asyncio.sleep(3600)
        return "never"

    @tool
    def huge(self) -> str:
        """Returns 1 MB."""
        return "x" * 1_000_000

    @tool
    def echo(self, text: str, times: int = 1) -> str:
        """Echo.

        Args:
            text: what.
            times: how often.
        """
        return text * times

    def judge(self, answer):
        return Verdict(success=False)


TASK = Task(id="t0", env="faulty", split="train", data={"question": "break things"})


def _run_turn(calls):
    env = FaultyEnv(tool_timeout_s=0.3, tool_output_max_chars=500)

    async def go():
        await env.reset(TASK)
        return await env.step({"role": "assistant", "content": ""}, calls)

    t0 = time.perf_counter()
    step = asyncio.run(go())
    return step, time.perf_counter() - t0


def test_every_fault_becomes_a_readable_tool_error_in_bounded_time():
    calls = [
        ToolCall("boom", {}, id="c0"),
        ToolCall("hang_sync", {"seconds": 2.0}, id="c1"),
        ToolCall("hang_async", {}, id="c2"),
        ToolCall("huge", {}, id="c3"),
        ToolCall("", {}, id="c4", raw="<tool_call>{oops", error="invalid JSON at char 5"),
        ToolCall("serch", {"q": 1}, id="c5"),
        ToolCall("echo", {"text": 5}, id="c6"),
        ToolCall("echo", {"text": "ok", "times": 2}, id="c7"),
    ]
    step, wall = _run_turn(calls)
    # Two timeouts of 0.3 s each, sequential; the 2 s sleeper's thread is abandoned, not awaited.
    assert wall < 1.5, wall
    assert not step.done
    kinds = [r.error_kind for r in step.tool_results]
    assert kinds == [
        ToolErrorKind.TOOL_ERROR,
        ToolErrorKind.TIMEOUT,
        ToolErrorKind.TIMEOUT,
        None,
        ToolErrorKind.MALFORMED,
        ToolErrorKind.UNKNOWN_TOOL,
        ToolErrorKind.BAD_ARGUMENTS,
        None,
    ]
    text = [m["content"] for m in step.messages]
    assert text[0] == "Error: boom failed: RuntimeError: disk on fire"
    assert text[1] == "Error: hang_sync timed out after 0.3 s"
    assert text[3].startswith("x" * 500) and text[3].endswith("[truncated 999500 chars]")
    assert text[4] == "Error: could not parse tool call: invalid JSON at char 5"
    assert text[5] == (
        "Error: unknown tool 'serch'. Available: boom, hang_sync, hang_async, huge, echo"
    )
    assert text[6] == "Error: bad arguments for echo: 'text' must be string, got int 5"
    assert text[7] == "okok"
    assert [m["tool_call_id"] for m in step.messages] == [f"c{i}" for i in range(8)]
    assert all(m["role"] == "tool" for m in step.messages)


def test_malformed_only_turn_is_not_a_final_answer():
    step, _ = _run_turn([ToolCall("", {}, error="no closing tag")])
    assert not step.done and step.annotations[Ann.ANSWERED] is False
    assert step.tool_results[0].error_kind is ToolErrorKind.MALFORMED


def test_repeated_identical_calls_are_annotated():
    env = FaultyEnv()

    async def go():
        await env.reset(TASK)
        call = ToolCall("echo", {"text": "a"})
        s1 = await env.step({"role": "assistant"}, [call])
        s2 = await env.step({"role": "assistant"}, [call, ToolCall("echo", {"text": "b"})])
        return s1, s2, await env.verify()

    s1, s2, verdict = asyncio.run(go())
    assert (s1.annotations["repeated_calls"], s2.annotations["repeated_calls"]) == (0, 1)
    assert verdict.info["repeated_calls"] == 1 and verdict.info["tool_calls"] == 3


def test_many_concurrent_episodes_with_hanging_tools_finish_together():
    # 32 episodes, each hitting a 0.3 s timeout: concurrency hides it (far below 32 * 0.3 s).
    async def one():
        env = FaultyEnv(tool_timeout_s=0.3)
        await env.reset(TASK)
        step = await env.step({"role": "assistant"}, [ToolCall("hang_async", {})])
        return step.tool_results[0].error_kind

    async def main():
        return await asyncio.gather(*[one() for _ in range(32)])

    t0 = time.perf_counter()
    kinds = asyncio.run(main())
    assert time.perf_counter() - t0 < 2.0
    assert set(kinds) == {ToolErrorKind.TIMEOUT}


class _Ticker:
    """Measures the event loop's responsiveness: the longest gap between its 10 ms ticks that a
    plain thread ticking beside it did not share. A sync tool run on the loop stalls the loop
    alone (the thread sleeps through it); a busy machine that deschedules the whole process
    stalls both, and is not the loop's fault."""

    def __init__(self):
        self.max_gap = 0.0  # the loop's longest gap, less the thread's longest inside it
        self._loop_ticks: list[float] = []
        self._thread_ticks: list[float] = []
        self._stop = threading.Event()
        self._task = self._thread = None

    async def _run(self):
        while True:
            self._loop_ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    def _tick_thread(self):
        while not self._stop.is_set():
            self._thread_ticks.append(time.perf_counter())
            time.sleep(0.01)

    def __enter__(self):
        self._thread = threading.Thread(target=self._tick_thread, daemon=True)
        self._thread.start()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc):
        self._task.cancel()
        self._stop.set()
        self._thread.join()
        self._loop_ticks.append(time.perf_counter())
        for a, b in itertools.pairwise(self._loop_ticks):
            inside = [a, *(t for t in self._thread_ticks if a < t < b), b]
            shared = max(y - x for x, y in itertools.pairwise(inside))
            self.max_gap = max(self.max_gap, (b - a) - shared)


def test_the_ticker_sees_a_loop_blocked_by_a_sync_call():
    async def main():
        with _Ticker() as ticker:
            await asyncio.sleep(0.05)
            time.sleep(0.3)  # on the loop: the loop stalls, the ticking thread does not
            await asyncio.sleep(0.05)
        return ticker.max_gap

    assert asyncio.run(main()) > 0.2


def test_timed_out_sync_calls_keep_threads_bounded_and_the_loop_responsive():
    baseline = threading.active_count()
    pool = tool_pool()

    async def episode(peak):
        env = FaultyEnv(tool_timeout_s=0.01)
        await env.reset(TASK)
        kinds = []
        for _ in range(10):
            step = await env.step({"role": "assistant"}, [ToolCall("hang_sync", {"seconds": 0.5})])
            kinds.append(step.tool_results[0].error_kind)
            peak[0] = max(peak[0], threading.active_count())
        return kinds

    async def main():
        peak = [0]
        with _Ticker() as ticker:
            t0 = time.perf_counter()
            kinds = await asyncio.gather(*[episode(peak) for _ in range(20)])  # 200 calls
            elapsed = time.perf_counter() - t0
            await asyncio.sleep(0.6)  # the abandoned sleepers finish; their workers come back
            env = FaultyEnv(tool_timeout_s=2.0)
            await env.reset(TASK)
            after = await env.step({"role": "assistant"}, [ToolCall("echo", {"text": "hi"})])
        return kinds, elapsed, peak[0], ticker.max_gap, after

    kinds, elapsed, peak, max_gap, after = asyncio.run(main())
    assert {k for ks in kinds for k in ks} == {ToolErrorKind.TIMEOUT}
    assert elapsed < 2.0, elapsed  # each timed-out call is abandoned at once
    assert peak <= baseline + pool.max_workers + 3, (peak, baseline, pool.max_workers)
    assert threading.active_count() <= baseline + pool.max_workers + 3
    assert pool.threads <= pool.max_workers
    assert max_gap < 1.0, max_gap  # the spec: the loop never stalls more than a second
    assert after.messages[0]["content"] == "hi"  # the pool works again


def test_worker_pool_reuses_idle_workers_and_cancels_queued_calls():
    pool = WorkerPool(2, name="test")
    gate = threading.Event()
    try:
        busy = [pool.submit(gate.wait, 5) for _ in range(2)]
        queued = pool.submit(lambda: "never")
        assert pool.threads == 2 and queued.cancel()
        gate.set()
        assert [f.result(timeout=5) for f in busy] == [True, True]
        assert [pool.submit(lambda i=i: i * i).result(timeout=5) for i in range(20)] == [
            i * i for i in range(20)
        ]
        assert pool.threads == 2 and all(t.daemon for t in pool._threads)
        failing = pool.submit(lambda: 1 / 0)
        assert isinstance(failing.exception(timeout=5), ZeroDivisionError)
    finally:
        pool.shutdown()
    assert not any(t.is_alive() for t in pool._threads)


def test_sync_tools_see_their_deadline():
    seen = {}

    class DeadlineEnv(FaultyEnv):
        @tool
        def when(self) -> str:
            """Reports the call's deadline."""
            seen["deadline"], seen["now"] = tool_deadline(), time.monotonic()
            return "ok"

    async def go():
        env = DeadlineEnv(tool_timeout_s=3.0)
        await env.reset(TASK)
        return await env.step({"role": "assistant"}, [ToolCall("when", {})])

    assert asyncio.run(go()).tool_results[0].ok
    assert 2.5 < seen["deadline"] - seen["now"] <= 3.0
    assert tool_deadline() is None
