"""The builders of the jobs' components, one way to make each thing from its config group: the
env binding (:func:`resolve_env`), tokenizer and chat format (:func:`build_tokenizer`,
:func:`build_chat`), the policy (:func:`build_model`, :func:`build_policy`), the sampler engine
and the reward composer; and the start-up check of a chat format and rollout limits against the
env's oracle (:func:`check_oracle_limits`). Errors are :class:`ConfigError` naming the dotted key.
The train job wires them into a ``jobs.system.TrainSystem``; the eval and export jobs use them as
they are.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx

from jaxrl_agents.algos import LossConfig
from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer
from jaxrl_agents.chat.templates import resolve_template
from jaxrl_agents.chat.tool_calls import TOOL_CALL_PARSERS, detect_tool_parser
from jaxrl_agents.envs import Env, resolve_env_class
from jaxrl_agents.generation import Engine, EngineConfig
from jaxrl_agents.jobs.config import ChatSpec, ConfigError, EnvSpec, ModelSpec, RunConfig
from jaxrl_agents.models import ModelConfig, Transformer, load_pretrained
from jaxrl_agents.models.gguf import GGUFError, is_gguf, local_folder
from jaxrl_agents.models.lora import add_lora
from jaxrl_agents.rewards import RewardComposer, RewardConfig
from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine
from jaxrl_agents.rollout.scripted import accepts, oracle_for
from jaxrl_agents.sharding import shard_model
from jaxrl_agents.training.critic import ATTR, attach_critic
from jaxrl_agents.types import EndReason, Task, ToolErrorKind

# -- environments ---------------------------------------------------------------------------------


@dataclasses.dataclass
class EnvBinding:
    """An env class with its validated constructor and task-generator arguments."""

    cls: type[Env]
    kwargs: dict[str, Any]
    task_kwargs: dict[str, Any]
    golden_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Constructor arguments of the SFT golden episodes' env (``env.sft_options`` over these)."""
    golden_task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``make_tasks`` arguments of the SFT golden data (``env.sft_tasks`` over these)."""
    train_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Constructor arguments of the RL training episodes' env (``env.rl_options`` over these)."""

    def factory(self) -> Env:
        return self.cls(**self.kwargs)

    def train_factory(self) -> Env:
        return self.cls(**{**self.kwargs, **self.train_kwargs})

    def golden_factory(self) -> Env:
        return self.cls(**{**self.kwargs, **self.golden_kwargs})

    def tasks(self, split: str, n: int, *, seed: int) -> list[Task]:
        return self.cls.make_tasks(split, n, seed=seed, **self.task_kwargs)

    def golden_tasks(self, split: str, n: int, *, seed: int) -> list[Task]:
        kw = {**self.task_kwargs, **self.golden_task_kwargs}
        return self.cls.make_tasks(split, n, seed=seed, **kw)

    @property
    def label(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__name__}"

    def oracle(self, options: dict[str, Any], *, rng: Any = None, key: str = "env.oracle"):
        """``task -> policy`` of the env's scripted solver with ``options`` (checked by name)."""
        try:
            fn = oracle_for(self.cls)
        except ValueError as e:
            raise ConfigError(f"env.name={self.cls.__name__}: {e}") from e
        kw = dict(options)
        for name in kw:
            if not accepts(fn, name):
                valid = [p for p in inspect.signature(fn).parameters if p not in ("task", "rng")]
                raise ConfigError(
                    f"{key}.{name}: {self.cls.__name__}'s oracle_policy has no such argument; "
                    f"valid: {', '.join(valid) or '(none)'}"
                )
        try:  # the values too, on one task, so a bad one stops at start-up in one line
            fn(self.tasks("train", 1, seed=0)[0], **kw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{key}: {e}") from e
        if rng is not None and accepts(fn, "rng"):
            kw["rng"] = rng
        return lambda task: fn(task, **kw)


def resolve_env(spec: EnvSpec, *, extra_task_kwargs: dict[str, Any] | None = None) -> EnvBinding:
    """Resolve ``env.name`` and check ``env.options`` / ``env.tasks`` against the class (one env
    is constructed and the ``make_tasks`` signature read, so bad names fail now)."""
    try:
        cls = resolve_env_class(spec.name)
    except ValueError as e:
        raise ConfigError(f"env.name: {e}") from e
    kwargs = spec.env_kwargs()
    checks = [("env.options", {}), ("env.sft_options", spec.sft_options)]
    if spec.rl_options:  # (an unset one is env.options, checked)
        checks.append(("env.rl_options", spec.rl_options))
    for key, options in checks:
        try:  # constructor arguments checked now, not in the first episode
            cls(**{**kwargs, **options})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key}: {e}") from e
    task_kwargs = {**spec.tasks, **(extra_task_kwargs or {})}
    params = inspect.signature(cls.make_tasks).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, given in (("env.tasks", task_kwargs), ("env.sft_tasks", spec.sft_tasks)):
        bad = [k for k in given if k not in params and not takes_any]
        if bad:
            valid = [p for p in params if p not in ("cls", "split", "n", "seed")]
            raise ConfigError(
                f"{key}.{bad[0]}: {cls.__name__}.make_tasks has no such argument; "
                f"valid: {', '.join(valid) or '(none)'}"
            )
    golden = (spec.rl_options, {}) if spec.sft_like_rl else (spec.sft_options, spec.sft_tasks)
    return EnvBinding(cls, kwargs, task_kwargs, *map(dict, golden), dict(spec.rl_options))


