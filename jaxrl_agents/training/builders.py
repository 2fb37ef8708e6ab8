"""Build the run's components from typed config: tokenizer, policy, environment, engine.

Kept apart from the loops so tests, scripts and the Hydra app construct things the same way.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import fields
from typing import Any

import jax
from flax import nnx

from jaxrl_agents.training.config import ConfigError, ModelSpec, SamplerSpec


def build_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    from jaxrl_agents.chat import load_tiny_tokenizer

    path = spec.tokenizer or spec.path
    if path is None or path == "tiny":
        return load_tiny_tokenizer()
    return AutoTokenizer.from_pretrained(path)


def build_model(spec: ModelSpec, *, vocab_size: int, mesh=None, seed: int = 0):
    """A policy from a local HF folder, or a fresh random one from ``spec.init``."""
    from jaxrl_agents.models import ModelConfig, Transformer, load_pretrained
    from jaxrl_agents.sharding import shard_model

    if spec.path is not None:
        model, _ = load_pretrained(
            spec.path, mesh=mesh, dtype=spec.dtype, param_dtype=spec.param_dtype, tokenizer=False
        )
        return model
    if not spec.init:
        raise ConfigError("model.path is null and model.init is empty: give one of them")
    hf = {"vocab_size": vocab_size, **spec.init}
    cfg = ModelConfig.from_hf_config(hf)
    cfg = _replace_known(cfg, dtype=spec.dtype, param_dtype=spec.param_dtype, remat=spec.remat)
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    if mesh is not None:
        model = shard_model(model, mesh)
    return model


def _replace_known(cfg, **kw):
    import dataclasses

    names = {f.name for f in fields(cfg)}
    return dataclasses.replace(cfg, **{k: v for k, v in kw.items() if k in names})


def resolve_env(env_cfg: dict[str, Any]) -> tuple[type, dict[str, Any], dict[str, Any]]:
    """``{_target_: name-or-class-path, tasks: {...}, **kwargs}`` -> (Env class, constructor
    kwargs, ``make_tasks`` kwargs)."""
    from jaxrl_agents.envs import resolve_env_class

    env_cfg = dict(env_cfg)
    target = env_cfg.pop("_target_", None)
    task_kw = dict(env_cfg.pop("tasks", None) or {})
    if target is None:
        raise ConfigError("env config needs '_target_' (a registered env name or a class path)")
    try:
        cls = resolve_env_class(target)
    except ValueError as e:
        raise ConfigError(f"env._target_: {e}") from e
    try:
        cls(**env_cfg)  # validate constructor kwargs now, not in the first episode
    except TypeError as e:
        raise ConfigError(f"env: {e}") from e
    return cls, env_cfg, task_kw


def oracle_for(env_cls: type):
    """The scripted solver of an env: ``Env.oracle_policy`` or its module's ``oracle_policy``."""
    fn = getattr(env_cls, "oracle_policy", None) or getattr(
        importlib.import_module(env_cls.__module__), "oracle_policy", None
    )
    if fn is None:
        raise ConfigError(f"{env_cls.__name__} has no oracle_policy: SFT needs golden trajectories")
    return fn


def accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def build_engine(model, spec: SamplerSpec, *, mesh=None):
    from jaxrl_agents.generation import Engine, EngineConfig

    cfg = EngineConfig(
        max_slots=spec.max_slots,
        max_seq_len=spec.max_seq_len,
        prefill_buckets=tuple(spec.prefill_buckets),
        decode_chunk=spec.decode_chunk,
    )
    return Engine(model, cfg, mesh=mesh)


def sampling_factory(*, temperature: float, top_p: float, top_k: int, stop_ids: list[int]):
    from jaxrl_agents.generation import SamplingParams

    def make(max_new_tokens: int, seed: int):
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            stop_token_ids=tuple(stop_ids),
            seed=seed,
        )

    return make


def split_params(model) -> tuple[nnx.GraphDef, Any, Any]:
    """(graphdef, trainable params, everything else) of an NNX model."""
    return nnx.split(model, nnx.Param, ...)


def global_batch_sharding(mesh):
    """Leading (batch) axis over the data-parallel mesh axes; replicated when no mesh."""
    if mesh is None:
        return None
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def place(tree, sharding):
    """Host rows -> device arrays. Under ``jax.distributed`` ``tree`` holds this process's rows and
    the result is the global batch: every process's rows, concatenated in process order (the
    mesh's device order). With one process, the whole batch on ``sharding``."""
    if sharding is None:
        return jax.device_put(tree)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), tree)
