"""The composition root: everything a job needs, built from one typed config.

:func:`build_train` turns a :class:`RunConfig` into a :class:`TrainSystem` — tokenizer and chat
format, the policy and its shardings, the sampler view of its weights, the env binding, the reward
composer and the rollout collector. Every cross-group check runs first (:func:`check_run`), before
anything compiles, and raises :class:`ConfigError` naming the dotted key. The eval and export jobs
use the same builders (:func:`build_tokenizer`, :func:`build_model`, :func:`resolve_env`, ...), so
there is one way to make each thing.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.jobs.config import ChatSpec, ConfigError, EnvSpec, ModelSpec, RunConfig

# -- environments ---------------------------------------------------------------------------------


@dataclasses.dataclass
class EnvBinding:
    """An env class with its validated constructor and task-generator arguments."""

    cls: type
    kwargs: dict[str, Any]
    task_kwargs: dict[str, Any]
    golden_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Constructor arguments of the SFT golden episodes' env (``env.sft_options`` over these)."""
    golden_task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``make_tasks`` arguments of the SFT golden data (``env.sft_tasks`` over these)."""

    def factory(self) -> Any:
        return self.cls(**self.kwargs)

    def golden_factory(self) -> Any:
        return self.cls(**{**self.kwargs, **self.golden_kwargs})

    def tasks(self, split: str, n: int, *, seed: int) -> list:
        return self.cls.make_tasks(split, n, seed=seed, **self.task_kwargs)

    def golden_tasks(self, split: str, n: int, *, seed: int) -> list:
        kw = {**self.task_kwargs, **self.golden_task_kwargs}
        return self.cls.make_tasks(split, n, seed=seed, **kw)

    @property
    def label(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__name__}"

    def oracle(self, options: dict[str, Any], *, rng: Any = None, key: str = "env.oracle"):
        """``task -> policy`` of the env's scripted solver with ``options`` (checked by name)."""
        from jaxrl_agents.rollout.scripted import accepts, oracle_for

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
    from jaxrl_agents.envs import resolve_env_class

    try:
        cls = resolve_env_class(spec.name)
    except ValueError as e:
        raise ConfigError(f"env.name: {e}") from e
    kwargs = spec.env_kwargs()
    for key, options in (("env.options", {}), ("env.sft_options", spec.sft_options)):
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
    return EnvBinding(cls, kwargs, task_kwargs, dict(spec.sft_options), dict(spec.sft_tasks))


# -- model pieces ---------------------------------------------------------------------------------


