"""From a composed config tree to the typed job configs: the structured-config schema Hydra
composes over (:func:`schema`), strict building with one-line errors naming the dotted key
(:func:`build`, :func:`from_tree`), and the keys renamed since an earlier release
(:data:`RENAMED`, moved to their new keys by :func:`migrate` on the way in)."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from typing import Any

from jaxrl_agents.jobs.errors import ConfigError

# -- deprecated keys ------------------------------------------------------------------------------

# (config-rename: skip; the tool that rewrites a tree to the new keys leaves this file alone)
RENAMED: dict[str, str] = {
    # trainer: the flat layout -> its groups (TrainerSpec's docstring)
    "trainer.sft_steps": "trainer.sft.steps",
    "trainer.sft_batch_size": "trainer.sft.batch_size",
    "trainer.sft_examples": "trainer.sft.examples",
    "trainer.sft_data": "trainer.sft.data",
    "trainer.sft_oracle": "trainer.sft.oracle",
    "trainer.sft_from": "trainer.sft.init_from",
    "trainer.sft_lr": "trainer.sft.lr",
    "trainer.sft_copy_steps": "trainer.sft.copy_steps",
    "trainer.sft_copy_batch": "trainer.sft.copy_batch",
    "trainer.sft_filter": "trainer.sft.filter",
    "trainer.rl_steps": "trainer.rl.steps",
    "trainer.rl_stage": "trainer.rl.stage",
    "trainer.rl_seed": "trainer.rl.seed",
    "trainer.rl_start_min_success": "trainer.rl.start_min_success",
    "trainer.tasks_per_step": "trainer.rl.tasks_per_step",
    "trainer.ppo_epochs": "trainer.rl.ppo_epochs",
    "trainer.minibatches": "trainer.rl.minibatches",
    "trainer.off_policy_overlap": "trainer.rl.off_policy_overlap",
    "trainer.dynamic_sampling": "trainer.rl.dynamic_sampling",
    "trainer.dynamic_sampling_on": "trainer.rl.dynamic_sampling_on",
    "trainer.dynamic_max_rounds": "trainer.rl.dynamic_max_rounds",
    "trainer.mask_overlong": "trainer.rl.mask_overlong",
    "trainer.microbatches": "trainer.batching.microbatches",
    "trainer.seq_buckets": "trainer.batching.seq_buckets",
    "trainer.pack_rows": "trainer.batching.pack_rows",
    "trainer.logprob_chunk": "trainer.batching.logprob_chunk",
    "trainer.eval_every": "trainer.eval.every",
    "trainer.heldout_tasks": "trainer.eval.heldout_tasks",
    "trainer.validation_tasks": "trainer.eval.validation_tasks",
    "trainer.checkpoint_every": "trainer.checkpoint.every",
    "trainer.keep_checkpoints": "trainer.checkpoint.keep",
    "trainer.async_checkpoints": "trainer.checkpoint.async_save",
    "trainer.resume": "trainer.checkpoint.resume",
    "trainer.allow_config_change": "trainer.checkpoint.allow_config_change",
    "trainer.export": "trainer.checkpoint.export",
    "trainer.log_trajectories_every": "trainer.log.trajectories_every",
    "trainer.progress": "trainer.log.progress",
    "trainer.wandb": "trainer.log.wandb",
    "trainer.error_warn_frac": "trainer.log.error_warn_frac",
    "trainer.error_abort_frac": "trainer.log.error_abort_frac",
    # rollout: the sampling settings -> the embedded sampling record
    "rollout.temperature": "rollout.sampling.temperature",
    "rollout.top_p": "rollout.sampling.top_p",
    "rollout.top_k": "rollout.sampling.top_k",
    "rollout.min_p": "rollout.sampling.min_p",
}
"""Old dotted key -> new one, for the keys renamed when the ``trainer`` group was split into
groups and ``rollout`` took a ``sampling`` record: a command-line override, YAML file or run
folder's ``config.json`` that still uses an old key has it moved to the new one (with a
deprecation line). Old keys are accepted for one release."""

_PROGS = {"RunConfig": "jaxrl-train", "EvalConfig": "jaxrl-eval", "ExportConfig": "jaxrl-export"}


def migrate(cls: type, data: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``data`` (the nested dict of a job config ``cls``) with every :data:`RENAMED` old key moved
    to its new key, and the ``(old, new)`` pairs moved. An old key's value wins over the new
    key's: it is the user's (the package's own files use the new keys). ``data`` is not
    changed."""
    names = {f.name for f in dataclasses.fields(cls)}
    out = _copy_tree(data)
    moved = []
    for old, new in RENAMED.items():
        *parents, leaf = old.split(".")
        if parents[0] not in names:
            continue
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = out
        for p in new_parents:
            if not isinstance(target.get(p), dict):
                target[p] = {}
            target = target[p]
        target[new_leaf] = _merged(target.get(new_leaf), value)
        moved.append((old, new))
    return out, moved


