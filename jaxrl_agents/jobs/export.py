"""``jaxrl-export``'s job: a run's checkpoint -> a Hugging Face folder.

The export is faithful to what the run started from: for a run trained from a local HF folder
(``model.path``) the weights are written in that checkpoint's dtype, ``generation_config.json``
starts from its own (eos list, bos/pad, sampling defaults) with the run's sampling settings
(:func:`generation_defaults`) on top and every stop id of the run's chat format in its
``eos_token_id``, and the tokenizer files the run used are copied byte for byte (unless
``chat.template`` replaced the template: then the tokenizer is saved with the one it trained with).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxrl_agents.jobs.build import build_chat, generation_defaults
from jaxrl_agents.jobs.config import ExportConfig, RunConfig
from jaxrl_agents.jobs.restore import load_policy, load_run_config


def tokenizer_folder(run_cfg: RunConfig) -> Path | None:
    """The folder whose tokenizer files the run's tokenizer is (``build_tokenizer``'s choice):
    ``chat.tokenizer``, else ``model.path``, else the shipped tiny tokenizer's; ``None`` when
    ``chat.template`` replaced the template (the export then saves the tokenizer object, which
    carries the template it trained with)."""
    from jaxrl_agents.chat import tiny_tokenizer_path

    if run_cfg.chat.template is not None:
        return None
    path = run_cfg.chat.tokenizer or run_cfg.model.path
    return Path(tiny_tokenizer_path() if path is None or path == "tiny" else path)


def export_policy(
    model: Any,
    tokenizer: Any,
    run_cfg: RunConfig,
    out: str | Path,
    *,
    dtype: str | None = None,
    max_shard_size: str = "2GB",
) -> Path:
    """Write ``model`` (a policy of the run ``run_cfg``, critic removed) as an HF folder ``out``.

    ``dtype``: default the source checkpoint's (``model.path``), else the policy's
    ``param_dtype``."""
    from jaxrl_agents.models import export_pretrained
    from jaxrl_agents.training.critic import without_critic

    try:  # the ids that ended the policy's turns in training
        stop_ids = build_chat(run_cfg.chat, run_cfg.model.path, tokenizer=tokenizer).stop_token_ids
    except ValueError:  # no usable chat template: the tokenizer's eos only
        stop_ids = []
    return export_pretrained(
        without_critic(model), out, tokenizer=tokenizer, max_shard_size=max_shard_size,
        dtype=dtype, generation=generation_defaults(run_cfg.rollout), source=run_cfg.model.path,
        tokenizer_source=tokenizer_folder(run_cfg), stop_token_ids=stop_ids,
    )  # fmt: skip


def export_run(cfg: ExportConfig) -> tuple[Path, dict[str, Any]]:
    """Export checkpoint ``cfg.step`` (default: newest) of ``cfg.which``; returns (folder, meta)."""
    model, tokenizer, meta = load_policy(cfg.run_dir, which=cfg.which, step=cfg.step)
    out = Path(cfg.out or Path(cfg.run_dir) / f"hf_export_{cfg.which}")
    run_cfg = load_run_config(cfg.run_dir)
    export_policy(
        model, tokenizer, run_cfg, out, dtype=cfg.dtype, max_shard_size=cfg.max_shard_size
    )
    return out, meta