def model_folder(path: str | None, key: str = "model.path") -> str | None:
    """``path`` as a local Hugging Face folder: a ``.gguf`` file or a named GGUF model
    (``smollm2``) becomes its cached converted folder (``models.gguf``), converted on first use;
    anything else is returned as given. ``ConfigError`` naming ``key`` when the GGUF model is
    missing, unreadable or unsupported."""
    if path is None:
        return None
    from jaxrl_agents.models.gguf import GGUFError, is_gguf, local_folder

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
    from jaxrl_agents.chat import load_tiny_tokenizer

    path = spec.tokenizer or model_path
    template = None
    if spec.template is not None:
        from jaxrl_agents.chat.templates import resolve_template

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
            raise ConfigError(f"{key}={path}: not a folder; expected a tokenizer or model "
                              "folder, a .gguf file or one of: smollm2")  # fmt: skip
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
    import json

    folder = model_folder(folder)
    if folder is None or not (Path(folder) / "generation_config.json").is_file():
        return []
    eos = json.loads((Path(folder) / "generation_config.json").read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def build_chat(spec: ChatSpec, model_path: str | None = None, tokenizer: Any = None):
    """The policy's ``ChatFormat`` from the ``chat`` group (errors name the ``chat.*`` key).
    ``tokenizer``: an already loaded one (e.g. a checkpoint's); default :func:`build_tokenizer`."""
    from jaxrl_agents.chat import ChatFormat
    from jaxrl_agents.chat.tool_calls import TOOL_CALL_PARSERS, detect_tool_parser

    tok = tokenizer if tokenizer is not None else build_tokenizer(spec, model_path)
    template = getattr(tok, "chat_template", None)
    label = spec.template or f"(the tokenizer's own, {spec.tokenizer or model_path or 'tiny'})"
    if not isinstance(template, str) or not template:
        raise ConfigError(f"chat.template: the tokenizer of {label} has no chat template; set "
                          "chat.template to a template file or one of tiny, qwen2.5")  # fmt: skip
    parser = spec.tool_parser
    if parser == "auto":
        try:
            parser = detect_tool_parser(template)
        except ValueError as e:
            raise ConfigError(f"chat.tool_parser=auto with chat.template={label}: {e}") from e
    elif parser not in TOOL_CALL_PARSERS:
        raise ConfigError(f"chat.tool_parser={parser}: not a registered tool-call format; valid: "
                          f"auto, {', '.join(sorted(TOOL_CALL_PARSERS))}")  # fmt: skip
    extra = stop_ids_of(model_path) + stop_ids_of(spec.tokenizer)
    try:
        chat = ChatFormat(tok, tool_parser=parser, thinking=spec.thinking,
                          max_tool_calls=spec.max_tool_calls, extra_stop_ids=extra)  # fmt: skip
    except ValueError as e:
        key = "chat.thinking" if "thinking" in str(e) else "chat.template"
        raise ConfigError(f"{key} ({label}): {e}") from e
    chat.template_label = label
    return chat


def raise_mismatch(chat: Any, engine: Any) -> None:
    """``ConfigError`` for the first template / parser mismatch a checking scripted engine saw."""
    if not engine.mismatches:
        return
    from jaxrl_agents.chat.tool_calls import detect_tool_parser

    try:
        fits = detect_tool_parser(chat.chat_template)
    except ValueError:
        fits = None
    hint = (f"set chat.tool_parser={fits} (the format this template renders)"
            if fits and fits != chat.tool_parser
            else "choose a chat.template that renders this parser's format")  # fmt: skip
    label = getattr(chat, "template_label", "(the tokenizer's own)")
    raise ConfigError(
        f"chat.template={label} and chat.tool_parser={chat.tool_parser} do not match: "
        f"{engine.mismatches[0]}; {hint}"
    )


def build_model(spec: ModelSpec, *, vocab_size: int, mesh=None, seed: int = 0):
    """A policy from a local HF folder, or a fresh random one from ``spec.init``."""
    from flax import nnx

    from jaxrl_agents.models import ModelConfig, Transformer, load_pretrained
    from jaxrl_agents.sharding import shard_model

    if spec.path is not None:
        model, _ = load_pretrained(
            model_folder(spec.path), mesh=mesh, dtype=spec.dtype, param_dtype=spec.param_dtype,
            tokenizer=False, remat=spec.remat, attention=spec.attention,
        )  # fmt: skip
        return model
    if not spec.init:
        raise ConfigError("model.path is null and model.init is empty: give one of them")
    cfg = ModelConfig.from_hf_config({"vocab_size": vocab_size, **spec.init})
    names = {f.name for f in dataclasses.fields(cfg)}
    kw = {"dtype": spec.dtype, "param_dtype": spec.param_dtype, "remat": spec.remat,
          "attention": spec.attention}  # fmt: skip
    cfg = dataclasses.replace(cfg, **{k: v for k, v in kw.items() if k in names})
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    return shard_model(model, mesh) if mesh is not None else model


def uses_critic(cfg: RunConfig) -> bool:
    """Whether the run trains a critic (a value head on the policy's trunk): the loss has a
    value term (``loss.vf_coef > 0``)."""
    return cfg.loss.vf_coef > 0


def build_policy(cfg: RunConfig, *, vocab_size: int, mesh=None):
    """The policy of ``cfg`` (``build_model``), with its critic attached when the run has one."""
    model = build_model(cfg.model, vocab_size=vocab_size, mesh=mesh, seed=cfg.seed)
    lora = cfg.model.lora.config()
    if lora is not None:  # adapters on the frozen base, drawn from the run's seed
        from jaxrl_agents.models.lora import add_lora

        add_lora(model, lora, seed=cfg.seed, mesh=mesh)
    if uses_critic(cfg):
        from jaxrl_agents.training.critic import attach_critic

        rl_seed = cfg.trainer.rl.seed
        attach_critic(model, seed=cfg.seed if rl_seed is None else rl_seed)
    return model


def trainable(model) -> Any:
    """The NNX filter of what the optimizer trains: every ``nnx.Param``, or with LoRA
    (``model.lora``) the adapters and the critic's head only, the base frozen."""
    from flax import nnx

    if getattr(model.cfg, "lora", None) is None:
        return nnx.Param
    from jaxrl_agents.training.critic import ATTR

    return nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, nnx.PathContains(ATTR)))


def split_params(model) -> tuple[Any, Any, Any]:
    """(graphdef, trainable params, everything else) of an NNX model (see :func:`trainable`)."""
    from flax import nnx

    return nnx.split(model, trainable(model), ...)


