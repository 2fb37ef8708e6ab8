"""The composition root of the training job: :func:`build_train` turns a :class:`RunConfig` into
a :class:`TrainSystem` — tokenizer and chat format, the policy and its shardings, the sampler view
of its weights, the env binding, the reward composer (with the model judge of ``jobs.judge``,
if any) and the rollout collector. Every cross-group check runs first (:func:`check_run`), before
anything compiles, and raises :class:`ConfigError` naming the dotted key. The components come
from the builders of ``jobs.build``, which the eval and export jobs use too, so there is one way
to make each thing.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import jax
from flax import nnx
from jax.sharding import Mesh

from jaxrl_agents import distributed as D
from jaxrl_agents.algos import LossConfig
from jaxrl_agents.chat import ChatFormat
from jaxrl_agents.generation import Engine
from jaxrl_agents.jobs.build import (
    EnvBinding,
    build_chat,
    build_collector,
    build_engine,
    build_policy,
    build_reward,
    check_oracle_limits,
    resolve_env,
    split_params,
    uses_critic,
)
from jaxrl_agents.jobs.config import ConfigError, RunConfig, TrainerSpec
from jaxrl_agents.jobs.judge import JudgeRuntime, build_judge, check_judge
from jaxrl_agents.jobs.restore import check_sft_source
from jaxrl_agents.models import Transformer
from jaxrl_agents.models.gguf import VALID, GGUFError, is_gguf, resolve_gguf
from jaxrl_agents.rewards import RewardComposer
from jaxrl_agents.rollout import Collector, RolloutConfig
from jaxrl_agents.sharding import MeshError, make_mesh

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclasses.dataclass
class TrainSystem:
    """The wired training job (see module docstring)."""

    cfg: RunConfig
    mesh: Mesh
    sampler_mesh: Mesh
    """Where the sampler runs: ``mesh`` with one process, else this process's block of it."""
    tokenizer: PreTrainedTokenizerBase
    chat: ChatFormat
    model: Transformer
    graphdef: nnx.GraphDef
    rest: nnx.State
    """Everything of the policy but its trainable parameters (see ``jobs.build.trainable``)."""
    env: EnvBinding
    reward: RewardComposer
    collector: Collector
    loss: LossConfig
    """The policy loss as trained (``cfg.loss`` with derived defaults filled in, see
    :func:`effective_loss`)."""
    judge: JudgeRuntime | None = None
    """The model judge (``judge.enabled``), registered with ``reward`` as ``judge.name``; its
    engine runs with the job (``jobs.judge.start_judge``)."""
    _sampler_rest: nnx.State | None = dataclasses.field(default=None, repr=False)

    @property
    def initial_params(self) -> nnx.State:
        return split_params(self.model)[1]

    def merged(self, params: nnx.State) -> Transformer:
        return nnx.merge(self.graphdef, params, self.rest)

    def sampler_view(self, params: nnx.State) -> Transformer:
        """The policy with ``params`` on the sampler's mesh (with several processes a collective:
        every process calls it at the same point)."""
        if self.sampler_mesh is self.mesh:
            return self.merged(params)
        if self._sampler_rest is None:
            self._sampler_rest = D.replicate_locally(self.rest, self.mesh, self.sampler_mesh)
        local = D.replicate_locally(params, self.mesh, self.sampler_mesh)
        return nnx.merge(self.graphdef, local, self._sampler_rest)

    def engine(self, params: nnx.State) -> Engine:
        return build_engine(self.sampler_view(params), self.cfg.sampler, mesh=self.sampler_mesh)

    def golden_collector(self) -> Collector:
        """The collector of SFT golden data: the same rollout path, no reward, the env with
        ``env.sft_options``."""
        return dataclasses.replace(self.collector, reward=None, env_factory=self.env.golden_factory)

    def train_collector(self) -> Collector:
        """The collector of RL (and RFT) training episodes: the env with ``env.rl_options``
        (evaluations keep ``collector``)."""
        if not self.env.train_kwargs:
            return self.collector
        return dataclasses.replace(self.collector, env_factory=self.env.train_factory)


def seq_buckets(trainer: TrainerSpec, rollout: RolloutConfig) -> list[int]:
    """``trainer.batching.seq_buckets``, or the ladder 128, 192, 256, 384, 512, 768, ... up to the
    first length that holds ``rollout.max_total_tokens``."""
    if trainer.batching.seq_buckets is not None:
        return sorted(trainer.batching.seq_buckets)
    out, n = [128], 128
    while out[-1] < rollout.max_total_tokens:
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3
        out.append(n)
    return out


