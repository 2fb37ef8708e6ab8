"""The run's end-of-run summary (``summary.json``) and its plot, and small helpers of the training
job (abstract state, parameter checksum). Each RL step's log row is ``evaluation.step_log``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.jobs.run import Run
from jaxrl_agents.training.step import TrainState


def abstract(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )


def checksum(params: Any) -> float:
    """Sum of every parameter in float64: equal for equal parameters (a record, not a hash)."""
    leaves = jax.tree.leaves(params)
    return float(sum(np.asarray(D.host_value(x), np.float64).sum() for x in leaves))


def best(run: Run) -> dict[str, Any] | None:
    """The keep-best checkpoint: selected by validation success over every evaluated step."""
    step = run.ckpt.best.best_step()
    if step is None:
        return None
    return {"step": int(step), "rl_step": int(step) - run.tr.sft.steps}


def summary(run: Run, export_dir: Path | None, wall_s: float, state: TrainState) -> dict[str, Any]:
    stages = run.record.stages
    sft, rl = stages.get("sft_eval", {}), stages.get("rl_eval", {})
    summary = {
        "seed": run.cfg.seed,
        "env": run.sys.env.cls.__name__,
        "heldout_tasks": rl.get("n", 0),
        "sft_heldout_success": sft.get("success"),
        "sft_heldout_ci95": sft.get("success_ci95"),
        "rl_heldout_success": rl.get("success"),
        "rl_heldout_ci95": rl.get("success_ci95"),
        "validation_tasks": len(run.validation),
        "sft_validation_success": stages.get("sft_validation", {}).get("success"),
        "rl_validation_success": stages.get("rl_validation", {}).get("success"),
        "best": best(run),
        "sft_data": stages.get("sft_data"),
        "sft": sft,
        "rl": rl,
        "skipped_updates": int(D.host_value(state.skipped)),
        # stages whose share of env_error / reward_error episodes passed trainer.log.error_warn_frac
        "episode_errors": stages.get("episode_errors", []),
        "export_dir": str(export_dir) if export_dir else None,
        "wall_s": wall_s,
        "environment": stages.get("environment"),
    }
    if run.record.writer:
        # Imported here: matplotlib adds ~0.4-0.9 s to importing the job (measured), and only
        # process 0 draws the curve, once, at the end of the run.
        from jaxrl_agents.evaluation.plots import learning_curve

        plot = run.record.dir / "learning_curve.png"
        curve = run.record.curve
        learning_curve(
            curve,
            plot,
            sft_success=sft.get("success"),
            rl_success=rl.get("success"),
            sft_validation=summary["sft_validation_success"],
            rl_validation=summary["rl_validation_success"],
        )
        summary["learning_curve"] = str(plot)
        run.record.write_summary(summary)
    return summary
