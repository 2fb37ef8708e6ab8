"""The rollout collector: tasks -> groups of episodes -> trajectories -> packed device batches.

Training and evaluation both collect through here, so the :class:`Orchestrator` is constructed in
one place (:meth:`Collector.orchestrator`) and the sampling settings come from one place (the
``rollout`` config group: temperature, top-k, top-p, min-p; greedy for evaluation).

Device batches pack several episodes per row by default (``rollout.packing.plan_rows``: first-fit
decreasing into rows of a length bucket, the row count from a ladder of multiples of what the
update splits rows by); ``pack=False`` keeps one episode per row.

Multi-host (``jax.distributed``): each process runs a contiguous share of the tasks, all samples
of a task included, on its own process-local engine. :meth:`Collector.device_batch` packs this
process's episodes into its rows of the global batch, with group and anchor ids made global
(disjoint across processes), episode placements pointing at global rows, and one shape agreed by
every process (the shapes of a global batch must match: the processes all-gather their episodes'
lengths and compute the same plan). :meth:`Collector.everyone` all-gathers episodes, so every
process reports the same numbers. With one process all of this is the identity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.batches import EpisodeArrays, TrainBatch
from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
from jaxrl_agents.rollout.packing import Packed, bucket_for, clear_loss, pack_sft, plan_rows
from jaxrl_agents.rollout.packing import pack as pack_episodes
from jaxrl_agents.types import EndReason, Task, Trajectory


class Rollout(NamedTuple):
    """This process's episodes of one collection (ordered by task, then sample)."""

    trajectories: list[Trajectory]
    first_task: int
    """Index of this process's first task among all processes' tasks."""
    seconds: float


class DeviceBatch(NamedTuple):
    """One RL step's rows on the mesh (global arrays) plus host-side counts over all processes."""

    batch: TrainBatch
    episodes: EpisodeArrays
    truncated: int
    """Trajectories cut to the largest sequence bucket (all processes)."""
    sampled_tokens: int
    """Policy-sampled tokens in the batch (all processes)."""
    dropped: int
    """Episodes left out of the update (all processes): ``reward_error`` or no tokens at all."""
    overlong_masked: int = 0
    """Episodes cut off by a length limit whose loss was masked (``mask_overlong``)."""
    real_frac: float = 1.0
    """Episode positions / computed positions of the global batch (packing efficiency)."""


def trainable(traj: Trajectory) -> bool:
    """Whether an episode takes part in the update: it has tokens and a finite, computed reward
    (``reward_error`` episodes are kept for the record only)."""
    return traj.end_reason != EndReason.REWARD_ERROR and len(traj.token_ids) >= 2