def check_run(cfg: RunConfig, env: EnvBinding) -> None:
    """Cross-group checks, before anything is built or compiled; one line each. Reads every
    group, so it takes the whole config."""
    tr, r = cfg.trainer, cfg.rollout
    try:
        cfg.advantage.validate(
            group_size=r.group_size, has_turns=True, has_values=uses_critic(cfg.loss)
        )
    except ValueError as e:
        hint = ""
        if "value head" in str(e):
            hint = " that is trained: set loss.vf_coef > 0 (e.g. loss=ppo_value)"
        raise ConfigError(f"advantage.name={cfg.advantage.name}: {e}{hint}") from e
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        if not is_gguf(cfg.model.path):
            raise ConfigError(f"model.path={cfg.model.path!r} is not a folder; expected {VALID}")
        try:  # found and a GGUF file; converted (once, cached) when the model is built
            resolve_gguf(cfg.model.path)
        except GGUFError as e:
            raise ConfigError(f"model.path={cfg.model.path}: {e}") from e
    if tr.sft.init_from is not None:  # RL from another run's SFT result: made the same way
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
    buckets = seq_buckets(cfg.trainer, cfg.rollout)
    bad = [b for b in buckets if b % min(tr.batching.logprob_chunk, b)]
    if bad:
        raise ConfigError(
            f"trainer.batching.seq_buckets={list(buckets)}: {bad} not a multiple of "
            f"trainer.batching.logprob_chunk={tr.batching.logprob_chunk} (the log-prob "
            "computation's chunk)"
        )
    if r.max_total_tokens > cfg.sampler.max_seq_len:
        raise ConfigError(
            f"rollout.max_total_tokens={r.max_total_tokens} exceeds sampler.max_seq_len="
            f"{cfg.sampler.max_seq_len} (the engine's per-session context); raise "
            "sampler.max_seq_len or lower rollout.max_total_tokens"
        )
    check_judge(cfg)


def pretrained_warning(cfg: RunConfig) -> str | None:
    """One line when a pretrained checkpoint (``model.path``) meets settings made for a model
    trained from scratch: synthetic copy steps, or full fine-tuning at a learning rate >= 1e-3
    (SFT's or RL's), which wipe out what it knows within a few steps. Reads ``model``, ``trainer``
    and ``optimizer``: the whole config."""
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
    return (
        f"WARNING: model.path={cfg.model.path} is a pretrained checkpoint but "
        f"{' and '.join(bad)} are settings for a model trained from scratch; "
        "trainer=instruct or trainer=instruct_lora are made for it"
    )


def _mesh(cfg: RunConfig) -> Mesh:
    """The training mesh, checked against the batch sizes it must split (``mesh``, ``trainer``
    and ``rollout.group_size``: the whole config)."""
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


def effective_loss(loss: LossConfig, rollout: RolloutConfig) -> LossConfig:
    """``loss`` with ``max_len_norm: null`` resolved for ``seq-mean-token-sum-norm``: the
    episode's generation budget (``rollout.max_turns x rollout.max_new_tokens``), a constant, so
    the loss scale never follows the padded length bucket a batch happens to land in."""
    if loss.agg_mode == "seq-mean-token-sum-norm" and loss.max_len_norm is None:
        budget = rollout.max_turns * rollout.max_new_tokens
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
    limits = [
        ("sampler.max_seq_len", cfg.sampler.max_seq_len, "total_tokens", "tokens in all"),
        (
            "trainer.batching.seq_buckets (largest)",
            max(seq_buckets(cfg.trainer, cfg.rollout)) + 1,
            "total_tokens",
            "training positions",
        ),
    ]
    return await check_oracle_limits(
        system.chat,
        env,
        cfg.env.oracle,
        cfg.rollout,
        limits,
        n=n,
        env_key=f"env.name={cfg.env.name}",
    )


def build_train(cfg: RunConfig) -> TrainSystem:
    """Check ``cfg``, then build every component of the training job (nothing compiles here)."""
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
    judge = build_judge(cfg, chat)
    reward = build_reward(cfg.reward, {judge.spec.name: judge.judge} if judge else None)
    collector = build_collector(
        chat=chat,
        env_factory=env.factory,
        rollout=cfg.rollout,
        reward=reward,
        seq_buckets=tuple(seq_buckets(cfg.trainer, cfg.rollout)),
        sharding=D.batch_sharding(mesh),
    )
    return TrainSystem(
        cfg,
        mesh,
        D.local_mesh(mesh),
        tokenizer,
        chat,
        model,
        graphdef,
        rest,
        env,
        reward,
        collector,
        effective_loss(cfg.loss, cfg.rollout),
        judge,
    )
