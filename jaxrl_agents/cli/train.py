"""``jaxrl-train``: the Hydra entry point of the training job (SFT then RL).

    jaxrl-train                                   # the CPU demo: tiny model, calculator env
    jaxrl-train env=sql reward=outcome_efficiency advantage=grpo \
        model=hf model.path=/models/Qwen2.5-1.5B-Instruct
    jaxrl-train -m advantage=grpo,rloo,dr_grpo seed=0,1,2          # a sweep (basic launcher)

This module is the only place that imports Hydra: it composes ``configs/``, converts the tree into
the typed :class:`~jaxrl_agents.training.config.RunConfig` (unknown keys and bad values fail here,
before anything compiles) and calls :func:`jaxrl_agents.training.run.run`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


def to_run_config(dict_cfg):
    """OmegaConf tree -> RunConfig (strict)."""
    from omegaconf import OmegaConf

    from jaxrl_agents.training.config import RunConfig, build

    data = OmegaConf.to_container(dict_cfg, resolve=True)
    data.pop("hydra", None)
    return build(RunConfig, data)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors a user causes with config or paths: reported in one line, no traceback."""
    from jaxrl_agents.models import CheckpointError, ModelConfigError
    from jaxrl_agents.sharding import MeshError
    from jaxrl_agents.training.config import ConfigError

    return (ConfigError, MeshError, ModelConfigError, CheckpointError, FileNotFoundError)


def _main(dict_cfg) -> None:
    from jaxrl_agents.training.run import run

    # Hydra configured logging just now; JAX's backend probing is noise at INFO.
    logging.getLogger("jax").setLevel(logging.WARNING)
    try:
        cfg = to_run_config(dict_cfg)
        summary = run(cfg)
    except user_errors() as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_summary(summary))
    if summary.get("learning_curve"):
        print(f"learning curve: {summary['learning_curve']}")
    if summary.get("export_dir"):
        print(f"Hugging Face export: {summary['export_dir']}")
    print(f"run folder: {Path(cfg.run_dir).resolve()}")


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

    rows = [
        (f"held-out, greedy, {summary.get('heldout_tasks', 0)} tasks", "SFT", "RL (final)"),
        ("success (95% CI)", success(sft), success(rl)),
        ("mean turns / tool calls", effort(sft), effort(rl)),
        ("premature answers", mode(sft, "premature"), mode(rl, "premature")),
        ("tool-call loops", mode(sft, "loop"), mode(rl, "loop")),
        ("invalid tool calls", mode(sft, "invalid_call"), mode(rl, "invalid_call")),
    ]
    return "\n".join(f"{a:<34}{b:<24}{c}" for a, b, c in rows)


def main() -> None:
    import hydra

    logging.getLogger("absl").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