@dataclasses.dataclass
class Collector:
    """Runs episodes for training and evaluation and turns them into device batches.

    Args:
      chat: the policy's ``ChatFormat`` (templates, stop and pad ids).
      env_factory: a fresh ``Env`` per episode.
      rollout: episode limits and sampling settings.
      reward: a ``RewardComposer`` (``acompute(traj)``), or None (no scores: SFT golden data).
      seq_buckets: padded lengths of training rows.
      sharding: the batch sharding of the training mesh (None: default device).
    """

    chat: Any
    env_factory: Callable[[], Any]
    rollout: RolloutConfig
    reward: Any = None
    seq_buckets: Sequence[int] = (128, 256, 384, 512)
    sharding: Any = None
    orchestrator_cls: ClassVar[type[Orchestrator]] = Orchestrator
    """What :meth:`orchestrator` builds (a subclass may record or instrument episodes)."""

    # -- episodes -------------------------------------------------------------------------------
    def sampling(self, *, greedy: bool) -> Callable[[int, int], Any]:
        """``(max_new_tokens, seed) -> SamplingParams``: the rollout group's settings, or greedy."""
        from jaxrl_agents.generation import Sampling, SamplingParams

        stop = tuple(self.chat.stop_token_ids)
        dist = dataclasses.asdict(Sampling(temperature=0.0) if greedy else self.rollout.sampling)

        def make(max_new_tokens: int, seed: int) -> SamplingParams:
            return SamplingParams(
                **dist, max_new_tokens=max_new_tokens, stop_token_ids=stop, seed=seed
            )

        return make

    def orchestrator(
        self, engine: Any, *, greedy: bool, version: int = 0, group_size: int | None = None
    ) -> Orchestrator:
        """The one place an :class:`Orchestrator` is built (episodes are scored separately)."""
        cfg = self.rollout
        if group_size is not None and group_size != cfg.group_size:
            cfg = dataclasses.replace(cfg, group_size=group_size)
        return self.orchestrator_cls(
            engine=engine,
            chat=self.chat,
            env_factory=self.env_factory,
            cfg=cfg,
            sampling_params=self.sampling(greedy=greedy),
            policy_version=version,
        )

    async def collect(
        self,
        engine: Any,
        tasks: Sequence[Task],
        *,
        group_size: int,
        seed: int,
        version: int = 0,
        greedy: bool = False,
        even: bool = True,
    ) -> Rollout:
        """This process's share of ``tasks`` x ``group_size`` episodes (``even``: equal shares, as
        training rows need; else shares differing by at most one task)."""
        import time

        share = D.even_share(len(tasks), "tasks") if even else D.uneven_share(len(tasks))
        t = time.perf_counter()
        trajs = await self.episodes(
            engine,
            list(tasks)[share],
            group_size=group_size,
            seed=seed,
            version=version,
            greedy=greedy,
        )
        return Rollout(trajs, share.start, time.perf_counter() - t)

    async def episodes(
        self,
        engine: Any,
        tasks: Sequence[Task],
        *,
        group_size: int,
        seed: int,
        version: int,
        greedy: bool,
    ) -> list[Trajectory]:
        """``tasks`` x ``group_size`` episodes through the built-in loop, ordered by (task,
        sample); a subclass runs them another way (``serve.agent_collector``)."""
        orch = self.orchestrator(engine, greedy=greedy, version=version, group_size=group_size)
        return await orch.run(tasks, group_size=group_size, seed=seed)

    async def score(self, trajectories: Sequence[Trajectory]) -> None:
        """REWARD: compose every trajectory's reward in place (``traj.reward``, per-turn terms)."""
        if self.reward is None:
            raise ValueError("this collector has no reward composer")
        from jaxrl_agents.rollout.orchestrator import score_episode

        await asyncio.gather(*(score_episode(self.reward.acompute, t) for t in trajectories))

    async def evaluate(
        self, engine: Any, tasks: Sequence[Task], *, seed: int, version: int = 0
    ) -> list[Trajectory]:
        """Greedy, one scored episode per task; every process returns all processes' episodes."""
        roll = await self.collect(
            engine, tasks, group_size=1, seed=seed, version=version, greedy=True, even=False
        )
        if self.reward is not None:
            await self.score(roll.trajectories)
        return self.everyone(roll)

    @staticmethod
    def everyone(roll: Rollout, *, slim: bool = False) -> list[Trajectory]:
        """Every process's episodes in process order, group ids made global (one process:
        ``roll.trajectories`` itself). ``slim`` drops the token lists (most of the bytes)."""
        import jax

        if jax.process_count() == 1:
            return roll.trajectories
        drop = {"token_ids": [], "loss_mask": [], "logprobs": []} if slim else {}
        mine = [
            dataclasses.replace(t, group_id=t.group_id + roll.first_task, **drop)
            for t in roll.trajectories
        ]
        return [t for part in D.gather_objects(mine) for t in part]

    # -- device batches ---------------------------------------------------------------------------
    def bucket(self, longest: int) -> list[int]:
        """The one sequence bucket every process packs to."""
        agreed = int(D.gather_rows(np.array(max(longest, 1))).max())
        return [bucket_for(agreed, self.seq_buckets)]

    def row_multiple(self, multiple: int = 1) -> int:
        """What this process's packed row count must be a multiple of: the global rows split into
        ``multiple`` (minibatches x microbatches) x the data-parallel shards of ``sharding``,
        evenly over the processes."""
        import jax

        shards = 1
        if self.sharding is not None:
            for axis in D.batch_axes():
                shards *= self.sharding.mesh.shape[axis]
        nproc = jax.process_count()
        return math.lcm(multiple * shards, nproc) // nproc

    def device_batch(
        self,
        roll: Rollout,
        *,
        rows: int,
        max_turns: int,
        mask_overlong: bool = False,
        pack: bool = True,
        row_multiple: int = 1,
        no_loss: bool = False,
    ) -> DeviceBatch:
        """This process's episodes -> its share of the global batch, placed on the mesh.

        ``rows``: this process's episode slots (the batch's rows with ``pack=False``).
        ``pack``: several episodes per row (``rollout.packing``), the row count a multiple of
        :meth:`row_multiple` of ``row_multiple`` (minibatches x microbatches) and at most
        ``rows``. ``mask_overlong``: episodes cut off by a length limit keep their place in their
        group's statistics but contribute no loss (``algos.batch_shaping.overlong_rows``).
        Dropped episodes (``reward_error``, no tokens) take no position and no share in any
        group. ``no_loss``: every episode keeps its place but contributes no loss (an
        outcome-keyed dynamic-sampling step with no informative group)."""
        import jax

        from jaxrl_agents.algos.batch_shaping import overlong_rows

        keep = [trainable(t) for t in roll.trajectories]
        pad = [self.chat.pad_id]
        trajs = [
            t
            if ok
            else dataclasses.replace(
                t, token_ids=pad, loss_mask=[0], logprobs=[0.0], turns=[], reward=0.0
            )
            for t, ok in zip(roll.trajectories, keep, strict=True)
        ]
        if len(trajs) > rows:
            raise ValueError(f"{len(trajs)} episodes do not fit the {rows} episode slots")
        packed = self._pack_local(
            trajs, rows=rows, max_turns=max_turns, pack=pack, row_multiple=row_multiple
        )
        b = packed.batch
        out = [i for i, ok in enumerate(keep) if not ok]
        ep = _global_episodes(
            packed.episodes, keep, rows=rows, p=jax.process_index(), batch_rows=b.input_ids.shape[0]
        )
        long = (
            [i for i, x in enumerate(overlong_rows(trajs)) if x and keep[i]]
            if mask_overlong
            else []
        )
        clear_loss(packed, range(len(trajs)) if no_loss else long)
        real = int((b.segment_ids > 0).sum())
        counts = D.gather_rows(
            np.array(
                [packed.truncated, b.loss_mask.sum(), len(out), len(long), real, b.input_ids.size]
            )
        )
        return DeviceBatch(
            D.place(b, self.sharding),
            D.place(ep, self.sharding),
            int(counts[:, 0].sum()),
            int(counts[:, 1].sum()),
            int(counts[:, 2].sum()),
            int(counts[:, 3].sum()),
            float(counts[:, 4].sum() / max(counts[:, 5].sum(), 1)),
        )

    def _pack_local(
        self, trajs: list[Trajectory], *, rows: int, max_turns: int, pack: bool, row_multiple: int
    ) -> Packed:
        """Pack this process's ``trajs`` into ``rows`` episode slots, in the shape every process
        agrees on (from the all-gathered lengths)."""
        lengths = np.zeros((rows,), np.int64)
        lengths[: len(trajs)] = [len(t.token_ids) - 1 for t in trajs]
        everyone = D.gather_rows(lengths)  # [P, rows]: every process plans the same shape
        buckets, plan = list(self.seq_buckets), None
        if pack:
            plan = plan_rows(
                [list(q) for q in everyone],
                buckets=buckets,
                multiple=self.row_multiple(row_multiple),
                max_rows=rows,
            )
        else:  # one bucket agreed by every process
            buckets = [bucket_for(max(int(everyone.max()), 1), self.seq_buckets)]
        return pack_episodes(
            trajs,
            buckets=buckets,
            batch_size=rows,
            max_turns=max_turns,
            pad_id=self.chat.pad_id,
            rows=plan,
        )

    def sft_batch(
        self,
        rows: Sequence[tuple[Sequence[int], Sequence[int]]],
        share: slice,
        *,
        pack: bool = True,
        row_multiple: int = 1,
    ) -> TrainBatch:
        """Golden ``(ids, loss_mask)`` rows of the whole global batch (every process holds them)
        -> this process's ``share`` of them on the mesh. The shape comes from all rows, so the
        processes agree on it without a collective. ``pack``: several sequences per row, the
        row count a multiple of :meth:`row_multiple` of ``row_multiple`` (microbatches)."""
        import jax

        if not pack:
            bucket = bucket_for(max(max(len(ids) for ids, _ in rows) - 1, 1), self.seq_buckets)
            batch, _ = pack_sft(rows[share], buckets=[bucket], pad_id=self.chat.pad_id)
            return D.place(batch, self.sharding)
        size = share.stop - share.start
        parts = [
            [len(ids) - 1 for ids, _ in rows[q * size : (q + 1) * size]]
            for q in range(jax.process_count())
        ]
        plan = plan_rows(
            parts,
            buckets=self.seq_buckets,
            multiple=self.row_multiple(row_multiple),
            max_rows=size,
        )
        batch, _ = pack_sft(
            rows[share], buckets=self.seq_buckets, pad_id=self.chat.pad_id, rows=plan
        )
        return D.place(batch, self.sharding)


