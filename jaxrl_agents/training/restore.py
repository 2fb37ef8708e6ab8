"""Rebuild a run's policy from its folder: ``config.json`` + an orbax checkpoint.

Used by ``jaxrl-export`` and ``jaxrl-eval`` to turn any checkpoint of a run (latest, best, or a
given step) back into a model + tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxrl_agents.training import builders as B
from jaxrl_agents.training.checkpoint import Checkpointer
from jaxrl_agents.training.config import RunConfig, build


def load_run_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir!r} a jaxrl-train run folder?")
    return build(RunConfig, json.loads(path.read_text()))


def load_policy(
    run_dir: str | Path, *, which: str = "latest", step: int | None = None, mesh=None
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, tokenizer, meta)`` for checkpoint ``step`` (default: newest) of ``which``
    ('latest', 'best' or 'sft')."""
    from flax import nnx

    from jaxrl_agents.training.run import _abstract
    from jaxrl_agents.training.step import init_train_state

    if which not in ("latest", "best", "sft"):
        raise ValueError(f"which={which!r}: expected 'latest', 'best' or 'sft'")
    cfg = load_run_config(run_dir)
    tokenizer = B.build_tokenizer(cfg.model)
    model = B.build_model(cfg.model, vocab_size=len(tokenizer), mesh=mesh, seed=cfg.seed)
    graphdef, params, rest = B.split_params(model)
    template = init_train_state(params, cfg.optimizer.build(), seed=cfg.seed)
    ckpt = Checkpointer(Path(run_dir) / "checkpoints", best_metric="heldout_success")
    try:
        state, meta = ckpt.restore(_abstract(template), step=step, which=which)
    finally:
        ckpt.close()
    return nnx.merge(graphdef, state.params, rest), tokenizer, meta
