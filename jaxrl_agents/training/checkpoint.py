"""orbax checkpoints: periodic async saves, keep-N, keep-best, automatic resume.

Layout of a run folder's ``checkpoints/``::

    checkpoints/latest/<step>/{state,meta}   keep-N most recent (resume reads the newest)
    checkpoints/best/<step>/{state,meta}     the single best by held-out success
    checkpoints/sft/<step>/{state,meta}      the SFT result (= RL starting point), kept for
                                             base-vs-trained comparisons

orbax writes each step into a temporary folder and renames it when complete, so a run killed
mid-save leaves an uncommitted folder that ``latest_step()`` ignores: resume falls back to the
previous complete checkpoint. ``meta`` is JSON: the stage (sft/rl) and the step within it.
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
        sft_opts = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
        self.sft = ocp.CheckpointManager(self.dir / "sft", options=sft_opts)
        self._managers = {"latest": self.latest, "best": self.best, "sft": self.sft}

    def manager(self, which: str) -> ocp.CheckpointManager:
        if which not in self._managers:
            raise ValueError(f"which={which!r}: expected one of {sorted(self._managers)}")
        return self._managers[which]

    def save(self, step: int, state: Any, meta: dict[str, Any], *, force: bool = False) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.latest.save(step, args=args, force=force)

    def save_best(self, step: int, state: Any, meta: dict[str, Any], metrics: dict) -> None:
        """Offer a checkpoint to the keep-best manager (kept only if it beats the current best)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.best.save(step, args=args, metrics={k: float(v) for k, v in metrics.items()})

    def save_sft(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Keep the SFT result (the RL starting point) outside the rotating keep-N set."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.sft.save(step, args=args, force=True)

    def latest_step(self) -> int | None:
        return self.latest.latest_step()

    def restore(self, abstract_state: Any, *, step: int | None = None, which: str = "latest"):
        """Restore ``(state, meta)``; ``abstract_state`` gives structure, dtypes and shardings."""
        mngr = self.manager(which)
        if step is None:
            step = mngr.best_step() if which == "best" else mngr.latest_step()
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
        return list(self.manager(which).all_steps())

    def wait(self) -> None:
        for m in self._managers.values():
            m.wait_until_finished()

    def close(self) -> None:
        for m in self._managers.values():
            m.close()