def _global_episodes(
    ep: EpisodeArrays, keep: list[bool], *, rows: int, p: int, batch_rows: int
) -> EpisodeArrays:
    """Process ``p``'s episode arrays with its dropped episodes (``keep`` false) taken out of
    every group (in place) and group ids, anchor ids and rows made global (a new tuple)."""
    out = [i for i, ok in enumerate(keep) if not ok]
    if out:  # no positions, singleton groups: no loss, no share in any group baseline
        ep.row_valid[out], ep.rewards[out], ep.turn_rewards[out] = 0.0, 0.0, 0.0
        ep.anchor_ids[out] = -1
        kept = [i for i, ok in enumerate(keep) if ok]
        used = {int(g) for g in ep.group_ids[kept]}
        others = sorted(set(range(rows)) - set(kept))  # dropped + padding slots
        ep.group_ids[others] = [g for g in range(rows) if g not in used][: len(others)]
    first_row = p * rows  # episode slots of the processes before this one
    n_turns = ep.anchor_ids.shape[1]
    return ep._replace(
        group_ids=ep.group_ids + first_row,
        anchor_ids=np.where(ep.anchor_ids >= 0, ep.anchor_ids + first_row * n_turns, -1),
        row=ep.row + p * batch_rows,  # batch rows of the processes before
    )
