"""The engine's jitted programs: bucketed prefill, a multi-token decode loop, a prefix fork.

Prefill and decode take the model's parameters as ONE pytree argument, so dispatch cost does not
grow with depth; all three donate the KV cache so its buffers are reused in place. The forward
itself is passed in: ``Transformer.hidden_states`` over ``nnx.split``'s state (stacked layers
under a scan, the cache ``[L B K S Dh]``), or ``models.decoder.forward_unrolled`` over
``decode_weights`` (layers unrolled, one ``[B K S Dh]`` buffer per layer; see
``EngineConfig.unroll_layers``). Host-side bookkeeping (which slot holds what) lives in
``engine.py``; these functions only see fixed-shape arrays:

- ``prefill(state, cache, tokens Int['R T'], n_valid Int['R'], lengths Int['R'], rows) -> cache``
  writes ``tokens[r, :n_valid[r]]`` at ``lengths[r]...`` of cache row ``rows[r]`` (``rows`` None:
  R = B and row r is slot r; rows with ``n_valid == 0`` are untouched). Only the unrolled forward
  takes ``rows``: a prefill then computes over the slots that have new tokens, not all of them.
  It computes no logits: the last token of a request is fed by the decode loop, which samples
  from it, so prefill never pays for the LM head.
- ``decode(state, cache, slots: SlotState) -> (cache, ChunkOut)`` runs up to ``chunk`` steps of a
  ``lax.while_loop``: feed each active row's last token, sample the next, stop rows on a stop id,
  on ``max_new`` or when the slot's context is full; exit early when no row is active. It is
  compiled per attention *window* (a bucket of the longest active context), so short contexts in
  a long cache do not pay for reading all of it at every step.
- ``fork(cache, src Int['P'], dst Int['P'], n Int['P'], count) -> cache`` copies cache positions
  ``[0, n[i])`` of row ``src[i]`` into row ``dst[i]`` for ``i < count`` (a prompt prefix shared by
  sessions: see ``engine.py``). Fixed shapes (``P`` = slots), so it compiles once; the copy runs
  in blocks of positions and costs O(sum n), not O(count * max_seq_len).

Host-authoritative lengths: the caller passes ``lengths`` in every call (the cache's own field is
overwritten), so resetting a slot for a new session costs nothing on device.
Exercised through the engine: ``pytest tests/generation``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxrl_agents.generation.sampling import SlotSampling, sample
from jaxrl_agents.models.decoder import cache_axes, cache_seq_axes

Array = jax.Array

# Finish codes written by the decode loop (0 = still running).
RUNNING, STOP, LENGTH, CACHE_FULL = 0, 1, 2, 3
FINISH_NAMES = {STOP: "stop", LENGTH: "length", CACHE_FULL: "cache_full"}


class SlotState(NamedTuple):
    """Per-slot inputs of a decode chunk (leading axis = slots)."""

    lengths: Array  # Int[B]: tokens already in the cache
    last_token: Array  # Int[B]: next token to feed (sampled or last of a prompt; not cached yet)
    active: Array  # Bool[B]
    n_generated: Array  # Int[B]: tokens generated so far in this turn
    max_new: Array  # Int[B]
    stop_ids: Array  # Int[B NS], padded with -1
    stop_seqs: Array  # Int[B NQ LS]: right-aligned stop sequences, -1 = wildcard (left padding)
    recent: Array  # Int[B LS]: this turn's last generated tokens, right-aligned, -2 padded
    sampling: SlotSampling


class ChunkOut(NamedTuple):
    tokens: Array  # Int[C B]
    logprobs: Array  # Float[C B]: policy (T=1, unfiltered)
    sampling_logprobs: Array  # Float[C B]
    emitted: Array  # Bool[C B]: row was active at that step (a prefix per row)
    finish: Array  # Int[B]: finish code per row (RUNNING if it may continue)


def _ends_with_any(recent: Array, seqs: Array) -> Array:
    """Bool[B]: ``recent`` (Int[B LS]) ends with one of the right-aligned ``seqs`` (Int[B NQ LS];
    -1 entries are wildcards, an all -1 row is an unused entry)."""
    hit = (seqs == -1) | (seqs == recent[:, None, :])
    used = jnp.any(seqs != -1, axis=-1)
    return jnp.any(jnp.all(hit, axis=-1) & used, axis=-1)


Hidden = Callable[..., tuple[Array, Any]]  # (state, tokens, positions, *, segment_ids, cache)
Logits = Callable[[Any, Array], Array]  # (state, Float['B T D']) -> Float32['B T V']


def stacked_forward(graphdef: nnx.GraphDef) -> tuple[Hidden, Logits]:
    """The model's own forward over ``nnx.split`` state (layers under ``lax.scan``)."""

    def hidden(state, tokens, positions, *, segment_ids, cache, rows=None):
        if rows is not None:
            raise ValueError("the stacked forward prefills all rows (rows=None)")
        model = nnx.merge(graphdef, state)
        return model.hidden_states(tokens, positions, segment_ids=segment_ids, cache=cache)

    def logits(state, h):
        return nnx.merge(graphdef, state).logits_from_hidden(h)

    return hidden, logits


