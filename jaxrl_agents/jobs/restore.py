"""Rebuild a run's policy from its folder: ``config.json`` + an orbax checkpoint.

Used by ``jaxrl-export`` and ``jaxrl-eval`` to turn any checkpoint of a run (latest, best, sft, or
a given step) back into a model + tokenizer, with the same builders the training job used.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from flax.traverse_util import flatten_dict

from jaxrl_agents.jobs.build import build_policy, build_tokenizer, split_params
from jaxrl_agents.jobs.config import ConfigError, RunConfig, from_record
from jaxrl_agents.models import Transformer
from jaxrl_agents.models.lora import base_fingerprint
from jaxrl_agents.training.checkpoint import Checkpointer
from jaxrl_agents.training.step import init_train_state


def load_run_config(run_dir: str | Path) -> RunConfig:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {str(run_dir)!r} a jaxrl-train run folder?")
    return from_record(RunConfig, json.loads(path.read_text()), str(path))


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
) -> tuple[Transformer, Any, dict[str, Any]]:
    """``(model, tokenizer, meta)`` for checkpoint ``step`` (default: newest) of ``which``
    ('latest', 'best' or 'sft')."""
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
    recorded = meta.get("lora_base")
    if recorded is not None:  # adapters: only valid on the base they were trained on
        now = base_fingerprint(model)
        if now != recorded["fingerprint"]:
            raise ValueError(
                f"{run_dir}: its LoRA adapters were trained on {recorded['path']} (fingerprint "
                f"{recorded['fingerprint']}); model.path={cfg.model.path} now holds another base "
                f"(fingerprint {now})"
            )
    return nnx.merge(graphdef, state.params, rest), tokenizer, meta


COMPILE_ONLY = frozenset({"model.scan_unroll"})
"""Settings that change how the model compiles, not what it computes: an SFT result made under
another value is the same policy."""
RL_ONLY = ("env.rl_options",)
"""Settings (and their sub-keys) that only the stage after SFT reads."""


def sft_source_differences(cfg: RunConfig, src: RunConfig) -> list[str]:
    """The settings that shape an SFT result (``model``, ``chat``, ``env``, ``seed``, the
    ``trainer.sft`` fields but ``init_from``; not :data:`COMPILE_ONLY` or :data:`RL_ONLY`) where
    ``cfg`` and ``src`` differ, one ``key: here vs there`` each. Compares several groups, so it
    takes the whole configs."""

    def shaping(c: RunConfig) -> dict[str, Any]:
        sft = dataclasses.asdict(c.trainer.sft)
        tr = {f"trainer.sft.{k}": v for k, v in sft.items() if k != "init_from"}
        groups = {g: dataclasses.asdict(getattr(c, g)) for g in ("model", "chat", "env")}
        flat = flatten_dict(groups, sep=".")
        keep = {
            k: v for k, v in flat.items() if k not in COMPILE_ONLY and not k.startswith(RL_ONLY)
        }
        return {**keep, "seed": c.seed, **tr}

    here, there = shaping(cfg), shaping(src)
    return [
        f"{k}: {here.get(k)!r} here, {there.get(k)!r} there"
        for k in sorted(here.keys() | there.keys())
        if here.get(k) != there.get(k)
    ]


def check_sft_source(cfg: RunConfig) -> int:
    """``trainer.sft.init_from``: the run folder's newest SFT snapshot step, after checking that the
    folder is a run with one and that its SFT was made with this run's SFT settings; raises
    ``ConfigError`` naming what is wrong. Takes the whole config: it compares the SFT-shaping
    groups with the source run's (:func:`sft_source_differences`)."""
    where = f"trainer.sft.init_from={cfg.trainer.sft.init_from!r}"
    try:
        src = load_run_config(cfg.trainer.sft.init_from)
    except FileNotFoundError as e:
        raise ConfigError(f"{where}: {e}") from None
    diffs = sft_source_differences(cfg, src)
    if diffs:
        raise ConfigError(
            f"{where}: its SFT was made with other settings than this run's: "
            + "; ".join(diffs[:6])
            + (" ..." if len(diffs) > 6 else "")
        )
    (steps,) = kept_steps(cfg.trainer.sft.init_from, ("sft",))
    if not steps:
        raise ConfigError(
            f"{where}: that run has no SFT snapshot yet (checkpoints/sft is empty): "
            "let its SFT stage finish first"
        )
    return steps[-1]


def sft_params_from(run_dir: str | Path, params: Any, *, mesh=None) -> Any:
    """``params`` (this run's fresh policy state) with every entry the run folder's SFT snapshot
    has replaced by the snapshot's value (same shapes and shardings); entries it lacks (a critic
    this run adds) keep their fresh values."""
    model, _, _ = load_policy(run_dir, which="sft", mesh=mesh)
    _, src, _ = split_params(model)
    src_flat = flatten_dict(nnx.to_pure_dict(src))
    pure = nnx.to_pure_dict(params)

    def take(path: tuple, x: Any) -> Any:
        key = tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path)
        if key not in src_flat:
            return x
        y = src_flat[key]
        if y.shape != x.shape or y.dtype != x.dtype:
            raise ValueError(
                f"sft_from {run_dir}: {'.'.join(map(str, key))} is {y.shape} "
                f"{y.dtype} there, {x.shape} {x.dtype} here"
            )
        return jax.device_put(y, x.sharding) if hasattr(x, "sharding") else y

    merged = jax.tree_util.tree_map_with_path(take, pure)
    out = jax.tree.map(lambda x: x, params)
    nnx.replace_by_pure_dict(out, merged)
    return out