def _merged(base: Any, over: Any) -> Any:
    """``over`` merged into ``base`` where both are mappings (a section such as
    ``trainer.wandb``), else ``over``."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}


def _copy_tree(tree: Any) -> Any:
    return {k: _copy_tree(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def from_record(cls: type, data: dict[str, Any], where: str) -> Any:
    """A job config from a record of it (a run folder's ``config.json``), which may have been
    written before keys were renamed: those are migrated with one line naming them all."""
    data, moved = migrate(cls, data)
    note_moved(cls, moved, where)
    return build(cls, data)


def note_moved(cls: type, moved: list[tuple[str, str]], where: str) -> None:
    """The one deprecation line of a record (``where``) whose old keys :func:`migrate` moved."""
    if moved:
        pairs = ", ".join(f"{old} -> {new}" for old, new in moved)
        print(
            f"{_prog(cls)}: {where} uses deprecated keys, read as their new ones: {pairs}",
            file=sys.stderr,
            flush=True,
        )


def _prog(cls: type) -> str:
    return _PROGS.get(cls.__name__, "jaxrl_agents")


# -- structured-config schemas --------------------------------------------------------------------


def schema(cls: type) -> Any:
    """The OmegaConf structured config of ``cls`` with every node writable (frozen dataclasses
    and tuples would otherwise be read-only, so Hydra could not override them)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    def writable(node: Any) -> None:
        OmegaConf.set_readonly(node, None)
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for k in list(keys):
            child = node._get_node(k)
            if isinstance(child, DictConfig | ListConfig):
                writable(child)

    def declared(node: Any, tp: type) -> None:
        # OmegaConf instantiates the dataclass, and some __post_init__ fill in derived values
        # (EngineConfig's decode windows and prefill rows depend on other fields): put back the
        # declared defaults, so a derived value follows the fields the user overrides.
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            sub = hints[f.name]
            if dataclasses.is_dataclass(sub) and isinstance(node[f.name], DictConfig):
                declared(node[f.name], sub)
            elif f.default is not dataclasses.MISSING:
                node[f.name] = f.default

    node = OmegaConf.structured(cls)
    writable(node)
    declared(node, cls)
    # A group holding old keys (RENAMED) accepts unknown keys while Hydra composes, so an old
    # key on the command line or in a YAML file reaches build(), which moves it to its new key
    # (or names a typo); its sub-groups stay strict.
    for group in sorted({old.split(".")[0] for old in RENAMED}):
        if group in node and isinstance(node[group], DictConfig):
            OmegaConf.set_struct(node[group], False)
            for key in node[group]:
                child = node[group]._get_node(key)
                if isinstance(child, DictConfig):
                    OmegaConf.set_struct(child, True)
    return node


def from_tree(cls: type, tree: Any) -> Any:
    """A composed OmegaConf tree (or plain dict) -> the dataclass ``cls``, strictly."""
    from omegaconf import DictConfig, OmegaConf

    data = OmegaConf.to_container(tree, resolve=True) if isinstance(tree, DictConfig) else tree
    data = dict(data)
    data.pop("hydra", None)
    return build(cls, data)


# -- strict building ------------------------------------------------------------------------------


def build(cls: type, data: Any, path: str = "") -> Any:
    """Strictly build dataclass ``cls`` from nested dicts; errors name the dotted key. At the top
    level an old key (:data:`RENAMED`) is moved to its new one, one deprecation line each."""
    if not dataclasses.is_dataclass(cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config key '{path or '<root>'}' must be a mapping, got {data!r}")
    if not path:
        data, moved = migrate(cls, data)
        for old, new in moved:
            print(f"{_prog(cls)}: {old} is deprecated, use {new}", file=sys.stderr, flush=True)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"'{path}'" if path else "the top level"
        names = ", ".join(repr(f"{path}.{k}" if path else k) for k in unknown)
        raise ConfigError(
            f"unknown config key(s) {names} in {where}; valid keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        kwargs[name] = _coerce(hints[name], value, key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        field = _culprit(kwargs, str(e))
        key = ".".join(p for p in (path, field) if p) or "config"
        raise ConfigError(f"{key}: {e}") from e


def _culprit(kwargs: dict[str, Any], msg: str) -> str | None:
    """The field a dataclass's validation message is about: named as ``field=`` / ``field:``,
    else the field whose (string) value the message quotes, else a field named as a word."""
    for name in kwargs:
        if re.search(rf"\b{re.escape(name)}\s*[=:]", msg):
            return name
    for name, value in kwargs.items():
        if isinstance(value, str) and repr(value) in msg:
            return name
    for name in kwargs:
        if re.search(rf"\b{re.escape(name)}\b", msg):
            return name
    return None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, key) if len(args) == 1 else value
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true/false, got {value!r}")
        return value
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if tp is int and float(value) != int(value):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return tp(value)
    if tp is str and not isinstance(value, str):
        raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config key '{key}' must be a list, got {value!r}")
        args = typing.get_args(tp)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            elem = [args[0] if args else Any] * len(value)
        elif args:
            if len(args) != len(value):
                raise ConfigError(f"config key '{key}' needs {len(args)} entries, got {value!r}")
            elem = list(args)
        else:
            elem = [Any] * len(value)
        items = [
            _coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(elem, value, strict=True))
        ]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {value!r}")
        return dict(value)
    return value
