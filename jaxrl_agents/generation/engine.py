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

Shared prefixes (``EngineConfig.share_prefixes``): RL group estimators open G sessions on one
prompt at once. A request of a *new* session (nothing cached) whose prompt body — all but its
last token, which the decode loop feeds — shares a common prefix of at least
``share_min_tokens`` tokens with the body of another live session's first prompt gets those
positions copied from that session's slot by the fork program (``steps.make_fork``: one dispatch
for all forks of an iteration, fixed shapes, compiled once) and prefills only the rest. This works
because sessions only append: positions ``[0, n)`` of a live slot stay valid until it is released.
A host-side registry holds, per live slot, the body of its first prompt and how many of its
positions are written; it is keyed by the body's first ``share_min_tokens`` tokens (candidates)
and by the whole body (exact hits), and the source is the candidate with the longest common
prefix. So identical prompts share everything and prompts that extend a registered one (or only
share its system prompt and tools) share the common part, at token granularity. When the source
is itself being admitted (the G requests of one group arrive together), the first is prefilled
(the leader) and the others fork as soon as it has written the positions they need — within the
same iteration unless chunking spreads the leader over several. Releasing a slot (or cancelling
its prefill) drops its entry; ``update_weights`` makes every entry stale (KV computed under the
old weights is never shared). Later turns are never shared (each session's own continuation),
nor are generated tokens (their KV came from decode steps). Results are those of unshared
prefill: the copied KV is what the request's own prefill would have written (to float rounding
of a different dispatch shape; the tests check tokens and logprobs). ``stats`` counts
``prefill_tokens``, ``shared_tokens`` and ``forks``.

Compiled programs: one prefill program per (length bucket, row bucket) and one decode program per
attention window (``EngineConfig.decode_windows`` + the full cache) that gets used, and with
``share_prefixes`` the fork program (compiled when the engine is built); ``compile_count`` counts
traces of all three kinds (each trace is one XLA compilation); the program that lays the weights
out for unrolled layers is not counted. Under a mesh the slots are sharded over
(``data``, ``fsdp``), KV heads over ``tensor`` when they divide, and the weights as
``jaxrl_agents.sharding`` says; the fork then runs under ``shard_map`` (a copied block moves
between shards by one ``psum``), so it never gathers the cache.

Prefill runs over the smallest row bucket (``EngineConfig.prefill_rows``) that holds the slots with
new tokens when the layers are unrolled and there is no mesh; otherwise over all slots' rows (idle
rows write nothing). Stop sequences are matched within the current turn's generated tokens.
Usage: see ``tests/generation/test_engine_async.py``; benchmarks: ``scripts/bench_sampler.py``,
``scripts/bench_rollout.py`` (group sharing, decode gaps under arrivals).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_agents.generation.config import EngineConfig, GenerationResult, SamplingParams
from jaxrl_agents.generation.sampling import SlotSampling
from jaxrl_agents.generation.steps import (
    FINISH_NAMES,
    RUNNING,
    SlotState,
    make_decode,
    make_fork,
    make_prefill,
    stacked_forward,
)
from jaxrl_agents.models import decoder


class _Request:
    """One ``generate`` call in flight: its tokens, parameters and accumulated output."""

    def __init__(self, session: Session, prompt: list[int], params: SamplingParams, future):
        self.session, self.prompt, self.params, self.future = session, prompt, params, future
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.sampling_logprobs: list[float] = []
        # Admission state (engine-side): tokens still to prefill, the prefix to fork first.
        self.todo: list[int] = []
        self.src: _Prefix | None = None  # fork positions [0, share) from src.slot first
        self.share = 0
        self.entry: _Prefix | None = None  # this request's own registry entry (first turns)


class _Prefix:
    """A registry entry: positions ``[0, written)`` of ``slot`` hold the KV of ``tokens[:written]``
    (``tokens``: the body of the slot's first prompt; ``written`` grows while it is prefilled)."""

    __slots__ = ("slot", "tokens", "written", "version", "live", "complete", "forking")

    def __init__(self, slot: int, tokens: np.ndarray, version: int, forking: bool):
        self.slot, self.tokens, self.version = slot, tokens, version
        self.written = 0
        self.live = True  # False once the slot is released (or its prefill cancelled)
        self.complete = False  # all of tokens written: it cannot grow any more
        self.forking = forking  # waiting for its own fork: not a source yet