def make_prefill(
    hidden: Hidden, *, on_trace: Callable[[], None], cache_constraint: Any = None
) -> Callable:
    """The prefill program (not yet jitted): see the module docstring."""

    def prefill(state, cache, tokens: Array, n_valid: Array, lengths: Array, rows=None):
        on_trace()
        T = tokens.shape[1]
        t = jnp.arange(T, dtype=jnp.int32)[None, :]
        full_lengths = cache.lengths  # [B]; host-authoritative, so any value will do
        cache = cache._replace(lengths=lengths)
        segment_ids = (t < n_valid[:, None]).astype(jnp.int32)
        kw = {} if rows is None else {"rows": rows}
        # The final hidden states are unused: XLA drops the final norm; no LM head is traced.
        _, cache = hidden(
            state, tokens, lengths[:, None] + t, segment_ids=segment_ids, cache=cache, **kw
        )
        cache = cache._replace(lengths=full_lengths)
        if cache_constraint is not None:
            cache = lax.with_sharding_constraint(cache, cache_constraint)
        return cache

    return prefill


def make_decode(
    hidden: Hidden,
    logits_fn: Logits,
    *,
    chunk: int,
    max_seq_len: int,
    window: int,
    on_trace: Callable[[], None],
    cache_constraint: Any = None,
) -> Callable:
    """The decode-chunk program (not yet jitted): see the module docstring.

    ``window``: the steps attend over (and write into) cache positions ``[0, window)`` only — a
    copy taken once per chunk and written back after it — so a decode step costs O(window), not
    O(max_seq_len). The caller picks ``window >= lengths + chunk`` for every active row.
    """

    def decode(state, full_cache, slots: SlotState, rows: Array | None = None):
        on_trace()
        B = slots.lengths.shape[0]
        k_axis, v_axis = cache_seq_axes(full_cache)
        windowed = window < jax.tree.leaves(full_cache.v)[0].shape[v_axis]
        cache = full_cache
        if rows is not None:  # ``slots`` are cache rows ``rows`` (distinct; per-layer buffers)
            cache = _take_rows(full_cache, rows, window, k_axis, v_axis)
        elif windowed:
            cache = _cut_window(full_cache, window, k_axis, v_axis)
        out = _empty_chunk(chunk, B)
        cache = cache._replace(lengths=slots.lengths)

        def cond(carry):
            i, _, _, active, _, _, _ = carry
            return (i < chunk) & jnp.any(active)

        def body(carry):
            i, cache, last, active, n_gen, recent, out = carry
            h, cache = hidden(
                state,
                last[:, None],
                cache.lengths[:, None],
                segment_ids=active[:, None].astype(jnp.int32),
                cache=cache,
            )
            logits = logits_fn(state, h)
            # cache.lengths now counts the fed token: it is the sampled token's position.
            s = sample(logits[:, 0], slots.sampling, cache.lengths)
            n_gen = n_gen + active
            recent = jnp.concatenate([recent[:, 1:], s.token[:, None]], axis=1)
            is_stop = jnp.any(s.token[:, None] == slots.stop_ids, axis=-1) | _ends_with_any(
                recent, slots.stop_seqs
            )
            reason = _finish_reason(is_stop, n_gen, slots.max_new, cache.lengths, max_seq_len)
            out = ChunkOut(
                tokens=out.tokens.at[i].set(s.token),
                logprobs=out.logprobs.at[i].set(s.logprob),
                sampling_logprobs=out.sampling_logprobs.at[i].set(s.sampling_logprob),
                emitted=out.emitted.at[i].set(active),
                finish=jnp.where(active, reason, out.finish),
            )
            last = jnp.where(active, s.token, last)
            return i + 1, cache, last, active & (reason == RUNNING), n_gen, recent, out

        carry = (
            jnp.int32(0),
            cache,
            slots.last_token,
            slots.active,
            slots.n_generated,
            slots.recent,
            out,
        )
        _, cache, _, _, _, _, out = lax.while_loop(cond, body, carry)
        if rows is not None:
            cache = _put_rows(full_cache, cache, rows, k_axis, v_axis)
        elif windowed:
            cache = _put_window(full_cache, cache, k_axis, v_axis)
        if cache_constraint is not None:
            cache = lax.with_sharding_constraint(cache, cache_constraint)
        return cache, out

    return decode


