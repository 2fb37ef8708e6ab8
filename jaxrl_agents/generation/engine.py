"""Continuous-batching sampler engine: slots, multi-turn sessions, an asyncio API.

Every session owns one slot — one row of the KV cache — until it is closed, so a multi-turn
episode keeps its history on device: a later turn prefills only the appended tokens (tool results)
after the previous turn's last sampled token. A background scheduler task loops over

  # ADMIT   arm every newly arrived request (sampling settings, stop tables, prefix match)
  # PREFILL fork shared prefixes and prefill the new tokens of the requests being admitted
  # DECODE  one chunk of up to ``decode_chunk`` steps over all slots with a running turn

and resolves each request's future when its row stops. Device work runs in a worker thread
(``asyncio.to_thread``), so the event loop — and the tools of other episodes — keep running.
Requests arriving during a chunk join at the next chunk boundary.

Chunked prefill (``EngineConfig.prefill_chunk_tokens``): while some slot is decoding, one
iteration prefills at most that many tokens of any one request, so the running sessions wait for
one piece of a long prompt between two decode chunks, not for all of it; a request whose input is
not fully cached stays *prefilling* and joins decoding after its last piece. The limit is per
request, not a total: many short inputs (tool results arriving together) are still prefilled in
one iteration — a total budget would hold some of them back for extra decode chunks and lengthen
a lock-step rollout. With nothing decoding, everything waiting is prefilled in one iteration.
``stats["max_token_gap_s"]`` is the longest time between the results of two consecutive decode
chunks while sessions kept decoding: one chunk plus whatever ran before it (a prefill piece) —
what a running session waits between two batches of tokens. (Timing the host between dispatches
would miss the prefill: device work is asynchronous, it shows up when the next chunk's tokens
are fetched.)

Shared prefixes (``EngineConfig.share_prefixes``): a new session whose prompt shares a long
enough prefix with another live session's first prompt copies those positions of the cache
(the fork program) and prefills only the rest; see ``prefix_cache``. The slots' host state
lives in ``slots``, the sessions and their requests in ``session``, the cache and the
compiled programs (and their count, ``compile_count``) in ``programs``.

Prefill runs over the smallest row bucket (``EngineConfig.prefill_rows``) that holds the slots with
new tokens, and a decode chunk over the smallest (``EngineConfig.decode_rows``) that holds the
running slots, when the layers are unrolled and the slots are on one device (no mesh, or one
that does not split them); otherwise over all slots' rows (idle rows write nothing). Stop
sequences are matched within the current turn's generated tokens.
Usage: see ``tests/generation/test_engine_async.py``; benchmarks: ``scripts/bench_sampler.py``,
``scripts/bench_rollout.py`` (group sharing, decode gaps under arrivals).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_agents.generation import programs
from jaxrl_agents.generation.config import EngineConfig, GenerationResult, SamplingParams
from jaxrl_agents.generation.prefix_cache import PrefixCache
from jaxrl_agents.generation.session import Request, Session
from jaxrl_agents.generation.slots import SlotTable, bucket_rows
from jaxrl_agents.generation.steps import FINISH_NAMES, RUNNING, SlotState, widen_chunk

__all__ = ["Engine", "Session"]


class Engine:
    """Continuous-batching sampler over a ``Transformer``; use as ``async with Engine(...)``."""

    def __init__(self, model: nnx.Module, cfg: EngineConfig, *, mesh: Mesh | None = None):
        self.cfg, self.mesh = cfg, mesh
        self.vocab_size = model.cfg.vocab_size
        unroll = cfg.unroll_layers
        self.unrolled = programs.default_unrolled() if unroll is None else bool(unroll)
        # Device side: the KV cache, the weights as the programs take them, the programs.
        graphdef, state = nnx.split(model)
        scfg = programs.sampler_config(model.cfg, cfg, unrolled=self.unrolled)
        self._cache, cache_sharding = programs.new_cache(
            scfg, cfg, unrolled=self.unrolled, mesh=mesh
        )
        state = programs.place_weights(state, mesh)
        self._model_state = state  # the structure update_weights validates against
        self._relayout, hidden, logits = programs.weight_layout(
            model, graphdef, cfg, scfg, unrolled=self.unrolled
        )
        self._state = self._relayout(state) if self._relayout is not None else state
        # Row-compacted prefill and decode (module docstring): the slots on one device only.
        compact = self.unrolled and programs.slot_shards(mesh) == 1
        self._row_buckets = cfg.prefill_rows if compact else (cfg.max_slots,)
        self._decode_rows = cfg.decode_row_buckets if compact else (cfg.max_slots,)
        self._traces = 0
        self._trace_lock = threading.Lock()
        self._prefill, self._decoders, self._fork = programs.compile_programs(
            hidden, logits, cfg, cache_sharding=cache_sharding, on_trace=self._count
        )
        if self._fork is not None:
            # Compiled now (a no-op call), so the first fork never stalls decoding on a compile.
            self._cache = self._fork(self._cache, *programs.fork_args([], cfg.max_slots))
        # Host side: per-slot state, the prefix registry, the requests by stage.
        self._slots = SlotTable.create(cfg)
        self._prefixes = PrefixCache(cfg.share_min_tokens)
        self._running: dict[int, Request] = {}  # slot -> request being decoded
        self._waiting: list[Request] = []  # requests to arm at the next boundary
        self._prefilling: list[Request] = []  # armed, input not fully cached yet (FIFO)
        self._last_tokens: float | None = None  # when the previous chunk's tokens arrived
        self.stats: dict[str, float] = {}
        self.reset_stats()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _count(self) -> None:
        with self._trace_lock:
            self._traces += 1

    # ----------------------------------------------------------------- public API
    @property
    def compile_count(self) -> int:
        """XLA programs compiled so far (traces of the prefill, decode and fork functions)."""
        return self._traces

    def reset_stats(self) -> None:
        """Zero ``stats``: ``prefill_tokens`` (input tokens prefilled), ``shared_tokens`` (copied
        by forks instead), ``forks`` (requests that forked), ``prefill_dispatches``,
        ``fork_dispatches``, ``decode_dispatches``, ``max_token_gap_s`` (longest time between the
        results of two consecutive decode chunks while sessions kept decoding)."""
        self.stats.clear()
        self.stats.update(
            prefill_tokens=0,
            shared_tokens=0,
            forks=0,
            prefill_dispatches=0,
            fork_dispatches=0,
            decode_dispatches=0,
            max_token_gap_s=0.0,
        )

    def update_weights(self, model_or_state: Any) -> None:
        """Swap in new parameters of the same structure, shapes and dtypes (no recompilation).

        Takes effect at the next dispatch. The engine keeps references, not copies: if a train
        step donates the parameter buffers, call this with the new ones before sampling again.
        Prompt prefixes cached before the update are not shared with sessions opened after it.
        """
        state = (
            nnx.state(model_or_state) if isinstance(model_or_state, nnx.Module) else model_or_state
        )
        state = programs.like_weights(self._model_state, state)
        self._prefixes.invalidate()  # cached prefixes were computed under the old weights
        self._model_state = state
        self._state = self._relayout(state) if self._relayout is not None else state

    async def __aenter__(self) -> Engine:
        if self._task is not None:
            raise RuntimeError("engine already started")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Condition()
        self._stopping = False
        self._task = asyncio.create_task(self._scheduler(), name="sampler-engine")
        return self

    async def __aexit__(self, *exc) -> None:
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        await task

    async def open_session(self) -> Session:
        """A session on a free slot, waiting until one is free."""
        self._require_running()
        async with self._slot_freed:
            await self._slot_freed.wait_for(lambda: self._slots.has_free)
            slot = self._slots.claim()
        return Session(self, slot)

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[GenerationResult]:
        """Synchronous convenience: one single-turn session per prompt (runs its own loop)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        if self._task is not None:
            raise RuntimeError("generate_batch is synchronous; inside `async with` use sessions")

        async def one(prompt, sp):
            session = await self.open_session()
            try:
                return await session.generate(prompt, sp)
            finally:
                await session.close()

        async def run():
            async with self:
                return await asyncio.gather(
                    *(one(p, s) for p, s in zip(prompts, params, strict=True))
                )

        return list(asyncio.run(run()))

    # ------------------------------------------------------------ session hooks
    def _require_running(self) -> None:
        if self._task is None:
            raise RuntimeError("engine not started: use `async with engine:` (or generate_batch)")

    async def _submit(self, session: Session, prompt: list[int], params: SamplingParams):
        self._require_running()
        req = Request(session, prompt, params, self._loop.create_future())
        self._waiting.append(req)
        self._wake.set()
        return await req.future

    async def _release(self, session: Session) -> None:
        for req in [self._running.pop(session.slot, None), *self._waiting, *self._prefilling]:
            if req is not None and req.session is session and not req.future.done():
                req.future.set_exception(RuntimeError(f"session on slot {session.slot} closed"))
        self._waiting = [r for r in self._waiting if r.session is not session]
        self._prefilling = [r for r in self._prefilling if r.session is not session]
        self._prefixes.unregister(session.slot)
        async with self._slot_freed:
            self._slots.release(session.slot)
            self._slot_freed.notify()

    # ---------------------------------------------------------------- scheduler
    # Bookkeeping (host mirrors, _running, _waiting) happens on the event-loop thread only; the
    # worker thread receives finished numpy inputs and runs the device calls.
    async def _scheduler(self) -> None:
        try:
            while not self._stopping:
                if not self._waiting and not self._prefilling and not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # ADMIT
                if self._waiting:
                    batch, self._waiting = self._waiting, []
                    for req in batch:
                        self._arm(req)
                # PREFILL (forks and prefill pieces, in order)
                if self._prefilling:
                    ops, joined = self._plan_prefill()
                    if ops:
                        await asyncio.to_thread(self._run_ops, ops)
                    for req in joined:
                        if not req.future.done():  # closed sessions were failed in _release
                            self._running[req.session.slot] = req
                # DECODE
                if self._running:
                    slots, window, rows = self._plan_decode()
                    out = await asyncio.to_thread(self._run_decode, slots, window, rows)
                    now = time.perf_counter()
                    if self._last_tokens is not None:
                        gap = self.stats["max_token_gap_s"]
                        self.stats["max_token_gap_s"] = max(gap, now - self._last_tokens)
                    self._last_tokens = now
                    self.stats["decode_dispatches"] += 1
                    self._collect(out)
                if not self._running:
                    self._last_tokens = None  # nobody is waiting for the next chunk
        except BaseException as err:  # fail every waiter rather than hang them
            self._fail_all(err if isinstance(err, Exception) else RuntimeError("engine stopped"))
            raise
        self._fail_all(RuntimeError("engine stopped with the request pending"))

    def _fail_all(self, err: Exception) -> None:
        for req in [*self._waiting, *self._prefilling, *self._running.values()]:
            if not req.future.done():
                req.future.set_exception(err)
        self._waiting, self._prefilling, self._running = [], [], {}

    # ---------------------------------------------------------------- admission
    def _arm(self, req: Request) -> None:
        """Set the slot's sampling state and what its request must prefill (or fork)."""
        s = req.session.slot
        self._slots.arm(s, req.session.cached, req.prompt[-1], req.params)
        body = req.prompt[:-1]  # the decode loop feeds the last token
        req.todo, req.src, req.share, req.entry = body, None, 0, None
        if (
            self.cfg.share_prefixes
            and req.session.cached == 0
            and len(body) >= self.cfg.share_min_tokens
        ):
            tokens = np.asarray(body, np.int32)
            req.src, req.share = self._prefixes.match(tokens, waiting_ok=True)
            req.todo = body[req.share :]
            req.entry = self._prefixes.register(s, tokens, forking=req.src is not None)
        self._prefilling.append(req)

    def _plan_prefill(self) -> tuple[list[tuple], list[Request]]:
        """This iteration's device ops (forks and prefill dispatches, in order) and the requests
        whose input will then be fully cached (they join decoding)."""
        for req in self._prefilling:
            if req.future.done():  # cancelled: its slot's prefix is incomplete
                if req.entry is not None and req.entry.live:
                    self._prefixes.unregister(req.session.slot)
        self._prefilling = [r for r in self._prefilling if not r.future.done()]
        cap = self.cfg.prefill_chunk_tokens
        if cap is None or not self._running:  # nobody decoding: nobody stalls
            cap = float("inf")
        left = {id(r): cap for r in self._prefilling}  # this iteration's allowance per request
        ops: list[tuple] = []
        while True:
            # Forks whose source has written what they need (sources may be prefilled above).
            pairs = self._ready_forks()
            if pairs:
                ops.append(("fork", *programs.fork_args(pairs, self.cfg.max_slots)))
                self.stats["fork_dispatches"] += 1
            # Prefill pieces: at most `cap` tokens of each request this iteration.
            take: dict[int, list[int]] = {}
            for req in self._prefilling:
                if req.src is None and req.todo and left[id(req)] > 0:
                    n = int(min(len(req.todo), left[id(req)]))
                    take[req.session.slot], req.todo = req.todo[:n], req.todo[n:]
                    left[id(req)] -= n
            if not take:
                break
            ops += self._prefill_dispatches(take)
            for req in self._prefilling:
                if req.entry is not None and req.session.slot in take:
                    req.entry.written = int(self._slots.lengths[req.session.slot])
        joined = [r for r in self._prefilling if r.src is None and not r.todo]
        self._prefilling = [r for r in self._prefilling if r.src is not None or r.todo]
        for req in joined:
            req.session.cached = int(self._slots.lengths[req.session.slot])
            req.session.pending = None
            if req.entry is not None:
                req.entry.complete = True
        return ops, joined

    def _ready_forks(self) -> list[tuple[int, int, int]]:
        """``(source slot, slot, positions)`` of the prefilling requests whose source has written
        the positions they share, marked forked; a request whose source was released or went
        stale matches again, one whose source stopped short of its share takes what is there."""
        pairs = []
        for req in self._prefilling:
            src = req.src
            if src is None:
                continue
            if not self._prefixes.valid(src):  # released or stale: look again (or prefill it all)
                req.entry.forking = True  # (not a candidate of its own match)
                req.src, req.share = self._prefixes.match(req.entry.tokens, waiting_ok=False)
                req.todo = req.prompt[req.share : -1]
                req.entry.forking = req.src is not None
                continue
            if src.written < req.share and src.complete:  # cannot grow: take what is there
                req.share = src.written
                req.todo = req.prompt[req.share : -1]
                if req.share < self.cfg.share_min_tokens:
                    req.src, req.share, req.entry.forking = None, 0, False
                    req.todo = req.prompt[:-1]
                    continue
            if src.written >= req.share:
                s = req.session.slot
                pairs.append((src.slot, s, req.share))
                self._slots.lengths[s] = req.share
                req.entry.written, req.entry.forking, req.src = req.share, False, None
                self.stats["shared_tokens"] += req.share
                self.stats["forks"] += 1
        return pairs

    def _prefill_dispatches(self, todo: dict[int, list[int]]) -> list[tuple]:
        """Prefill dispatches writing ``todo[slot]`` at each slot's cached length (bucketed; a
        piece longer than the largest bucket takes several dispatches)."""
        B = self.cfg.max_slots
        dispatches = []
        while any(todo.values()):
            longest = max(len(t) for t in todo.values())
            T = next((b for b in self.cfg.prefill_buckets if b >= longest), None)
            T = T or self.cfg.prefill_buckets[-1]  # longer: several chunks of the largest bucket
            live = [s for s, toks in todo.items() if toks]
            R = next(r for r in self._row_buckets if r >= len(live))
            # R == B: slot s at row s. Else the live slots first, then padding rows that repeat
            # live[0] with no tokens (their writes are dropped).
            slot_rows = list(range(B)) if R == B else live + [live[0]] * (R - len(live))
            rows = None if R == B else np.asarray(slot_rows, np.int32)
            tokens = np.zeros((R, T), np.int32)
            n_valid = np.zeros(R, np.int32)
            for r, s in enumerate(slot_rows[: B if rows is None else len(live)]):
                toks = todo.get(s)
                if toks:
                    take, todo[s] = toks[:T], toks[T:]
                    tokens[r, : len(take)] = take
                    n_valid[r] = len(take)
            dispatches.append(
                ("prefill", tokens, n_valid, self._slots.lengths[slot_rows].copy(), rows)
            )
            np.add.at(self._slots.lengths, slot_rows, n_valid)
            self.stats["prefill_tokens"] += int(n_valid.sum())
            self.stats["prefill_dispatches"] += 1
        return dispatches

    def _run_ops(self, ops: list[tuple]) -> None:
        for kind, *args in ops:
            if kind == "fork":
                self._cache = self._fork(self._cache, *args)
            else:
                self._cache = self._prefill(self._state, self._cache, *args)

    def _plan_decode(self) -> tuple[SlotState, int, np.ndarray | None]:
        """The chunk's slot inputs, attention window and cache rows (``bucket_rows``)."""
        active = np.zeros(self.cfg.max_slots, bool)
        active[list(self._running)] = True
        slots = self._slots.decode_inputs(active, self._recent())
        need = int(self._slots.lengths[active].max()) + self.cfg.decode_chunk
        window = next((w for w in self.cfg.decode_windows if w >= need), self.cfg.max_seq_len)
        rows = bucket_rows(active, self._decode_rows)
        return (slots if rows is None else jax.tree.map(lambda a: a[rows], slots)), window, rows

    def _run_decode(self, slots: SlotState, window: int, rows: np.ndarray | None):
        self._cache, out = self._decoders[window](self._state, self._cache, slots, rows)
        return widen_chunk(jax.device_get(out), rows, self.cfg.max_slots)

    def _recent(self) -> np.ndarray:
        """Int[B LS]: each running turn's last generated tokens, right-aligned, -2 padded."""
        LS = self.cfg.max_stop_sequence_len
        recent = np.full((self.cfg.max_slots, LS), -2, np.int32)
        for slot, req in self._running.items():
            tail = req.tokens[-LS:]
            if tail:
                recent[slot, LS - len(tail) :] = tail
        return recent

    def _collect(self, out) -> None:
        """Append each running row's new tokens; resolve the rows that finished."""
        for slot, req in list(self._running.items()):
            if req.future.done():  # the caller cancelled: stop spending steps on it
                del self._running[slot]
                continue
            n = int(out.emitted[:, slot].sum())
            if n == 0:
                continue
            req.tokens += out.tokens[:n, slot].tolist()
            req.logprobs += out.logprobs[:n, slot].tolist()
            req.sampling_logprobs += out.sampling_logprobs[:n, slot].tolist()
            self._slots.advance(slot, n, req.tokens[-1])
            session = req.session
            session.cached, session.pending = int(self._slots.lengths[slot]), req.tokens[-1]
            code = int(out.finish[slot])
            if code != RUNNING:
                del self._running[slot]
                sp = req.params
                keep_sampling = sp.changes_distribution and not sp.greedy
                if not req.future.done():
                    req.future.set_result(
                        GenerationResult(
                            token_ids=req.tokens,
                            logprobs=req.logprobs,
                            finish_reason=FINISH_NAMES[code],
                            sampling_logprobs=req.sampling_logprobs if keep_sampling else None,
                        )
                    )