def build_engine(model, cfg, *, mesh=None):
    from jaxrl_agents.generation import Engine

    return Engine(model, cfg, mesh=mesh)


def generation_defaults(rollout) -> dict[str, Any]:
    """The ``rollout`` group's sampling settings as Hugging Face ``generation_config`` entries, so
    an exported policy samples by default the way it was trained to."""
    if rollout.sampling.temperature == 0:
        return {"do_sample": False}
    # top_k always: transformers' default is 50, while 0 keeps every token, as in training.
    s = rollout.sampling
    out = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}
    if s.min_p > 0:
        out["min_p"] = s.min_p
    return out


def build_reward(cfg):
    from jaxrl_agents.rewards import RewardComposer

    return RewardComposer(cfg)


# -- the training system --------------------------------------------------------------------------


@dataclasses.dataclass
class TrainSystem:
    """The wired training job (see module docstring)."""

    cfg: RunConfig
    mesh: Any
    sampler_mesh: Any
    """Where the sampler runs: ``mesh`` with one process, else this process's block of it."""
    tokenizer: Any
    chat: Any
    model: Any
    graphdef: Any
    rest: Any
    env: EnvBinding
    reward: Any
    collector: Any
    loss: Any
    """The policy loss as trained (``cfg.loss`` with derived defaults filled in, see
    :func:`effective_loss`)."""
    _sampler_rest: Any = dataclasses.field(default=None, repr=False)

    @property
    def initial_params(self) -> Any:
        return split_params(self.model)[1]

    def merged(self, params: Any) -> Any:
        from flax import nnx

        return nnx.merge(self.graphdef, params, self.rest)

    def sampler_view(self, params: Any) -> Any:
        """The policy with ``params`` on the sampler's mesh (with several processes a collective:
        every process calls it at the same point)."""
        from jaxrl_agents import distributed as D

        if self.sampler_mesh is self.mesh:
            return self.merged(params)
        if self._sampler_rest is None:
            self._sampler_rest = D.replicate_locally(self.rest, self.mesh, self.sampler_mesh)
        from flax import nnx

        local = D.replicate_locally(params, self.mesh, self.sampler_mesh)
        return nnx.merge(self.graphdef, local, self._sampler_rest)

    def engine(self, params: Any):
        return build_engine(self.sampler_view(params), self.cfg.sampler, mesh=self.sampler_mesh)

    def golden_collector(self):
        """The collector of SFT golden data: the same rollout path, no reward, the env with
        ``env.sft_options``."""
        return dataclasses.replace(self.collector, reward=None, env_factory=self.env.golden_factory)


def seq_buckets(cfg: RunConfig) -> list[int]:
    """``trainer.batching.seq_buckets``, or the ladder 128, 192, 256, 384, 512, 768, ... up to the
    first length that holds ``rollout.max_total_tokens``."""
    if cfg.trainer.batching.seq_buckets is not None:
        return sorted(cfg.trainer.batching.seq_buckets)
    out, n = [128], 128
    while out[-1] < cfg.rollout.max_total_tokens:
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3
        out.append(n)
    return out