def _cut_window(full_cache: Any, window: int, k_axis: int, v_axis: int) -> Any:
    """``full_cache`` with its keys and values cut to positions ``[0, window)``."""

    def cut(tree, axis):
        return jax.tree.map(lambda a: lax.slice_in_dim(a, 0, window, axis=axis), tree)

    return full_cache._replace(k=cut(full_cache.k, k_axis), v=cut(full_cache.v, v_axis))


def _put_window(full_cache: Any, cache: Any, k_axis: int, v_axis: int) -> Any:
    """``cache`` (a window from :func:`_cut_window`) with its keys and values written back into
    ``full_cache``'s at position 0."""

    def put(full, part, axis):
        return jax.tree.map(
            lambda f, p: lax.dynamic_update_slice_in_dim(f, p, 0, axis=axis), full, part
        )

    return cache._replace(
        k=put(full_cache.k, cache.k, k_axis), v=put(full_cache.v, cache.v, v_axis)
    )


def widen_chunk(out: ChunkOut, rows: np.ndarray | None, n_slots: int) -> ChunkOut:
    """A host ``ChunkOut`` over cache rows ``rows`` laid out over all ``n_slots`` slots (the
    other slots' columns are zeros: nothing emitted); as it is when ``rows`` is None."""
    if rows is None:
        return out

    def widen(a):
        full = np.zeros((*a.shape[:-1], n_slots), a.dtype)
        full[..., rows] = a
        return full

    return ChunkOut(*(widen(a) for a in out))


def _take_rows(full_cache: Any, rows: Array, window: int, k_axis: int, v_axis: int) -> Any:
    """Cache rows ``rows`` (the leading axis of every buffer) cut to positions ``[0, window)``."""

    def take(tree, axis):
        return jax.tree.map(
            lambda a: lax.slice_in_dim(
                jnp.take(a, rows, axis=0), 0, min(window, a.shape[axis]), axis=axis
            ),
            tree,
        )

    return full_cache._replace(k=take(full_cache.k, k_axis), v=take(full_cache.v, v_axis))


def _put_rows(full_cache: Any, cache: Any, rows: Array, k_axis: int, v_axis: int) -> Any:
    """``cache`` (rows from :func:`_take_rows`) written back into ``full_cache``'s rows ``rows``
    at position 0 (``rows`` are distinct)."""

    def put(full, part, axis):
        def one(f, p):
            index = [slice(None)] * f.ndim
            index[0], index[axis] = rows, slice(0, p.shape[axis])
            return f.at[tuple(index)].set(p, unique_indices=True)

        return jax.tree.map(one, full, part)

    return full_cache._replace(  # lengths: the host's are the truth (as after a prefill)
        k=put(full_cache.k, cache.k, k_axis), v=put(full_cache.v, cache.v, v_axis)
    )


def _empty_chunk(chunk: int, B: int) -> ChunkOut:
    """The all-zero output of a ``chunk``-step decode over ``B`` slots."""
    return ChunkOut(
        tokens=jnp.zeros((chunk, B), jnp.int32),
        logprobs=jnp.zeros((chunk, B), jnp.float32),
        sampling_logprobs=jnp.zeros((chunk, B), jnp.float32),
        emitted=jnp.zeros((chunk, B), bool),
        finish=jnp.zeros((B,), jnp.int32),
    )


def _finish_reason(
    is_stop: jax.Array, n_gen: jax.Array, max_new: jax.Array, lengths: jax.Array, max_seq_len: int
) -> jax.Array:
    """Per row: STOP, else LENGTH (``max_new`` tokens generated), else CACHE_FULL (the next
    position would pass ``max_seq_len``), else RUNNING."""
    return jnp.where(
        is_stop,
        STOP,
        jnp.where(
            n_gen >= max_new,
            LENGTH,
            jnp.where(lengths + 1 >= max_seq_len, CACHE_FULL, RUNNING),
        ),
    )