# -- model pieces ---------------------------------------------------------------------------------


def model_folder(path: str | None, key: str = "model.path") -> str | None:
    """``path`` as a local Hugging Face folder: a ``.gguf`` file or a named GGUF model
    (``smollm2``) becomes its cached converted folder (``models.gguf``), converted on first use;
    anything else is returned as given. ``ConfigError`` naming ``key`` when the GGUF model is
    missing, unreadable or unsupported."""
    if path is None:
        return None
    if not is_gguf(path):
        return path
    try:
        return str(local_folder(path))
    except GGUFError as e:
        raise ConfigError(f"{key}={path}: {e}") from e


def build_tokenizer(spec: ChatSpec, model_path: str | None = None):
    """``chat.tokenizer``, else the model folder's own, else the shipped tiny one; with
    ``chat.template`` set, a private copy carrying that template (so checkpoints and exports
    keep the template the policy was trained with). A GGUF model (``.gguf`` file, ``smollm2``)
    gives the tokenizer of its converted folder (:func:`model_folder`)."""
    path = spec.tokenizer or model_path
    template = None
    if spec.template is not None:
        try:
            template = resolve_template(spec.template)
        except (ValueError, OSError) as e:
            raise ConfigError(f"chat.template={spec.template}: {e}") from e
    if path is None or path == "tiny":
        tok = load_tiny_tokenizer(cached=template is None)
    else:
        key = "chat.tokenizer" if spec.tokenizer else "model.path"
        path = model_folder(path, key)
        if not Path(path).is_dir():
            raise ConfigError(
                f"{key}={path}: not a folder; expected a tokenizer or model "
                "folder, a .gguf file or one of: smollm2"
            )
        # Imported here: transformers' AutoTokenizer takes ~3.9 s to import (measured with
        # jobs.config loaded), and this module is imported by jobs and tools that never load a
        # tokenizer from a folder.
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{key}={path}: cannot load a tokenizer: {e}") from e
    if template is not None:
        tok.chat_template = template
    return tok


