"""``jaxrl-train``: the Hydra entry point of the training job (SFT then RL).

    jaxrl-train                                   # the CPU demo: tiny model, calculator env
    jaxrl-train env=sql reward=outcome_efficiency advantage=grpo \
        model=hf model.path=/models/Qwen2.5-1.5B-Instruct
    jaxrl-train -m advantage=grpo,rloo,dr_grpo seed=0,1,2          # a sweep (basic launcher)

Composes ``configs/`` over the typed :class:`~jaxrl_agents.jobs.config.RunConfig` (unknown keys
and bad values fail here in one line, before anything compiles) and calls
:func:`jaxrl_agents.jobs.train.train`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jaxrl_agents.cli.app import reported, run_app


def to_run_config(tree):
    """Composed OmegaConf tree -> RunConfig (strict)."""
    from jaxrl_agents.jobs.config import RunConfig, from_tree

    return from_tree(RunConfig, tree)


def _main(tree) -> None:
    from jaxrl_agents.jobs.train import train

    # Hydra configured logging just now; JAX's backend probing is noise at INFO.
    logging.getLogger("jax").setLevel(logging.WARNING)
    with reported():
        _sweep_run_dir(tree)
        _sweep_wandb_group(tree)
        cfg = to_run_config(tree)
        summary = train(cfg)
    print(format_summary(summary))
    if summary.get("learning_curve"):
        print(f"learning curve: {summary['learning_curve']}")
    if summary.get("export_dir"):
        print(f"Hugging Face export: {summary['export_dir']}")
    print(f"run folder: {Path(cfg.run_dir).resolve()}")


def _sweep_run_dir(tree) -> None:
    """In a multirun (``-m``, basic or SLURM launcher) every job trains in its own folder, the
    sweep's subfolder named after the job's overrides (``multirun/<name>/advantage=grpo,seed=0``),
    unless the command sets ``run_dir`` itself (then the run folder's config check refuses a
    second, different job in it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return
    if any(o.split("=", 1)[0].lstrip("+~") == "run_dir" for o in hc.overrides.task):
        return
    tree.run_dir = hc.runtime.output_dir


def _sweep_wandb_group(tree) -> None:
    """In a multirun with W&B logging on (``trainer.log.wandb.project``) and no
    ``trainer.log.wandb.group`` given, group the sweep's jobs under the sweep's name: the name of
    its folder (``hydra.sweep.dir``, ``multirun/<name>`` by default)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    wandb = tree.trainer.log.wandb
    if hc.mode != RunMode.MULTIRUN or wandb.project is None or wandb.group is not None:
        return
    wandb.group = sweep_name(hc.sweep.dir)


def sweep_name(sweep_dir: str) -> str:
    """A sweep's name: the last component of its folder (``multirun/demo`` -> ``demo``)."""
    return Path(sweep_dir).name or str(sweep_dir)


def format_summary(summary: dict) -> str:
    """The end-of-run table: SFT vs final RL policy on the held-out tasks."""
    sft, rl = summary.get("sft") or {}, summary.get("rl") or {}

    def success(d: dict) -> str:
        if "success" not in d:
            return "n/a"
        lo, hi = d["success_ci95"]
        return f"{d['success']:.3f} ({lo:.3f}-{hi:.3f})"

    def effort(d: dict) -> str:
        return f"{d.get('mean_turns', 0):.2f} / {d.get('mean_tool_calls', 0):.2f}"

    def mode(d: dict, name: str) -> str:
        return str(d.get("failure_modes", {}).get(name, "n/a"))

    def val(x) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    best = summary.get("best") or {}
    rows = [
        (f"held-out, greedy, {summary.get('heldout_tasks', 0)} tasks", "SFT", "RL (final)"),
        ("success (95% CI)", success(sft), success(rl)),
        (
            f"validation ({summary.get('validation_tasks', 0)} tasks)",
            val(summary.get("sft_validation_success")),
            val(summary.get("rl_validation_success")),
        ),
        ("mean turns / tool calls", effort(sft), effort(rl)),
        ("premature answers", mode(sft, "premature"), mode(rl, "premature")),
        ("tool-call loops", mode(sft, "loop"), mode(rl, "loop")),
        ("invalid tool calls", mode(sft, "invalid_call"), mode(rl, "invalid_call")),
    ]
    table = "\n".join(f"{a:<34}{b:<24}{c}" for a, b, c in rows)
    if best:
        table += f"\nkeep-best (by validation): RL step {best['rl_step']} (checkpoints/best/)"
    errors = summary.get("episode_errors") or []
    if errors:
        worst = max(
            errors,
            key=lambda e: (
                (e.get("env_error", 0) + e.get("reward_error", 0)) / max(e["episodes"], 1)
            ),
        )
        table += (
            f"\nWARNING: {len(errors)} stage(s) had episodes ending in errors past "
            f"trainer.log.error_warn_frac; worst: {worst['where']}: env_error "
            f"{worst.get('env_error', 0)}, reward_error {worst.get('reward_error', 0)} of "
            f"{worst['episodes']}; first: {worst['first'][:200]} (summary.json: episode_errors)"
        )
    return table


def main() -> None:
    run_app("config", _main)


if __name__ == "__main__":
    main()
