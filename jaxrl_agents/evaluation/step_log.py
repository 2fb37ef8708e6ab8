"""One RL step's log row (``metrics.jsonl``'s ``rl`` rows): the step's episodes summarized over
every process, the batch's counts, timings and the update's metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.rollout.collector import DeviceBatch
from jaxrl_agents.types import EndReason, Trajectory


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one RL step's log row is made of."""

    episodes: Sequence[Trajectory]
    """Every process's episodes of the step (all-gathered, token lists may be dropped)."""
    rollout_s: float
    """This process's collection seconds; the row holds the slowest process's."""
    batch: DeviceBatch
    metrics: Mapping[str, Any]
    """The update's metrics (and the step's dynamic-sampling counts), host values."""
    train_s: float
    compiles: int
    """The sampler engine's compilations so far (0 for an engine without the count)."""
    version: int
    """The policy version the update trains (``trainer.sft.steps`` + the RL step)."""
    judge: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """This process's model-judge counts since the previous row (``judge/calls``,
    ``judge/cache_hits``, ``judge/errors``, ``judge/s``); the row sums them over processes. Empty
    without a model judge."""


def step_row(rec: StepRecord) -> dict[str, Any]:
    """The step's log row over the global batch (a collective: every process calls it)."""
    everyone, db = rec.episodes, rec.batch
    stats = summarize(everyone)
    rollout_s = float(D.gather_rows(np.array(rec.rollout_s)).max())
    return {
        "reward": float(np.mean([t.reward for t in everyone])),
        "success": stats["success"],
        "mean_turns": stats["mean_turns"],
        "mean_tool_calls": stats["mean_tool_calls"],
        **{f"reward/{k}": v for k, v in stats["reward_terms"].items()},
        **{f"failure/{k}": v for k, v in stats["failure_modes"].items()},
        "rollout_s": rollout_s,
        "train_s": rec.train_s,
        "gen_tok_s": db.sampled_tokens / max(rollout_s, 1e-9),
        "truncated": db.truncated,
        "overlong_masked": db.overlong_masked,
        "dropped": db.dropped,
        "env_errors": sum(t.end_reason == EndReason.ENV_ERROR for t in everyone),
        "staleness": float(np.mean([rec.version - t.policy_version for t in everyone])),
        "compiles": rec.compiles,
        **{k: float(np.asarray(v)) for k, v in rec.metrics.items()},
        **_summed(rec.judge),
    }


def _summed(counts: Mapping[str, float]) -> dict[str, float]:
    """Per-process counts summed over every process (a collective when there are any)."""
    if not counts:
        return {}
    keys = sorted(counts)
    total = D.gather_rows(np.array([float(counts[k]) for k in keys])).reshape(-1, len(keys))
    return dict(zip(keys, (float(x) for x in total.sum(0)), strict=True))