def stop_ids_of(folder: str | None) -> list[int]:
    """The ``eos_token_id`` list of a checkpoint folder's ``generation_config.json`` (every id
    that ends generation, e.g. Qwen's ``<|im_end|>`` and ``<|endoftext|>``); [] without one.
    A GGUF model's is the one of its converted folder (:func:`model_folder`)."""
    folder = model_folder(folder)
    if folder is None or not (Path(folder) / "generation_config.json").is_file():
        return []
    eos = json.loads((Path(folder) / "generation_config.json").read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def build_chat(spec: ChatSpec, model_path: str | None = None, tokenizer: Any = None) -> ChatFormat:
    """The policy's ``ChatFormat`` from the ``chat`` group (errors name the ``chat.*`` key).
    ``tokenizer``: an already loaded one (e.g. a checkpoint's); default :func:`build_tokenizer`."""
    tok = tokenizer if tokenizer is not None else build_tokenizer(spec, model_path)
    template = getattr(tok, "chat_template", None)
    label = spec.template or f"(the tokenizer's own, {spec.tokenizer or model_path or 'tiny'})"
    if not isinstance(template, str) or not template:
        raise ConfigError(
            f"chat.template: the tokenizer of {label} has no chat template; set "
            "chat.template to a template file or one of tiny, qwen2.5"
        )
    parser = spec.tool_parser
    if parser == "auto":
        try:
            parser = detect_tool_parser(template)
        except ValueError as e:
            raise ConfigError(f"chat.tool_parser=auto with chat.template={label}: {e}") from e
    elif parser not in TOOL_CALL_PARSERS:
        raise ConfigError(
            f"chat.tool_parser={parser}: not a registered tool-call format; valid: "
            f"auto, {', '.join(sorted(TOOL_CALL_PARSERS))}"
        )
    extra = stop_ids_of(model_path) + stop_ids_of(spec.tokenizer)
    try:
        chat = ChatFormat(
            tok,
            tool_parser=parser,
            thinking=spec.thinking,
            max_tool_calls=spec.max_tool_calls,
            extra_stop_ids=extra,
        )
    except ValueError as e:
        key = "chat.thinking" if "thinking" in str(e) else "chat.template"
        raise ConfigError(f"{key} ({label}): {e}") from e
    chat.template_label = label
    return chat


def raise_mismatch(chat: ChatFormat, engine: ScriptedEngine) -> None:
    """``ConfigError`` for the first template / parser mismatch a checking scripted engine saw."""
    if not engine.mismatches:
        return
    try:
        fits = detect_tool_parser(chat.chat_template)
    except ValueError:
        fits = None
    hint = (
        f"set chat.tool_parser={fits} (the format this template renders)"
        if fits and fits != chat.tool_parser
        else "choose a chat.template that renders this parser's format"
    )
    label = getattr(chat, "template_label", "(the tokenizer's own)")
    raise ConfigError(
        f"chat.template={label} and chat.tool_parser={chat.tool_parser} do not match: "
        f"{engine.mismatches[0]}; {hint}"
    )


def build_model(spec: ModelSpec, *, vocab_size: int, mesh=None, seed: int = 0) -> Transformer:
    """A policy from a local HF folder, or a fresh random one from ``spec.init``."""
    if spec.path is not None:
        model, _ = load_pretrained(
            model_folder(spec.path),
            mesh=mesh,
            dtype=spec.dtype,
            param_dtype=spec.param_dtype,
            tokenizer=False,
            remat=spec.remat,
            attention=spec.attention,
            scan_unroll=spec.scan_unroll,
        )
        return model
    if not spec.init:
        raise ConfigError("model.path is null and model.init is empty: give one of them")
    cfg = ModelConfig.from_hf_config({"vocab_size": vocab_size, **spec.init})
    names = {f.name for f in dataclasses.fields(cfg)}
    kw = {
        "dtype": spec.dtype,
        "param_dtype": spec.param_dtype,
        "remat": spec.remat,
        "attention": spec.attention,
        "scan_unroll": spec.scan_unroll,
    }
    cfg = dataclasses.replace(cfg, **{k: v for k, v in kw.items() if k in names})
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    return shard_model(model, mesh) if mesh is not None else model


def uses_critic(loss: LossConfig) -> bool:
    """Whether the run trains a critic (a value head on the policy's trunk): the loss has a
    value term (``loss.vf_coef > 0``)."""
    return loss.vf_coef > 0


def build_policy(cfg: RunConfig, *, vocab_size: int, mesh=None) -> Transformer:
    """The policy of ``cfg`` (``build_model``), with its critic attached when the run has one.
    Takes the whole config: it reads ``model``, ``loss``, ``seed`` and ``trainer.rl.seed``."""
    model = build_model(cfg.model, vocab_size=vocab_size, mesh=mesh, seed=cfg.seed)
    lora = cfg.model.lora.config()
    if lora is not None:  # adapters on the frozen base, drawn from the run's seed
        add_lora(model, lora, seed=cfg.seed, mesh=mesh)
    if uses_critic(cfg.loss):
        rl_seed = cfg.trainer.rl.seed
        attach_critic(model, seed=cfg.seed if rl_seed is None else rl_seed)
    return model


def trainable(model: Transformer) -> Any:
    """The NNX filter of what the optimizer trains: every ``nnx.Param``, or with LoRA
    (``model.lora``) the adapters and the critic's head only, the base frozen."""
    if getattr(model.cfg, "lora", None) is None:
        return nnx.Param
    return nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, nnx.PathContains(ATTR)))


def split_params(model: Transformer) -> tuple[Any, Any, Any]:
    """(graphdef, trainable params, everything else) of an NNX model (see :func:`trainable`)."""
    return nnx.split(model, trainable(model), ...)


def build_engine(model: Transformer, cfg: EngineConfig, *, mesh=None) -> Engine:
    return Engine(model, cfg, mesh=mesh)


