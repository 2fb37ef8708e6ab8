"""One RL step's episodes: collect, score, and (with dynamic sampling) refill.

:class:`StepSource` turns step ``s`` into this process's scored episodes: the step's tasks (a
fixed slice of the run's task stream) x ``rollout.group_size`` samples, REWARD applied. With
``trainer.rl.dynamic_sampling`` groups whose rewards are all equal (zero advantage for every group
estimator) are dropped and fresh groups are sampled from a separate task stream until the step has
``tasks_per_step`` informative groups or ``trainer.rl.dynamic_max_rounds`` rounds have run (DAPO's
resample loop, ``algos.batch_shaping.DynamicSampler``); a step that still falls short trains on
the groups it has, the rest of its rows masked, and says so in its counts. A step with no
informative group at all keeps its last round as sampled (``dynamic/fallback`` = 1, and a warning
line): a week-long run does not stop for one unlucky step. ``trainer.rl.dynamic_sampling_on``
chooses what must vary: the total reward, or the outcome (DAPO's accuracy criterion). Keyed on the
reward, the fallback's groups have zero advantage; keyed on the outcome they would train the
shaping terms alone, so their loss is masked (``no_loss``) and, when no process has a loss token
left, the job skips the update (``update_skipped`` = 1).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from jaxrl_agents import distributed as D
from jaxrl_agents.algos.batch_shaping import DynamicSampler
from jaxrl_agents.rng import Keys
from jaxrl_agents.rollout.collector import Collector, Rollout
from jaxrl_agents.types import Task

log = logging.getLogger("jaxrl_agents")


@dataclasses.dataclass
class StepSource:
    """Step ``s``'s tasks are ``train_tasks[s * tasks_per_step ...]`` (cycled); refills draw
    ``new_tasks(n, seed=...)`` (the env's train split) from the ``refill`` stream of ``keys``."""

    collector: Collector
    new_tasks: Callable[..., list[Task]]
    """``(n, *, seed) -> n`` fresh train tasks, for the refill rounds."""
    keys: Keys
    train_tasks: list[Task]
    tasks_per_step: int
    group_size: int
    dynamic: bool = False
    max_rounds: int = 4
    dynamic_on: str = "reward"  # trainer.rl.dynamic_sampling_on

    def no_loss(self, fallback: float) -> bool:
        """Whether a step's episodes must contribute no loss: an outcome-keyed fallback, whose
        groups all share one outcome."""
        return bool(fallback) and self.dynamic_on == "outcome"

    def tasks(self, s: int) -> list[Task]:
        k = s * self.tasks_per_step
        n = len(self.train_tasks)
        return [self.train_tasks[(k + j) % n] for j in range(self.tasks_per_step)]

    async def _round(self, engine, tasks, *, seed: int, version: int) -> Rollout:
        roll = await self.collector.collect(
            engine, tasks, group_size=self.group_size, seed=seed, version=version
        )
        await self.collector.score(roll.trajectories)  # REWARD
        return roll

    async def _first(self, engine: Any, s: int, *, version: int) -> Rollout:
        """Step ``s``'s own round: its slice of the task stream."""
        seed = self.keys.seed("rollout", s)
        return await self._round(engine, self.tasks(s), seed=seed, version=version)

    async def _refill(self, engine: Any, s: int, k: int, *, version: int) -> Rollout:
        """Step ``s``'s refill round ``k`` (1 ..): fresh tasks from a separate, per-step stream."""
        r = s * self.max_rounds + k
        extra = self.new_tasks(self.tasks_per_step, seed=self.keys.seed("refill", r))
        seed = self.keys.seed("rollout_refill", r)
        return await self._round(engine, extra, seed=seed, version=version)

    async def budget(self, engine: Any, s: int, *, version: int) -> list[Rollout]:
        """Every round step ``s`` may sample, each scored and unfiltered: its own round and,
        with dynamic sampling, all ``max_rounds - 1`` refill rounds :meth:`step` draws from
        (the most episodes an RL step can sample, on the same tasks and seeds). What a baseline
        at RL's episode budget samples (``jobs.baselines``)."""
        n = self.max_rounds if self.dynamic else 1
        first = await self._first(engine, s, version=version)
        return [first, *[await self._refill(engine, s, k, version=version) for k in range(1, n)]]

    async def step(self, engine: Any, s: int, *, version: int) -> tuple[Rollout, dict[str, float]]:
        """Step ``s``'s scored episodes (this process's share), sampled at policy ``version``,
        and the dynamic-sampling counts (empty without it)."""
        roll = await self._first(engine, s, version=version)
        if not self.dynamic:
            return roll, {}
        share = D.even_share(self.tasks_per_step, "trainer.rl.tasks_per_step")
        target = share.stop - share.start
        sampler = DynamicSampler(
            target_groups=target, max_rounds=self.max_rounds, by=self.dynamic_on
        )
        sampler.add(roll.trajectories)
        seconds, refills = roll.seconds, 0
        while not sampler.ready:
            more = await self._refill(engine, s, sampler.rounds, version=version)
            sampler.add(more.trajectories)
            seconds, refills = seconds + more.seconds, refills + 1
        trajs, stats = sampler.take()
        if stats.fallback:
            log.warning(
                "RL step %d: no group with a varying %s in trainer.rl.dynamic_max_rounds=%d "
                "rounds; %s",
                s + 1,
                self.dynamic_on,
                self.max_rounds,
                "its episodes get no loss (only shaping terms vary)"
                if self.no_loss(stats.fallback)
                else "training the last round's groups as sampled (zero advantages)",
            )
        groups: dict[tuple[int, int], int] = {}
        for t in trajs:  # groups of several rounds: renumber 0..k-1 in order
            t.group_id = groups.setdefault((id(t.task), t.group_id), len(groups))
        counts = {
            "dynamic/groups_sampled": float(stats.groups_in),
            "dynamic/groups_dropped": float(stats.groups_dropped),
            "dynamic/refill_rounds": float(refills),
            "dynamic/groups_trained": float(len(groups)),
            "dynamic/fallback": float(stats.fallback),
        }
        return Rollout(trajs, share.start, seconds), counts