def make_fork(
    *, block: int = 64, on_trace: Callable[[], None], cache_constraint: Any = None
) -> Callable:
    """The prefix-fork program (not yet jitted; donate the cache): see the module docstring.

    Pair ``i`` copies ``ceil(n[i] / block)`` blocks of ``block`` positions (a block that would
    run past the end is clamped back, identically for source and destination): positions at and
    past ``n[i]`` of the destination may be overwritten too, so a destination row must hold
    nothing valid there (the engine forks only into rows of new sessions, before their prefill).
    ``cache_constraint`` (the cache's ``NamedSharding``s): when it shards the slots, the copy runs
    under ``shard_map`` — each block comes from the source row's shard by one ``psum`` of the
    block — rather than letting the partitioner gather the whole cache for a dynamic row index.
    """

    def fork(cache, src: Array, dst: Array, n: Array, count: Array):
        on_trace()
        k_axes, v_axes = cache_axes(cache)
        ks, k_def = jax.tree.flatten(cache.k)
        vs, v_def = jax.tree.flatten(cache.v)
        axes = [k_axes] * len(ks) + [v_axes] * len(vs)
        bufs = tuple(ks) + tuple(vs)
        slot_axes = None
        if cache_constraint is not None:
            shardings = jax.tree.leaves(cache_constraint.k) + jax.tree.leaves(cache_constraint.v)
            specs = tuple(sh.spec for sh in shardings)
            b_ax = k_axes.index("batch")
            slot_axes = specs[0][b_ax] if len(specs[0]) > b_ax else None
        if slot_axes is None:
            bufs = _copy_prefixes(bufs, axes, src, dst, n, count, block, None)
        else:
            P = jax.sharding.PartitionSpec
            bufs = jax.shard_map(
                lambda b, *a: _copy_prefixes(b, axes, *a, block, slot_axes),
                mesh=shardings[0].mesh,
                in_specs=(specs, P(), P(), P(), P()),
                out_specs=specs,
                check_vma=False,
            )(bufs, src, dst, n, count)
        cache = cache._replace(
            k=jax.tree.unflatten(k_def, bufs[: len(ks)]),
            v=jax.tree.unflatten(v_def, bufs[len(ks) :]),
        )
        if cache_constraint is not None:
            cache = lax.with_sharding_constraint(cache, cache_constraint)
        return cache

    return fork


def _copy_prefixes(bufs, axes, src, dst, n, count, block, slot_axes):
    """``make_fork``'s copy over (local) buffers; ``slot_axes``: the mesh axes the slots are
    sharded over (inside ``shard_map``; rows are global indices), None: unsharded."""
    b0, s0 = axes[0].index("batch"), axes[0].index("cache_seq")
    rows, blk = bufs[0].shape[b0], min(block, bufs[0].shape[s0])
    lo = 0 if slot_axes is None else lax.axis_index(slot_axes) * rows

    def copy_block(j, bufs, s, d):
        s, d = s - lo, d - lo  # local rows (outside [0, rows): another shard's)

        def window(buf, ax, row):
            start = [jnp.int32(0)] * buf.ndim
            start[ax.index("batch")] = jnp.clip(row, 0, rows - 1)
            start[ax.index("cache_seq")] = (j * blk).astype(jnp.int32)
            size = list(buf.shape)
            size[ax.index("batch")], size[ax.index("cache_seq")] = 1, blk
            return start, size

        pieces = [lax.dynamic_slice(b, *window(b, ax, s)) for b, ax in zip(bufs, axes, strict=True)]
        if slot_axes is not None:  # the source shard's blocks, everywhere
            own = (s >= 0) & (s < rows)
            pieces = lax.psum([jnp.where(own, p, jnp.zeros_like(p)) for p in pieces], slot_axes)
            mine = (d >= 0) & (d < rows)
            pieces = [
                jnp.where(mine, p, lax.dynamic_slice(b, *window(b, ax, d)))
                for p, b, ax in zip(pieces, bufs, axes, strict=True)
            ]
        return tuple(
            lax.dynamic_update_slice(b, p, window(b, ax, d)[0])
            for p, b, ax in zip(pieces, bufs, axes, strict=True)
        )

    def pair(i, bufs):
        n_blocks = (n[i] + blk - 1) // blk
        return lax.fori_loop(0, n_blocks, lambda j, b: copy_block(j, b, src[i], dst[i]), bufs)

    return lax.fori_loop(0, count, pair, tuple(bufs))
