"""orbax checkpoints: periodic async saves, keep-N, keep-best, automatic resume.

Layout of a run folder's ``checkpoints/``::

    checkpoints/latest/<step>/{state,meta}   keep-N most recent (resume reads the newest)
    checkpoints/best/<step>/{state,meta}     the single best by held-out success

orbax writes each step into a temporary folder and renames it when complete, so a run killed
mid-save leaves an uncommitted folder that ``latest_step()`` ignores: resume falls back to the
previous complete checkpoint. ``meta`` is JSON: stage (sft/rl), metrics, the config hash.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """Thin wrapper over two ``ocp.CheckpointManager`` instances (latest and best)."""

    def __init__(
        self, directory: str | Path, *, keep: int = 3, async_save: bool = True, best_metric: str
    ):
        self.dir = Path(directory).absolute()
        self.best_metric = best_metric
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        self.latest = ocp.CheckpointManager(self.dir / "latest", options=opts)
        best_opts = ocp.CheckpointManagerOptions(
            max_to_keep=1,
            create=True,
            enable_async_checkpointing=async_save,
            best_fn=lambda m: float(m[best_metric]),
            best_mode="max",
            keep_checkpoints_without_metrics=False,
        )
        self.best = ocp.CheckpointManager(self.dir / "best", options=best_opts)

    def save(self, step: int, state: Any, meta: dict[str, Any], *, force: bool = False) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.latest.save(step, args=args, force=force)

    def save_best(self, step: int, state: Any, meta: dict[str, Any], metrics: dict) -> None:
        """Offer a checkpoint to the keep-best manager (kept only if it beats the current best)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.best.save(step, args=args, metrics={k: float(v) for k, v in metrics.items()})

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def restore(self, abstract_state: Any, *, step: int | None = None, which: str = "latest"):
        """Restore ``(state, meta)``; ``abstract_state`` gives structure, dtypes and shardings."""
        mngr = self.latest if which == "latest" else self.best
        step = mngr.latest_step() if step is None else step
        if which == "best":
            step = mngr.best_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint under {mngr.directory}")
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        out = mngr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"], out["meta"]

    def all_steps(self, which: str = "latest") -> list[int]:
        return list((self.latest if which == "latest" else self.best).all_steps())

    def wait(self) -> None:
        self.latest.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.latest.close()
        self.best.close()
