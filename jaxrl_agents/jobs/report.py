"""The run's reports: the per-step log row, the end-of-run summary and its plot, and small helpers
of the training job (checkpoint presence, abstract state, parameter checksum)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.types import EndReason


def has_steps(ckpt_dir) -> bool:
    """Whether a checkpoint set under ``ckpt_dir`` holds a step folder (complete or not)."""
    return any(p.name.isdigit() for sub in ("latest", "sft") for p in (ckpt_dir / sub).glob("*"))


def abstract(tree: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )


def checksum(params: Any) -> float:
    """Sum of every parameter in float64: equal for equal parameters (a record, not a hash)."""
    leaves = jax.tree.leaves(params)
    return float(sum(np.asarray(D.host_value(x), np.float64).sum() for x in leaves))


def lora_base(cfg: Any, model: Any, record: Any, has_checkpoints: bool) -> dict | None:
    """With LoRA (``model.lora.rank``), the identity of the frozen base the adapters are trained
    on (``stages.json``'s ``lora_base`` and every checkpoint's metadata): its path and
    ``models.lora.base_fingerprint``. A run folder with checkpoints made on another base stops
    in one line (its adapters mean nothing on this one)."""
    if cfg.model.lora.config() is None:
        return None
    from jaxrl_agents.jobs.config import ConfigError
    from jaxrl_agents.models.lora import base_fingerprint

    where = cfg.model.path or f"a fresh model.init (seed {cfg.seed})"
    base = {"path": where, "fingerprint": base_fingerprint(model)}
    old = record.stages.get("lora_base")
    if has_checkpoints and old is not None and old["fingerprint"] != base["fingerprint"]:
        raise ConfigError(
            f"model.path={where}: the LoRA adapters in {str(record.dir)!r} were trained on "
            f"another base ({old['path']}, fingerprint {old['fingerprint']}; this one is "
            f"{base['fingerprint']}): resume on that base, or use a new run_dir"
        )
    record.set("lora_base", base)
    return base


def step_row(run, roll, everyone, db, metrics, train_s: float, engine, s: int) -> dict:
    """The step's log row over the global batch (episodes all-gathered without token lists)."""
    stats = summarize(everyone)
    rollout_s = float(D.gather_rows(np.array(roll.seconds)).max())
    version = run.tr.sft.steps + s
    return {
        "reward": float(np.mean([t.reward for t in everyone])),
        "success": stats["success"],
        "mean_turns": stats["mean_turns"],
        "mean_tool_calls": stats["mean_tool_calls"],
        **{f"reward/{k}": v for k, v in stats["reward_terms"].items()},
        **{f"failure/{k}": v for k, v in stats["failure_modes"].items()},
        "rollout_s": rollout_s,
        "train_s": train_s,
        "gen_tok_s": db.sampled_tokens / max(rollout_s, 1e-9),
        "truncated": db.truncated,
        "overlong_masked": db.overlong_masked,
        "dropped": db.dropped,
        "env_errors": sum(t.end_reason == EndReason.ENV_ERROR for t in everyone),
        "staleness": float(np.mean([version - t.policy_version for t in everyone])),
        "compiles": getattr(engine, "compile_count", 0),
        **{k: float(np.asarray(v)) for k, v in metrics.items()},
    }


def best(run) -> dict[str, Any] | None:
    """The keep-best checkpoint: selected by validation success over every evaluated step."""
    step = run.ckpt.best.best_step()
    if step is None:
        return None
    return {"step": int(step), "rl_step": int(step) - run.tr.sft.steps}


def summary(run, export_dir, wall_s: float, state) -> dict[str, Any]:
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
        from jaxrl_agents.evaluation.plots import learning_curve

        plot = run.record.dir / "learning_curve.png"
        curve = run.record.curve
        learning_curve(
            curve, plot, sft_success=sft.get("success"), rl_success=rl.get("success"),
            sft_validation=summary["sft_validation_success"],
            rl_validation=summary["rl_validation_success"],
        )  # fmt: skip
        summary["learning_curve"] = str(plot)
        run.record.write_summary(summary)
    return summary
