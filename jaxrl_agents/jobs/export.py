"""``jaxrl-export``'s job: a run's checkpoint -> a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxrl_agents.jobs.build import generation_defaults
from jaxrl_agents.jobs.config import ExportConfig
from jaxrl_agents.jobs.restore import load_policy, load_run_config


def export_run(cfg: ExportConfig) -> tuple[Path, dict[str, Any]]:
    """Export checkpoint ``cfg.step`` (default: newest) of ``cfg.which``; returns (folder, meta)."""
    from jaxrl_agents.models import export_pretrained

    model, tokenizer, meta = load_policy(cfg.run_dir, which=cfg.which, step=cfg.step)
    out = Path(cfg.out or Path(cfg.run_dir) / f"hf_export_{cfg.which}")
    generation = generation_defaults(load_run_config(cfg.run_dir).rollout)
    from jaxrl_agents.training.critic import without_critic

    export_pretrained(
        without_critic(model), out, tokenizer=tokenizer, max_shard_size=cfg.max_shard_size,
        generation=generation,
    )  # fmt: skip
    return out, meta
