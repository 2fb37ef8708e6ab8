"""Rebuild a run's policy from its folder: ``config.json`` + an orbax checkpoint.

Used by ``jaxrl-export`` and ``jaxrl-eval`` to turn any checkpoint of a run (latest, best, sft, or
a given step) back into a model + tokenizer, with the same builders the training job used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxrl_agents.jobs.build import build_policy, build_tokenizer, split_params
from jaxrl_agents.jobs.config import RunConfig, build
from jaxrl_agents.training.checkpoint import Checkpointer


def load_run_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {str(run_dir)!r} a jaxrl-train run folder?")
    return build(RunConfig, json.loads(path.read_text()))


def checkpointer(run_dir: str | Path) -> Checkpointer:
    return Checkpointer(Path(run_dir) / "checkpoints", best_metric="validation_success")


def kept_steps(run_dir: str | Path, which=("latest", "best")) -> tuple[list[int], ...]:
    """Sorted kept steps of each checkpoint set in ``which`` (latest / best / sft)."""
    ckpt = checkpointer(run_dir)
    try:
        return tuple(sorted(ckpt.all_steps(w)) for w in which)
    finally:
        ckpt.close()


def load_policy(
    run_dir: str | Path, *, which: str = "latest", step: int | None = None, mesh=None
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, meta)`` for checkpoint ``step`` (default: newest) of ``which``
    ('latest', 'best' or 'sft')."""
    import jax
    from flax import nnx

    from jaxrl_agents.training.step import init_train_state

    if which not in ("latest", "best", "sft"):
        raise ValueError(f"which={which!r}: expected 'latest', 'best' or 'sft'")
    cfg = load_run_config(run_dir)
    tokenizer = build_tokenizer(cfg.chat, cfg.model.path)
    model = build_policy(cfg, vocab_size=len(tokenizer), mesh=mesh)
    graphdef, params, rest = split_params(model)
    template = init_train_state(params, cfg.optimizer.build())
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        template,
    )
    ckpt = checkpointer(run_dir)
    try:
        state, meta = ckpt.restore(abstract, step=step, which=which)
    finally:
        ckpt.close()
    return nnx.merge(graphdef, state.params, rest), tokenizer, meta