def generation_defaults(rollout: RolloutConfig) -> dict[str, Any]:
    """The ``rollout`` group's sampling settings as Hugging Face ``generation_config`` entries, so
    an exported policy samples by default the way it was trained to."""
    if rollout.sampling.temperature == 0:
        return {"do_sample": False}
    # top_k always: transformers' default is 50, while 0 keeps every token, as in training.
    out = {
        "do_sample": True,
        "temperature": rollout.sampling.temperature,
        "top_p": rollout.sampling.top_p,
        "top_k": rollout.sampling.top_k,
    }
    if rollout.sampling.min_p > 0:
        out["min_p"] = rollout.sampling.min_p
    return out


def build_collector(**kwargs: Any) -> Collector:
    """The rollout collector: the built-in episode loop, or ``rollout.agent``'s agent function
    (``serve.agent_collector.AgentCollector``) when it names one. ``kwargs``: the
    :class:`Collector` fields."""
    path = kwargs["rollout"].agent
    if path is None:
        return Collector(**kwargs)
    try:  # the optional `serve` extra (starlette, uvicorn, openai): imported only when asked for
        from jaxrl_agents.serve.agent_collector import AgentCollector, resolve_agent
    except ImportError as e:
        raise ConfigError(
            f"rollout.agent={path!r} needs the serve extra: pip install 'jaxrl-agents[serve]' ({e})"
        ) from e
    try:
        agent = resolve_agent(path)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return AgentCollector(agent=agent, **kwargs)


def build_reward(cfg: RewardConfig, judges: dict[str, Any] | None = None) -> RewardComposer:
    """The reward composer; ``judges``: judges by name for the ``judge`` terms (a model judge)."""
    return RewardComposer(cfg, judges=judges)


async def check_oracle_limits(
    chat: ChatFormat,
    env: EnvBinding,
    options: dict[str, Any],
    rollout: RolloutConfig,
    extra: Sequence[tuple[str, int, str, str]] = (),
    *,
    n: int = 16,
    env_key: str = "env.name",
) -> dict[str, int]:
    """The oracle's ``n`` train episodes without limits through ``chat``: ``ConfigError`` on a
    template / tool-parser mismatch, when it answers none, or when ``rollout``'s limits (and the
    ``extra`` ``(key, value, need, what)`` ones) cannot hold them. Returns what they need."""
    free = RolloutConfig(
        group_size=1,
        max_turns=64,
        max_new_tokens=1 << 16,
        max_total_tokens=1 << 22,
        episode_timeout_s=rollout.episode_timeout_s,
    )
    engine = ScriptedEngine(
        chat,
        policy_factory=env.oracle(options, rng=np.random.default_rng(0)),
        check_round_trip=True,
    )
    orch = Collector(chat=chat, env_factory=env.factory, rollout=free).orchestrator(
        engine, greedy=True, group_size=1
    )
    trajs = await orch.run(env.tasks("train", n, seed=0), group_size=1, seed=0)
    raise_mismatch(chat, engine)  # a template / parser mismatch, named as such
    done = [t for t in trajs if t.end_reason == EndReason.ANSWERED and t.turns]
    name = env.cls.__name__
    if not done:
        first = next((t.error for t in trajs if t.error), "") or ""
        raise ConfigError(
            f"{env_key}: {name}'s oracle answered none of {n} tasks without limits "
            f"(ends: {sorted({t.end_reason.value for t in trajs})}) {first.splitlines()[:1]}"
        )
    # A tool that timed out on a loaded machine costs the oracle a retry turn (and the episode
    # more tokens): what the episodes need is measured on those without one, when there are any.
    kinds = [{r.error_kind for turn in t.turns for r in turn.tool_results} for t in done]
    done = [t for t, k in zip(done, kinds, strict=True) if ToolErrorKind.TIMEOUT not in k] or done
    need = {
        "turns": max(len(t.turns) for t in done),
        "turn_tokens": max(tt.end - tt.start for t in done for tt in t.turns),
        "total_tokens": max(len(t.token_ids) for t in done),
    }
    checks = [
        ("rollout.max_turns", rollout.max_turns, "turns", "turns"),
        ("rollout.max_new_tokens", rollout.max_new_tokens, "turn_tokens", "tokens in a turn"),
        ("rollout.max_total_tokens", rollout.max_total_tokens, "total_tokens", "tokens in all"),
        *extra,
    ]
    for key, have, what_need, what in checks:
        needed = need[what_need]
        if have < needed:
            shown = have - 1 if "seq_buckets" in key else have
            raise ConfigError(
                f"{key}={shown} cannot hold {name}'s oracle episodes: they need up to "
                f"{needed - ('seq_buckets' in key)} {what} (measured on {len(done)} train tasks "
                f"with the policy's tokenizer); raise {key.split(' ')[0]} to at least "
                f"{needed - ('seq_buckets' in key)}"
            )
    return need
