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

from jaxrl_agents.chat import tiny_tokenizer_path
from jaxrl_agents.jobs.build import build_chat, generation_defaults
from jaxrl_agents.jobs.config import ChatSpec, ExportConfig, ModelSpec, RunConfig
from jaxrl_agents.jobs.restore import load_policy, load_run_config
from jaxrl_agents.models import Transformer, export_pretrained
from jaxrl_agents.models.gguf import local_folder
from jaxrl_agents.models.peft_io import export_peft
from jaxrl_agents.training.critic import without_critic


def tokenizer_folder(chat: ChatSpec, model: ModelSpec) -> Path | None:
    """The folder whose tokenizer files the run's tokenizer is (``build_tokenizer``'s choice):
    ``chat.tokenizer``, else ``model.path``, else the shipped tiny tokenizer's; ``None`` when
    ``chat.template`` replaced the template (the export then saves the tokenizer object, which
    carries the template it trained with)."""
    if chat.template is not None:
        return None
    path = chat.tokenizer
    if path is not None:
        return Path(tiny_tokenizer_path() if path == "tiny" else path)
    if model.path is None or model.path == "tiny":
        return Path(tiny_tokenizer_path())
    return Path(base_folder(model))


def base_folder(model: ModelSpec) -> str | None:
    """The Hugging Face folder of the run's base model (``model.path``; a GGUF file's converted
    folder), recorded as a PEFT adapter's ``base_model_name_or_path``."""
    path = model.path
    if path is None:
        return None
    return str(Path(local_folder(path)).resolve())


def export_policy(
    model: Transformer,
    tokenizer: Any,
    run_cfg: RunConfig,
    out: str | Path,
    *,
    dtype: str | None = None,
    max_shard_size: str = "2GB",
    merge: bool = False,
) -> Path:
    """Write ``model`` (a policy of the run ``run_cfg``, critic removed) as an HF folder ``out``.

    ``dtype``: default the source checkpoint's (``model.path``), else the policy's
    ``param_dtype``. A policy with LoRA adapters is written as a PEFT adapter folder on its base
    (``model.path``), unless ``merge``: then as the full model, the adapters folded in.
    ``run_cfg``: the whole config, of which it reads ``chat``, ``model`` and ``rollout``."""
    if getattr(model.cfg, "lora", None) is not None and not merge:
        return export_peft(
            without_critic(model), out, base=base_folder(run_cfg.model), dtype=dtype or "float32"
        )

    try:  # the ids that ended the policy's turns in training
        stop_ids = build_chat(run_cfg.chat, run_cfg.model.path, tokenizer=tokenizer).stop_token_ids
    except ValueError:  # no usable chat template: the tokenizer's eos only
        stop_ids = []
    return export_pretrained(
        without_critic(model),
        out,
        tokenizer=tokenizer,
        max_shard_size=max_shard_size,
        dtype=dtype,
        generation=generation_defaults(run_cfg.rollout),
        source=base_folder(run_cfg.model),
        tokenizer_source=tokenizer_folder(run_cfg.chat, run_cfg.model),
        stop_token_ids=stop_ids,
    )


def export_run(cfg: ExportConfig) -> tuple[Path, dict[str, Any]]:
    """Export checkpoint ``cfg.step`` (default: newest) of ``cfg.which``; returns (folder, meta)."""
    model, tokenizer, meta = load_policy(cfg.run_dir, which=cfg.which, step=cfg.step)
    out = Path(cfg.out or Path(cfg.run_dir) / f"hf_export_{cfg.which}")
    run_cfg = load_run_config(cfg.run_dir)
    export_policy(
        model,
        tokenizer,
        run_cfg,
        out,
        dtype=cfg.dtype,
        max_shard_size=cfg.max_shard_size,
        merge=cfg.merge,
    )
    return out, meta