def check_run(cfg: RunConfig, env: EnvBinding) -> None:
    """Cross-group checks, before anything is built or compiled; one line each."""
    import jax

    tr, r = cfg.trainer, cfg.rollout
    try:
        cfg.advantage.validate(group_size=r.group_size, has_turns=True, has_values=uses_critic(cfg))
    except ValueError as e:
        hint = ""
        if "value head" in str(e):
            hint = " that is trained: set loss.vf_coef > 0 (e.g. loss=ppo_value)"
        raise ConfigError(f"advantage.name={cfg.advantage.name}: {e}{hint}") from e
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        from jaxrl_agents.models.gguf import VALID, GGUFError, is_gguf, resolve_gguf

        if not is_gguf(cfg.model.path):
            raise ConfigError(f"model.path={cfg.model.path!r} is not a folder; expected {VALID}")
        try:  # found and a GGUF file; converted (once, cached) when the model is built
            resolve_gguf(cfg.model.path)
        except GGUFError as e:
            raise ConfigError(f"model.path={cfg.model.path}: {e}") from e
    if tr.sft.init_from is not None:  # RL from another run's SFT result: made the same way
        from jaxrl_agents.jobs.restore import check_sft_source

        check_sft_source(cfg)
    elif tr.sft.steps > 0 and tr.sft.oracle:  # SFT on the oracle's golden data needs one
        env.oracle(cfg.env.oracle)
    nproc = jax.process_count()
    if tr.rl.tasks_per_step % nproc:
        raise ConfigError(
            f"trainer.rl.tasks_per_step={tr.rl.tasks_per_step} is not divisible by the number of "
            f"processes ({nproc})"
        )
    if tr.sft.steps > 0 and tr.sft.batch_size % nproc:
        raise ConfigError(
            f"trainer.sft.batch_size={tr.sft.batch_size} is not divisible by the number of "
            f"processes ({nproc})"
        )
    rows = tr.rl.tasks_per_step // nproc * r.group_size
    if rows % tr.rl.minibatches:
        raise ConfigError(
            f"trainer.rl.minibatches={tr.rl.minibatches} does not divide the {rows} rows of a step "
            f"(trainer.rl.tasks_per_step x rollout.group_size per process); use a divisor of {rows}"
        )
    if (rows // tr.rl.minibatches) % tr.batching.microbatches:
        raise ConfigError(
            f"trainer.batching.microbatches={tr.batching.microbatches} does not divide a "
            f"minibatch's {rows // tr.rl.minibatches} rows"
        )
    if tr.sft.steps > 0 and (tr.sft.batch_size // nproc) % tr.batching.microbatches:
        raise ConfigError(
            f"trainer.batching.microbatches={tr.batching.microbatches} does not divide the "
            f"{tr.sft.batch_size // nproc} SFT rows per process (trainer.sft.batch_size)"
        )
    bad = [b for b in seq_buckets(cfg) if b % min(tr.batching.logprob_chunk, b)]
    if bad:
        raise ConfigError(
            f"trainer.batching.seq_buckets={list(seq_buckets(cfg))}: {bad} not a multiple of "
            f"trainer.batching.logprob_chunk={tr.batching.logprob_chunk} (the log-prob "
            "computation's chunk)"
        )
    if r.max_total_tokens > cfg.sampler.max_seq_len:
        raise ConfigError(
            f"rollout.max_total_tokens={r.max_total_tokens} exceeds sampler.max_seq_len="
            f"{cfg.sampler.max_seq_len} (the engine's per-session context); raise "
            "sampler.max_seq_len or lower rollout.max_total_tokens"
        )


def pretrained_warning(cfg: RunConfig) -> str | None:
    """One line when a pretrained checkpoint (``model.path``) meets settings made for a model
    trained from scratch: synthetic copy steps, or full fine-tuning at a learning rate >= 1e-3
    (SFT's or RL's), which wipe out what it knows within a few steps."""
    if cfg.model.path is None:
        return None
    tr, bad = cfg.trainer, []
    if tr.sft.steps > 0 and tr.sft.copy_steps > 0:
        bad.append(f"trainer.sft.copy_steps={tr.sft.copy_steps} (synthetic copy rows)")
    if cfg.model.lora.rank is None:
        if tr.sft.steps > 0 and tr.sft.lr >= 1e-3:
            bad.append(f"trainer.sft.lr={tr.sft.lr:g} with full fine-tuning")
        if tr.rl.steps > 0 and cfg.optimizer.lr >= 1e-3:
            bad.append(f"optimizer.lr={cfg.optimizer.lr:g} with full fine-tuning")
    if not bad:
        return None
    return (f"WARNING: model.path={cfg.model.path} is a pretrained checkpoint but "
            f"{' and '.join(bad)} are settings for a model trained from scratch; "
            "trainer=instruct or trainer=instruct_lora are made for it")  # fmt: skip


def _mesh(cfg: RunConfig):
    """The training mesh, checked against the batch sizes it must split."""
    import jax

    from jaxrl_agents import distributed as D
    from jaxrl_agents.sharding import MeshError, make_mesh

    m, tr, nproc = cfg.mesh, cfg.trainer, jax.process_count()
    devices = None
    if m.devices is not None:
        if m.devices < 1 or m.devices > len(jax.devices()) or nproc > 1:
            raise ConfigError(
                f"mesh.devices={m.devices}: must lie in [1, {len(jax.devices())}] "
                "(and be null with several processes)"
            )
        devices = jax.devices()[: m.devices]
    try:
        mesh = make_mesh(tuple(m.shape), devices)
    except MeshError as e:
        raise ConfigError(f"mesh.shape={list(m.shape)}: {e}") from e
    shards = 1
    for axis in D.batch_axes():
        shards *= mesh.shape[axis]
    rows = tr.rl.tasks_per_step * cfg.rollout.group_size
    sizes = {
        "a step's rows (trainer.rl.tasks_per_step x rollout.group_size)": rows,
        "a minibatch's rows (/ trainer.rl.minibatches)": rows // tr.rl.minibatches,
    }
    if tr.sft.steps > 0:
        sizes["trainer.sft.batch_size"] = tr.sft.batch_size
    for what, n in sizes.items():
        if n % shards:
            raise ConfigError(
                f"{what} = {n} does not split over the {shards} batch shards of mesh.shape="
                f"{list(m.shape)} ({' x '.join(D.batch_axes())} = {shards}); use a multiple of "
                f"{shards} or a smaller mesh (e.g. mesh=single)"
            )
    return mesh


def effective_loss(cfg: RunConfig):
    """``cfg.loss`` with ``max_len_norm: null`` resolved for ``seq-mean-token-sum-norm``: the
    episode's generation budget (``rollout.max_turns x rollout.max_new_tokens``), a constant, so
    the loss scale never follows the padded length bucket a batch happens to land in."""
    loss = cfg.loss
    if loss.agg_mode == "seq-mean-token-sum-norm" and loss.max_len_norm is None:
        budget = cfg.rollout.max_turns * cfg.rollout.max_new_tokens
        loss = dataclasses.replace(loss, max_len_norm=budget)
    return loss


async def check_oracle_fits(system: TrainSystem, *, n: int = 16) -> dict[str, int]:
    """Run the env's oracle (with ``env.oracle`` options) on ``n`` train tasks without limits,
    through the policy's chat format, and stop with one line when the chat format cannot parse
    back what its template renders, or the configured limits cannot hold the oracle's episodes
    (otherwise SFT would learn cut-off trajectories and RL could never finish one). Returns what
    the episodes need."""
    cfg, env = system.cfg, system.env
    if cfg.trainer.sft.steps == 0 or not cfg.trainer.sft.oracle:
        try:
            env.oracle(cfg.env.oracle)
        except ConfigError:
            return {}  # no oracle and no SFT on its data: nothing to measure against
    limits = [("sampler.max_seq_len", cfg.sampler.max_seq_len, "total_tokens", "tokens in all"),
              ("trainer.batching.seq_buckets (largest)", max(seq_buckets(cfg)) + 1, "total_tokens",
               "training positions")]  # fmt: skip
    return await check_oracle_limits(system.chat, env, cfg.env.oracle, cfg.rollout, limits, n=n,
                                     env_key=f"env.name={cfg.env.name}")  # fmt: skip


async def check_oracle_limits(
    chat: Any,
    env: EnvBinding,
    options: dict[str, Any],
    rollout: Any,
    extra: Sequence[tuple[str, int, str, str]] = (),
    *,
    n: int = 16,
    env_key: str = "env.name",
) -> dict[str, int]:
    """The oracle's ``n`` train episodes without limits through ``chat``: ``ConfigError`` on a
    template / tool-parser mismatch, when it answers none, or when ``rollout``'s limits (and the
    ``extra`` ``(key, value, need, what)`` ones) cannot hold them. Returns what they need."""
    import numpy as np

    from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine
    from jaxrl_agents.types import EndReason

    free = RolloutConfig(
        group_size=1,
        max_turns=64,
        max_new_tokens=1 << 16,
        max_total_tokens=1 << 22,
        episode_timeout_s=rollout.episode_timeout_s,
    )
    engine = ScriptedEngine(chat, policy_factory=env.oracle(options, rng=np.random.default_rng(0)),
                            check_round_trip=True)  # fmt: skip
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


def build_train(cfg: RunConfig) -> TrainSystem:
    """Check ``cfg``, then build every component of the training job (nothing compiles here)."""
    import sys

    import jax

    from jaxrl_agents import distributed as D
    from jaxrl_agents.rollout import Collector

    env = resolve_env(cfg.env)
    check_run(cfg, env)
    warning = pretrained_warning(cfg)
    if warning and jax.process_index() == 0:
        print(warning, file=sys.stderr, flush=True)
    mesh = _mesh(cfg)
    chat = build_chat(cfg.chat, cfg.model.path)
    tokenizer = chat.tokenizer
    model = build_policy(cfg, vocab_size=len(tokenizer), mesh=mesh)
    graphdef, _, rest = split_params(model)
    reward = build_reward(cfg.reward)
    collector = Collector(
        chat=chat,
        env_factory=env.factory,
        rollout=cfg.rollout,
        reward=reward,
        seq_buckets=tuple(seq_buckets(cfg)),
        sharding=D.batch_sharding(mesh),
    )
    return TrainSystem(
        cfg, mesh, D.local_mesh(mesh), tokenizer, chat, model, graphdef, rest, env, reward,
        collector, effective_loss(cfg),
    )  # fmt: skip