class Session:
    """Owns one slot (a KV-cache row) until ``close``. Not for concurrent ``generate`` calls."""

    def __init__(self, engine: Engine, slot: int):
        self._engine, self.slot = engine, slot
        self.cached = 0  # tokens in the slot's cache
        self.pending: int | None = None  # last sampled token: in the context, not yet cached
        self._busy = False
        self._cancelled = False  # a cancelled turn leaves the slot's context undefined
        self.closed = False

    @property
    def length(self) -> int:
        """Tokens in this session's context (cached + the pending last sampled token)."""
        return self.cached + (self.pending is not None)

    async def generate(self, new_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Append ``new_token_ids`` (the prompt on the first call) and generate one turn."""
        if self.closed or self._cancelled:
            why = "closed" if self.closed else "unusable after a cancelled generate (close it)"
            raise RuntimeError(f"session on slot {self.slot} is {why}")
        if self._busy:
            raise RuntimeError(f"session on slot {self.slot} already has a generate in flight")
        new = [int(t) for t in new_token_ids]
        if not new and self.pending is None:
            raise ValueError("the first generate of a session needs a non-empty prompt")
        vocab = self._engine.vocab_size
        bad = [t for t in new if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        if self.length + len(new) >= self._engine.cfg.max_seq_len:
            return GenerationResult(token_ids=[], logprobs=[], finish_reason="cache_full")
        if len(params.stop_token_ids) > self._engine.cfg.max_stop_ids:
            raise ValueError(
                f"{len(params.stop_token_ids)} stop ids > EngineConfig.max_stop_ids="
                f"{self._engine.cfg.max_stop_ids}"
            )
        cfg = self._engine.cfg
        if len(params.stop_sequences) > cfg.max_stop_sequences or any(
            len(q) > cfg.max_stop_sequence_len for q in params.stop_sequences
        ):
            raise ValueError(
                f"stop_sequences={params.stop_sequences} exceed EngineConfig.max_stop_sequences="
                f"{cfg.max_stop_sequences} / max_stop_sequence_len={cfg.max_stop_sequence_len}"
            )
        prompt = ([self.pending] if self.pending is not None else []) + new
        self._busy = True
        try:
            return await self._engine._submit(self, prompt, params)
        except asyncio.CancelledError:
            self._cancelled = True
            raise
        finally:
            self._busy = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._engine._release(self)


class Engine:
    """Continuous-batching sampler over a ``Transformer``; use as ``async with Engine(...)``."""

    def __init__(self, model: nnx.Module, cfg: EngineConfig, *, mesh: Mesh | None = None):
        self.cfg, self.mesh = cfg, mesh
        mcfg = model.cfg
        self.vocab_size = mcfg.vocab_size
        B = cfg.max_slots
        graphdef, state = nnx.split(model)
        self._graphdef = graphdef
        unroll = cfg.unroll_layers
        unrolled_default = jax.default_backend() in ("cpu", "gpu")  # measured faster on both
        self.unrolled = unrolled_default if unroll is None else bool(unroll)
        init = decoder.init_layer_cache if self.unrolled else decoder.init_cache
        cache = init(mcfg, batch=B, max_len=cfg.max_seq_len, dtype=cfg.cache_dtype)
        cache_sharding = None
        if mesh is not None:
            from jaxrl_agents import sharding as shd

            slot_axes = shd.LOGICAL_AXIS_RULES["batch"]
            slot_axes = (slot_axes,) if isinstance(slot_axes, str) else tuple(slot_axes or ())
            n_slot_shards = int(np.prod([mesh.shape[a] for a in slot_axes]))
            if B % n_slot_shards:
                raise ValueError(
                    f"max_slots={B} must be a multiple of {'*'.join(slot_axes)}={n_slot_shards} "
                    f"of mesh {dict(mesh.shape)}"
                )

            def place(buffers, axes):  # a stacked buffer or a tuple of per-layer ones
                return jax.tree.map(
                    lambda a: shd.logical_sharding(axes, mesh, shape=a.shape), buffers
                )

            k_axes, v_axes = decoder.cache_axes(cache)
            ks, vs = place(cache.k, k_axes), place(cache.v, v_axes)
            lengths = shd.logical_sharding(("batch",), mesh, shape=(B,))
            cache_sharding = type(cache)(k=ks, v=vs, lengths=lengths)
            cache = jax.device_put(cache, cache_sharding)
            # Parameters already placed (load_pretrained(mesh=...)) are not moved.
            state = jax.device_put(state, shd.param_shardings(state, mesh))
        self._model_state = state  # the structure update_weights validates against
        if self.unrolled:
            # One program re-lays the weights out (per-layer, compute dtype) on every update.
            merge = cfg.merge_lora
            self._relayout = jax.jit(
                lambda st: decoder.decode_weights(nnx.merge(graphdef, st), merge_lora=merge)
            )
            hidden = functools.partial(decoder.forward_unrolled, mcfg)
            logits = decoder.logits_unrolled
            state = self._relayout(state)
        elif mcfg.lora is not None and cfg.merge_lora:
            # The model's own layer scan over the base weights with the adapters folded in.
            from jaxrl_agents.models.lora import merge_lora

            self._relayout = jax.jit(lambda st: nnx.state(merge_lora(nnx.merge(graphdef, st))))
            hidden, logits = stacked_forward(nnx.graphdef(merge_lora(model)))
            state = self._relayout(state)
        else:
            self._relayout = None
            hidden, logits = stacked_forward(graphdef)
        # Row-compacted prefill: unrolled layers without a mesh (under a mesh the slots are
        # sharded and a prefill keeps every shard busy with its own rows).
        self._row_buckets = cfg.prefill_rows if self.unrolled and mesh is None else (B,)
        self._state = state
        self._cache = cache
        self._traces = 0
        self._trace_lock = threading.Lock()
        self._prefill = jax.jit(
            make_prefill(hidden, on_trace=self._count, cache_constraint=cache_sharding),
            donate_argnums=1,
        )
        # One decode program per attention window, jitted lazily (compiled on first use).
        self._decoders = {
            w: jax.jit(
                make_decode(
                    hidden,
                    logits,
                    chunk=cfg.decode_chunk,
                    max_seq_len=cfg.max_seq_len,
                    window=w,
                    on_trace=self._count,
                    cache_constraint=cache_sharding,
                ),
                donate_argnums=1,
            )
            for w in (*cfg.decode_windows, cfg.max_seq_len)
        }
        self._fork = None
        if cfg.share_prefixes:
            self._fork = jax.jit(
                make_fork(on_trace=self._count, cache_constraint=cache_sharding), donate_argnums=0
            )
            # Compiled now (a no-op call), so the first fork never stalls decoding on a compile.
            self._cache = self._fork(self._cache, *self._fork_args([]))
        # Host mirrors of per-slot state; the device sees them as inputs of each dispatch.
        self._lengths = np.zeros(B, np.int32)
        self._last = np.zeros(B, np.int32)
        self._n_gen = np.zeros(B, np.int32)
        self._max_new = np.ones(B, np.int32)
        self._stop = np.full((B, cfg.max_stop_ids), -1, np.int32)
        self._stop_seqs = np.full(
            (B, cfg.max_stop_sequences, cfg.max_stop_sequence_len), -1, np.int32
        )
        self._seed = np.zeros(B, np.uint32)
        self._temp = np.ones(B, np.float32)
        self._top_k = np.zeros(B, np.int32)
        self._top_p = np.ones(B, np.float32)
        self._min_p = np.zeros(B, np.float32)
        self._running: dict[int, _Request] = {}  # slot -> request being decoded
        self._waiting: list[_Request] = []  # requests to arm at the next boundary
        self._prefilling: list[_Request] = []  # armed, input not fully cached yet (FIFO)
        self._free = list(range(B))
        # Prefix registry (share_prefixes): slot -> entry, and the two indexes of _match.
        self._entries: dict[int, _Prefix] = {}
        self._by_head: dict[bytes, list[_Prefix]] = {}
        self._by_body: dict[bytes, list[_Prefix]] = {}
        self._version = 0  # bumped by update_weights: older entries are never shared
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
        old_leaves, old_tree = jax.tree.flatten(self._model_state)
        new_leaves, new_tree = jax.tree.flatten(state)
        if old_tree != new_tree:
            raise ValueError("update_weights: state structure differs from the engine's model")
        for i, (a, b) in enumerate(zip(old_leaves, new_leaves, strict=True)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"update_weights: leaf {i} is {b.shape} {b.dtype}, expected {a.shape} {a.dtype}"
                )
        new_leaves = [
            jax.device_put(b, a.sharding) if isinstance(a, jax.Array) else b
            for a, b in zip(old_leaves, new_leaves, strict=True)
        ]
        state = jax.tree.unflatten(old_tree, new_leaves)
        self._version += 1  # cached prefixes were computed under the old weights
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
            await self._slot_freed.wait_for(lambda: bool(self._free))
            slot = self._free.pop(0)
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
        req = _Request(session, prompt, params, self._loop.create_future())
        self._waiting.append(req)
        self._wake.set()
        return await req.future

    async def _release(self, session: Session) -> None:
        for req in [self._running.pop(session.slot, None), *self._waiting, *self._prefilling]:
            if req is not None and req.session is session and not req.future.done():
                req.future.set_exception(RuntimeError(f"session on slot {session.slot} closed"))
        self._waiting = [r for r in self._waiting if r.session is not session]
        self._prefilling = [r for r in self._prefilling if r.session is not session]
        self._unregister(session.slot)
        async with self._slot_freed:
            self._free.append(session.slot)
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
                    slots, window = self._plan_decode()
                    out = await asyncio.to_thread(self._run_decode, slots, window)
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

    # ------------------------------------------------------------ prefix registry
    def _key(self, tokens: np.ndarray) -> bytes:
        return tokens[: self.cfg.share_min_tokens].tobytes()

    def _register(self, slot: int, tokens: np.ndarray, *, forking: bool) -> _Prefix:
        self._unregister(slot)
        entry = _Prefix(slot, tokens, self._version, forking)
        self._entries[slot] = entry
        self._by_head.setdefault(self._key(tokens), []).append(entry)
        self._by_body.setdefault(tokens.tobytes(), []).append(entry)
        return entry

    def _unregister(self, slot: int) -> None:
        entry = self._entries.pop(slot, None)
        if entry is None:
            return
        entry.live = False
        for index, key in ((self._by_head, self._key(entry.tokens)), (self._by_body, None)):
            key = entry.tokens.tobytes() if key is None else key
            bucket = index[key]
            bucket.remove(entry)
            if not bucket:
                del index[key]

    def _valid(self, entry: _Prefix) -> bool:
        return entry.live and entry.version == self._version

    def _match(self, body: np.ndarray, *, waiting_ok: bool) -> tuple[_Prefix | None, int]:
        """The registered prefix with the longest common prefix with ``body`` (ties: the most
        written, then the oldest), and that length; (None, 0) below ``share_min_tokens``.

        ``waiting_ok``: entries still waiting for their own fork count too. Only a request's
        first match may use them: entries then point to older ones, so waits cannot form a
        cycle; a re-match (its source was released) takes only entries that wait for nobody.
        """
        if len(body) < self.cfg.share_min_tokens:
            return None, 0

        def usable(e: _Prefix) -> bool:
            return self._valid(e) and (waiting_ok or not e.forking)

        exact = [e for e in self._by_body.get(body.tobytes(), ()) if usable(e)]
        if exact:
            return max(exact, key=lambda e: e.written), len(body)
        best, best_n = None, 0
        for e in self._by_head.get(self._key(body), ()):
            if not usable(e):
                continue
            k = min(len(body), len(e.tokens))
            diff = np.flatnonzero(body[:k] != e.tokens[:k])
            n = int(diff[0]) if diff.size else k
            if n > best_n or (n == best_n and best is not None and e.written > best.written):
                best, best_n = e, n
        if best_n < self.cfg.share_min_tokens:
            return None, 0
        return best, best_n

    # ---------------------------------------------------------------- admission
    def _arm(self, req: _Request) -> None:
        """Set the slot's sampling state and what its request must prefill (or fork)."""
        s, sp = req.session.slot, req.params
        self._lengths[s] = req.session.cached
        self._last[s] = req.prompt[-1]
        self._n_gen[s] = 0
        self._max_new[s] = sp.max_new_tokens
        self._stop[s] = -1
        self._stop[s, : len(sp.stop_token_ids)] = sp.stop_token_ids
        self._stop_seqs[s] = -1
        for q, seq in enumerate(sp.stop_sequences):
            self._stop_seqs[s, q, self._stop_seqs.shape[2] - len(seq) :] = seq
        self._seed[s] = np.uint32(sp.seed & 0xFFFFFFFF)
        self._temp[s] = sp.temperature
        self._top_k[s], self._top_p[s], self._min_p[s] = sp.top_k, sp.top_p, sp.min_p
        body = req.prompt[:-1]  # the decode loop feeds the last token
        req.todo, req.src, req.share, req.entry = body, None, 0, None
        if (
            self.cfg.share_prefixes
            and req.session.cached == 0
            and len(body) >= self.cfg.share_min_tokens
        ):
            tokens = np.asarray(body, np.int32)
            req.src, req.share = self._match(tokens, waiting_ok=True)
            req.todo = body[req.share :]
            req.entry = self._register(s, tokens, forking=req.src is not None)
        self._prefilling.append(req)

    def _plan_prefill(self) -> tuple[list[tuple], list[_Request]]:
        """This iteration's device ops (forks and prefill dispatches, in order) and the requests
        whose input will then be fully cached (they join decoding)."""
        for req in self._prefilling:
            if req.future.done():  # cancelled: its slot's prefix is incomplete
                if req.entry is not None and req.entry.live:
                    self._unregister(req.session.slot)
        self._prefilling = [r for r in self._prefilling if not r.future.done()]
        cap = self.cfg.prefill_chunk_tokens
        if cap is None or not self._running:  # nobody decoding: nobody stalls
            cap = float("inf")
        left = {id(r): cap for r in self._prefilling}  # this iteration's allowance per request
        ops: list[tuple] = []
        while True:
            # Forks whose source has written what they need (sources may be prefilled above).
            pairs = []
            for req in self._prefilling:
                src = req.src
                if src is None:
                    continue
                if not self._valid(src):  # released or stale: look again (or prefill it all)
                    req.entry.forking = True  # (not a candidate of its own match)
                    req.src, req.share = self._match(req.entry.tokens, waiting_ok=False)
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
                    self._lengths[s] = req.share
                    req.entry.written, req.entry.forking, req.src = req.share, False, None
                    self.stats["shared_tokens"] += req.share
                    self.stats["forks"] += 1
            if pairs:
                ops.append(("fork", *self._fork_args(pairs)))
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
                    req.entry.written = int(self._lengths[req.session.slot])
        joined = [r for r in self._prefilling if r.src is None and not r.todo]
        self._prefilling = [r for r in self._prefilling if r.src is not None or r.todo]
        for req in joined:
            req.session.cached = int(self._lengths[req.session.slot])
            req.session.pending = None
            if req.entry is not None:
                req.entry.complete = True
        return ops, joined

    def _fork_args(self, pairs: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
        """(src, dst, n, count) of the fork program, padded to ``max_slots`` pairs."""
        src, dst, n = np.zeros((3, self.cfg.max_slots), np.int32)
        for i, (a, b, k) in enumerate(pairs):
            src[i], dst[i], n[i] = a, b, k
        return src, dst, n, np.int32(len(pairs))

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
            dispatches.append(("prefill", tokens, n_valid, self._lengths[slot_rows].copy(), rows))
            np.add.at(self._lengths, slot_rows, n_valid)
            self.stats["prefill_tokens"] += int(n_valid.sum())
            self.stats["prefill_dispatches"] += 1
        return dispatches

    def _run_ops(self, ops: list[tuple]) -> None:
        for kind, *args in ops:
            if kind == "fork":
                self._cache = self._fork(self._cache, *args)
            else:
                self._cache = self._prefill(self._state, self._cache, *args)

    def _plan_decode(self) -> tuple[SlotState, int]:
        active = np.zeros(self.cfg.max_slots, bool)
        active[list(self._running)] = True
        slots = SlotState(
            lengths=self._lengths.copy(),
            last_token=self._last.copy(),
            active=active,
            n_generated=self._n_gen.copy(),
            max_new=self._max_new.copy(),
            stop_ids=self._stop.copy(),
            stop_seqs=self._stop_seqs.copy(),
            recent=self._recent(),
            sampling=SlotSampling(
                seed=self._seed.copy(),
                temperature=self._temp.copy(),
                top_k=self._top_k.copy(),
                top_p=self._top_p.copy(),
                min_p=self._min_p.copy(),
            ),
        )
        need = int(self._lengths[active].max()) + self.cfg.decode_chunk
        window = next((w for w in self.cfg.decode_windows if w >= need), self.cfg.max_seq_len)
        return slots, window

    def _recent(self) -> np.ndarray:
        """Int[B LS]: each running turn's last generated tokens, right-aligned, -2 padded."""
        LS = self.cfg.max_stop_sequence_len
        recent = np.full((self.cfg.max_slots, LS), -2, np.int32)
        for slot, req in self._running.items():
            tail = req.tokens[-LS:]
            if tail:
                recent[slot, LS - len(tail) :] = tail
        return recent

    def _run_decode(self, slots: SlotState, window: int):
        self._cache, out = self._decoders[window](self._state, self._cache, slots)
        return jax.device_get(out)

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
            self._lengths[slot] += n  # each step cached the token it fed
            self._n_gen[slot] += n
            self._last[slot] = req.tokens[-1]
            session = req.session
            session.cached, session.pending = int(self._lengths[slot]), req.tokens[-1]
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
