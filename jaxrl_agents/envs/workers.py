"""The bounded worker pool sync tools run in, and the running call's deadline.
Sync tools run in one bounded, process-wide worker pool (:func:`tool_pool`; ``max_workers``
from :func:`set_tool_threads`, else ``$JAXRL_AGENTS_TOOL_THREADS``, else
:data:`DEFAULT_TOOL_THREADS`), awaited with the call's timeout, so they never block the event loop
and the thread count stays bounded. A sync call that outlives its timeout is abandoned: the episode
gets the ``timeout`` tool error at once, while the call keeps its worker until it returns (a Python
thread cannot be killed). So a tool that can hang must bound its own work: hung calls pin workers,
and once all are pinned later sync calls wait in the queue and time out (calls still queued at
their timeout are cancelled, never run). The workers are daemon threads (unlike
``ThreadPoolExecutor``'s, which interpreter exit joins), so a hung call cannot block exit. A
CPU-heavy pure-Python tool still holds the GIL: bound its work (the calculator bounds powers).
:func:`tool_deadline` tells a running tool when its call times out (the SQL env stops its query
there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

DEFAULT_TOOL_THREADS = 32
"""Default size of the sync-tool worker pool."""


class WorkerPool(concurrent.futures.Executor):
    """A bounded pool of daemon worker threads, started lazily (at most ``max_workers``).

    Like ``ThreadPoolExecutor`` (idle workers are reused before a new one starts), except that the
    workers are daemon threads that interpreter exit does not join: an abandoned hung call must not
    block exit. ``shutdown`` lets each worker finish its current call and exit.
    """

    def __init__(self, max_workers: int, *, name: str = "tool"):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a WorkerPool after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                t = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            del item
            if future.set_running_or_notify_cancel():  # False: cancelled while queued
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - delivered to the awaiting coroutine
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()

    @property
    def threads(self) -> int:
        """Worker threads started so far (never more than ``max_workers``)."""
        return len(self._threads)


_pool: WorkerPool | None = None
_pool_size: int | None = None
_pool_lock = threading.Lock()


def set_tool_threads(n: int) -> None:
    """Size of the sync-tool pool. A running pool of another size is replaced: its workers finish
    their current calls and exit, later calls go to a new pool of ``n`` workers."""
    global _pool, _pool_size
    if n < 1:
        raise ValueError(f"tool threads must be >= 1, got {n}")
    with _pool_lock:
        old = _pool if _pool is not None and _pool.max_workers != n else None
        if old is not None:
            _pool = None
        _pool_size = n
    if old is not None:
        old.shutdown(wait=False)


def tool_pool() -> WorkerPool:
    """The process-wide pool sync tools run in, created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            n = _pool_size or int(os.environ.get("JAXRL_AGENTS_TOOL_THREADS") or 0)
            _pool = WorkerPool(n or DEFAULT_TOOL_THREADS, name="tool")
        return _pool


DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "jaxrl_tool_deadline", default=None
)


def tool_deadline() -> float | None:
    """``time.monotonic()`` at which the tool call running in this context times out (``None``
    outside a :meth:`ToolBox.execute`). Sync tools see it on their worker thread too."""
    return DEADLINE.get()


async def run_in_pool(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()  # carries the deadline to the worker thread
    return await loop.run_in_executor(tool_pool(), lambda: ctx.run(fn, **kwargs))
