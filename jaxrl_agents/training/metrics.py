"""Run logging: metrics to JSONL and TensorBoard (and Weights & Biases when
``trainer.log.wandb.project`` is set: ``training.wandb_sink``), sample trajectories, compile counts.

Only process 0 writes (multi-host runs call these on every process; the others are no-ops).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_agents.training.wandb_sink import WandbSink, WandbSpec
from jaxrl_agents.types import Trajectory, write_jsonl


def _scalar(v: Any) -> float | None:
    try:
        x = float(np.asarray(v))
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class RunLogger:
    """``log(step, {name: value})`` -> ``metrics.jsonl`` + TensorBoard events under ``tb/``
    (+ the W&B run, with ``wandb``)."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        enabled: bool | None = None,
        wandb: WandbSpec | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        """``wandb``: W&B logging (off unless its ``project`` is set), with ``config`` (the
        resolved job config as nested dicts) as the W&B run's config."""
        self.dir = Path(run_dir)
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._tb = None
        self.wandb: WandbSink | None = None
        self._t0 = time.time()
        if self.enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tb"))
            if wandb is not None and wandb.enabled:
                self.wandb = WandbSink(wandb, self.dir, config or {})

    def log(self, step: int, metrics: Mapping[str, Any], *, stage: str) -> None:
        if not self.enabled:
            return
        clean = {k: s for k, v in metrics.items() if (s := _scalar(v)) is not None}
        record = {"stage": stage, "step": int(step), "time_s": time.time() - self._t0, **clean}
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in clean.items():
            self._tb.add_scalar(f"{stage}/{k}", v, int(step))
        if self.wandb is not None:
            self.wandb.log(int(step), stage, clean)

    def truncate_after(self, stage: str, step: int) -> None:
        """Drop the rows a resumed run will log again: those after checkpoint ``(stage, step)``
        (SFT rows past ``step``, or RL / eval rows past RL step ``step``)."""
        path = self.dir / "metrics.jsonl"
        if not self.enabled or not path.exists():
            return

        def before(row: dict[str, Any]) -> bool:
            if stage == "sft":
                return row["stage"] == "sft" and row["step"] <= step
            return row["stage"] == "sft" or row["step"] <= step

        rows = read_metrics(path)
        kept = [r for r in rows if before(r)]
        if len(kept) < len(rows):
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def trajectories(
        self, step: int, trajs: Sequence[Trajectory], *, name: str = "samples"
    ) -> None:
        if not self.enabled:
            return
        out = self.dir / "trajectories"
        out.mkdir(exist_ok=True)
        write_jsonl(out / f"{name}_step{step:06d}.jsonl", trajs)

    def close(self, *, curve: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Flush and close the writers; with W&B, first log the end-of-run artifacts (the
        learning ``curve`` points and the run folder's result files) and finish its run."""
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self.wandb is not None:
            self.wandb.log_results(curve)
            self.wandb.finish()
            self.wandb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
