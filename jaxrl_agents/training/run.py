"""The training job: SFT warm start, then multi-turn RL, with held-out checks, checkpoints,
resume, Hugging Face export and a run summary.

``run(cfg)`` is the whole job as one plain function of a typed :class:`RunConfig` (the Hydra app in
``cli/train.py`` only builds the config). Stages::

    # SFT      golden trajectories from the env's oracle, rendered through the same rollout path
    #          (token in / token out), masked NLL on assistant tokens
    # EVAL     greedy held-out success of the SFT policy (kept in the run folder)
    # RL loop  COLLECT (orchestrator) -> REWARD (composer) -> ADVANTAGES (jnp estimator)
    #          -> UPDATE (K epochs x minibatches, jitted) -> PUSH weights to the engine
    # EVAL     greedy held-out success every ``eval_every`` steps; keep-best checkpoint
    # EXPORT   Hugging Face folder + summary.json + learning-curve plot

Resume: checkpoints carry the stage and step; rerunning the same command continues where the last
complete checkpoint left off (SFT or RL), with the optimizer state, PRNG key and task cursor.

Multi-host (``jax.distributed``, see ``training.distributed``): each process samples on its own
process-local engine and runs its share of every step's episodes: process ``p`` of ``P`` takes
tasks ``[p*k, (p+1)*k)`` of the step's ``k*P`` tasks, whole groups included, and packs them into its
rows of the global batch. Advantages are computed on the global batch (so estimators that whiten
over the batch see all of it); SFT rows and held-out tasks are split the same way; episodes and
small scalars are all-gathered so every process logs and reports the same numbers. With one
process this is exactly the single-host job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.rollout.orchestrator import Orchestrator
from jaxrl_agents.rollout.packing import bucket_for, pack, pack_sft
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.training import builders as B
from jaxrl_agents.training import distributed as D
from jaxrl_agents.training.checkpoint import Checkpointer
from jaxrl_agents.training.config import ConfigError, RunConfig
from jaxrl_agents.training.metrics import RunLogger
from jaxrl_agents.training.objectives import rl_loss, sft_loss
from jaxrl_agents.training.step import (
    OptimizerConfig,
    TrainState,
    init_train_state,
    make_train_step,
)

log = logging.getLogger("jaxrl_agents")


@dataclasses.dataclass
class Components:
    cfg: RunConfig
    mesh: Any
    tokenizer: Any
    chat: Any
    model: Any
    graphdef: Any
    rest: Any
    env_cls: type
    env_kwargs: dict
    task_kwargs: dict
    reward: Any
    adv_cfg: Any
    loss_cfg: Any
    run_dir: Path
    sampler_mesh: Any = None
    """Where the sampler engine runs: ``mesh`` itself with one process, else this process's
    block of it (``distributed.local_mesh``)."""
    _sampler_rest: Any = dataclasses.field(default=None, init=False, repr=False)

    def env_factory(self):
        return self.env_cls(**self.env_kwargs)

    def tasks(self, split: str, n: int, *, seed: int):
        return self.env_cls.make_tasks(split, n, seed=seed, **self.task_kwargs)

    def merged(self, params):
        return nnx.merge(self.graphdef, params, self.rest)

    def sampler_model(self, params):
        """The policy with ``params`` on the sampler's mesh (a collective with several processes:
        every process calls it at the same point)."""
        if self.sampler_mesh is None or self.sampler_mesh is self.mesh:
            return self.merged(params)
        if self._sampler_rest is None:
            self._sampler_rest = D.replicate_locally(self.rest, self.mesh, self.sampler_mesh)
        local = D.replicate_locally(params, self.mesh, self.sampler_mesh)
        return nnx.merge(self.graphdef, local, self._sampler_rest)


def build_components(cfg: RunConfig) -> Components:
    """Everything validated before any compilation, so bad configs fail fast."""
    from jaxrl_agents.algos import AdvantageConfig, LossConfig
    from jaxrl_agents.chat import ChatFormat
    from jaxrl_agents.rewards import RewardComposer, RewardConfig
    from jaxrl_agents.sharding import make_mesh
    from jaxrl_agents.training.config import build

    adv_cfg = build(AdvantageConfig, cfg.advantage, "advantage")
    loss_cfg = build(LossConfig, cfg.loss, "loss")
    reward_cfg = RewardConfig.from_dict(cfg.reward)
    adv_cfg.validate(group_size=cfg.rollout.group_size, has_turns=True)
    env_cls, env_kwargs, task_kwargs = B.resolve_env(cfg.env)
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        raise ConfigError(f"model.path={cfg.model.path!r} is not a folder (a local HF checkpoint)")
    mesh = make_mesh(tuple(cfg.mesh.shape))
    tr = cfg.trainer
    if jax.process_count() > 1:
        try:
            D.even_share(tr.tasks_per_step, "trainer.tasks_per_step")
            if tr.sft_steps > 0:
                D.even_share(tr.sft_batch_size, "trainer.sft_batch_size")
        except ValueError as e:
            raise ConfigError(str(e)) from e
    tokenizer = B.build_tokenizer(cfg.model)
    chat = ChatFormat(tokenizer)
    model = B.build_model(cfg.model, vocab_size=len(tokenizer), mesh=mesh, seed=cfg.seed)
    graphdef, _, rest = B.split_params(model)
    run_dir = Path(cfg.run_dir)
    return Components(
        cfg,
        mesh,
        tokenizer,
        chat,
        model,
        graphdef,
        rest,
        env_cls,
        env_kwargs,
        task_kwargs,
        RewardComposer(reward_cfg),
        adv_cfg,
        loss_cfg,
        run_dir,
        sampler_mesh=D.local_mesh(mesh),
    )


# -- helpers -----------------------------------------------------------------------------------


def _orchestrator(c: Components, engine, *, greedy: bool, reward: bool = True, version: int = 0):
    r = c.cfg.rollout
    return Orchestrator(
        engine=engine,
        chat=c.chat,
        env_factory=c.env_factory,
        cfg=r,
        sampling_params=B.sampling_factory(
            temperature=0.0 if greedy else r.temperature,
            top_p=1.0 if greedy else r.top_p,
            top_k=0 if greedy else r.top_k,
            stop_ids=c.chat.stop_token_ids,
        ),
        reward_fn=c.reward.acompute if reward else None,
        policy_version=version,
    )


async def evaluate_heldout(c: Components, engine, tasks, *, version: int = 0):
    """Greedy, one episode per held-out task; returns (summary, trajectories).

    With several processes each runs a contiguous block of the tasks; the episodes are
    all-gathered, so every process returns the same summary and the same trajectory list."""
    share = D.uneven_share(len(tasks))
    orch = _orchestrator(c, engine, greedy=True, version=version)
    trajs = await orch.run(tasks[share], group_size=1, seed=c.cfg.seed)
    trajs = _all_episodes(trajs, group_offset=share.start)
    return summarize(trajs), trajs


def _all_episodes(trajs: list, *, group_offset: int, slim: bool = False) -> list:
    """Every process's episodes in process order (with one process: ``trajs`` itself).

    ``group_offset`` turns group ids local to this process's share into global ones; ``slim``
    drops the token-level lists (the trainer holds them as packed rows already), which are most of
    the bytes of the all-gather."""
    if jax.process_count() == 1:
        return trajs
    drop = {"token_ids": [], "loss_mask": [], "logprobs": []} if slim else {}
    mine = [dataclasses.replace(t, group_id=t.group_id + group_offset, **drop) for t in trajs]
    return [t for part in D.gather_objects(mine) for t in part]


def _bucket(longest: int, buckets) -> list[int]:
    """The one sequence bucket every process packs to (shapes of a global batch must agree)."""
    return [bucket_for(max(longest, 1), buckets)]


async def golden_data(c: Components, n: int) -> list[tuple[list[int], list[int]]]:
    """SFT data: the env's oracle driven through the real rollout path (scripted engine)."""
    tr = c.cfg.trainer
    oracle = B.oracle_for(c.env_cls)
    rng = np.random.default_rng(c.cfg.seed)
    kw = dict(tr.oracle)
    for name in kw:
        if not B.accepts(oracle, name):
            raise ConfigError(
                f"trainer.oracle.{name}: {c.env_cls.__name__}'s oracle_policy has no such argument"
            )
    if B.accepts(oracle, "rng"):
        kw["rng"] = rng

    engine = ScriptedEngine(c.chat, policy_factory=lambda task: oracle(task, **kw))
    tasks = c.tasks("train", n, seed=c.cfg.seed + 7919)
    orch = _orchestrator(c, engine, greedy=True, reward=False)
    trajs = await orch.run(tasks, group_size=1, seed=c.cfg.seed)
    return [(t.token_ids, t.loss_mask) for t in trajs]


def _on_mesh(state: TrainState, mesh) -> TrainState:
    """Fresh scalars (step counters, PRNG key data) replicated on the mesh, like the parameters:
    every leaf is then a global array (orbax and multi-process jit need that) with the sharding
    the train step returns, so its second call does not compile again."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(x):
        if isinstance(x, jax.Array) and getattr(x.sharding, "mesh", None) == mesh:
            return x
        # From host values: device_put of a device array onto a mesh spanning processes can
        # yield arrays whose shards cannot be read back (jax 0.10).
        return jax.device_put(np.asarray(x), replicated)

    return jax.tree.map(put, state)


def _abstract(tree):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )


def _sft_optimizer(cfg: RunConfig) -> OptimizerConfig:
    return dataclasses.replace(
        cfg.optimizer, lr=cfg.trainer.sft_lr, decay_steps=cfg.trainer.sft_steps
    )


# -- the job -----------------------------------------------------------------------------------


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the summary written to ``summary.json``."""
    from jaxrl_agents.training.distributed import maybe_initialize

    maybe_initialize(cfg.mesh)
    return asyncio.run(_run(cfg))


async def _run(cfg: RunConfig) -> dict[str, Any]:
    t_start = time.time()
    c = build_components(cfg)
    tr = cfg.trainer
    c.run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (c.run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    logger = RunLogger(c.run_dir)
    ckpt = Checkpointer(
        c.run_dir / "checkpoints",
        keep=tr.keep_checkpoints,
        async_save=tr.async_checkpoints,
        best_metric="heldout_success",
    )
    heldout = c.tasks("heldout", tr.heldout_tasks, seed=cfg.seed)
    train_tasks = c.tasks("train", max(tr.rl_steps * tr.tasks_per_step, 1), seed=cfg.seed)

    _, params, _ = B.split_params(c.model)
    sft_tx, rl_tx = _sft_optimizer(cfg).build(), cfg.optimizer.build()
    state = _on_mesh(init_train_state(params, sft_tx, seed=cfg.seed), c.mesh)
    stage, step = "sft", 0
    latest = ckpt.latest_step() if tr.resume else None
    if latest is not None:
        state, meta = ckpt.restore(_abstract(state))
        stage, step = meta["stage"], int(meta["stage_step"])
        log.warning("resuming from %s step %d (%s)", stage, step, ckpt.dir)
        print(f"resuming from checkpoint: stage={stage} step={step}", flush=True)
    state_files = c.run_dir / "stages.json"
    stages = json.loads(state_files.read_text()) if state_files.exists() else {}

    sampler = B.build_engine(c.sampler_model(params), cfg.sampler, mesh=c.sampler_mesh)
    async with sampler as engine:
        # SFT ---------------------------------------------------------------------------------
        if stage == "sft":
            state = await _sft(c, state, step, sft_tx, ckpt, logger)
            engine.update_weights(c.sampler_model(state.params))
            summary, trajs = await evaluate_heldout(c, engine, heldout)
            stages["sft_eval"] = summary
            logger.log(0, {"heldout_success": summary["success"]}, stage="eval")
            logger.trajectories(0, trajs, name="heldout_sft")
            if jax.process_index() == 0:
                state_files.write_text(json.dumps(stages, indent=2))
            print(
                f"SFT held-out success: {summary['success']:.3f} "
                f"(95% CI {summary['success_ci95'][0]:.3f}-{summary['success_ci95'][1]:.3f})",
                flush=True,
            )
            # RL starts from the SFT weights with a fresh optimizer.
            state = _on_mesh(init_train_state(state.params, rl_tx, seed=cfg.seed + 1), c.mesh)
            stage, step = "rl", 0
            ckpt.save(tr.sft_steps, state, {"stage": "rl", "stage_step": 0}, force=True)
            ckpt.save_sft(tr.sft_steps, state, {"stage": "rl", "stage_step": 0})
            ckpt.save_best(
                tr.sft_steps,
                state,
                {"stage": "rl", "stage_step": 0},
                {"heldout_success": summary["success"]},
            )
        engine.update_weights(c.sampler_model(state.params))
        # RL ----------------------------------------------------------------------------------
        state, curve = await _rl(
            c, engine, state, step, rl_tx, ckpt, logger, heldout, train_tasks, stages
        )
        ckpt.wait()
        # FINAL EVAL + EXPORT -----------------------------------------------------------------
        final_model = c.sampler_model(state.params)  # also what process 0 exports
        engine.update_weights(final_model)
        final, trajs = await evaluate_heldout(
            c, engine, heldout, version=tr.sft_steps + tr.rl_steps
        )
    logger.trajectories(tr.rl_steps, trajs, name="heldout_rl_final")
    export_dir = None
    if tr.export and jax.process_index() == 0:
        from jaxrl_agents.models import export_pretrained

        export_dir = c.run_dir / "hf_export"
        export_pretrained(final_model, export_dir, tokenizer=c.tokenizer)
    stages["rl_eval"] = final
    summary = _write_summary(c, stages, curve, export_dir, time.time() - t_start, state)
    logger.close()
    ckpt.close()
    return summary


async def _sft(c: Components, state: TrainState, start: int, tx, ckpt, logger) -> TrainState:
    tr = c.cfg.trainer
    if start >= tr.sft_steps:
        return state
    data = await golden_data(c, tr.sft_examples)
    step_fn = make_train_step(
        c.graphdef, tx, sft_loss(chunk=tr.logprob_chunk), microbatches=tr.microbatches, rest=c.rest
    )
    order = np.random.default_rng(c.cfg.seed).permutation(len(data))
    sharding = B.global_batch_sharding(c.mesh)
    # Every process holds all golden data (scripted, cheap) and packs its share of each batch.
    share = D.even_share(tr.sft_batch_size, "trainer.sft_batch_size")
    bar = _bar(range(start, tr.sft_steps), "SFT", tr.progress, initial=start, total=tr.sft_steps)
    for s in bar:
        idx = [order[(s * tr.sft_batch_size + j) % len(data)] for j in range(tr.sft_batch_size)]
        rows = [data[i] for i in idx]
        buckets = _bucket(max(len(ids) for ids, _ in rows) - 1, tr.seq_buckets)
        batch, _ = pack_sft(rows[share], buckets=buckets, pad_id=c.chat.pad_id)
        batch = B.place(batch, sharding)
        extra = {"denom": jnp.sum(batch.loss_mask)}
        state, m = step_fn(state, batch, extra)
        if (s + 1) % 10 == 0 or s + 1 == tr.sft_steps:
            m = D.host_value(m)
            logger.log(s + 1, m, stage="sft")
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(nll=f"{float(m['nll']):.3f}")
        if (s + 1) % max(tr.checkpoint_every * 5, 1) == 0 and s + 1 < tr.sft_steps:
            ckpt.save(s + 1, state, {"stage": "sft", "stage_step": s + 1})
    return state


async def _rl(c, engine, state, start, tx, ckpt, logger, heldout, train_tasks, stages):
    from jaxrl_agents.algos import (
        AdvantageInputs,
        aggregation_denominator,
        compute_advantages,
        kl_reward,
    )

    cfg, tr, r = c.cfg, c.cfg.trainer, c.cfg.rollout
    curve: list[dict[str, float]] = stages.get("curve", [])
    step_fn = make_train_step(
        c.graphdef,
        tx,
        rl_loss(c.loss_cfg, chunk=tr.logprob_chunk),
        microbatches=tr.microbatches,
        rest=c.rest,
    )

    @jax.jit
    def adv_fn(inputs: AdvantageInputs):
        out = compute_advantages(c.adv_cfg.name, inputs, c.adv_cfg)
        m = inputs.loss_mask
        n = jnp.maximum(jnp.sum(m), 1.0)
        stats = {
            "adv_mean": jnp.sum(out.advantages * m) / n,
            "adv_abs": jnp.sum(jnp.abs(out.advantages) * m) / n,
        }
        return out, stats

    ref_params = None
    if getattr(c.loss_cfg, "kl_coef", 0.0) > 0:
        ref_params = jax.tree.map(jnp.copy, state.params)  # frozen copy of the RL starting point
        ref_fn = jax.jit(lambda p, b: _ref_logprobs(c, p, b))
    sharding = B.global_batch_sharding(c.mesh)
    group = r.group_size
    # This process's share of every step: whole groups, so ``rows`` rows of the global batch.
    share = D.even_share(tr.tasks_per_step, "trainer.tasks_per_step")
    rows = (share.stop - share.start) * group
    first_row = jax.process_index() * rows

    async def collect(s: int, updates_done: int):
        """This process's rollouts for step ``s`` with the weights after ``updates_done`` RL
        updates."""
        k = (s * tr.tasks_per_step) % len(train_tasks)
        tasks = [train_tasks[(k + j) % len(train_tasks)] for j in range(tr.tasks_per_step)][share]
        orch = _orchestrator(c, engine, greedy=False, version=tr.sft_steps + updates_done)
        t = time.perf_counter()
        trajs = await orch.run(tasks, group_size=group, seed=cfg.seed * 100003 + s)
        return trajs, time.perf_counter() - t

    bar = _bar(range(start, tr.rl_steps), "RL", tr.progress, initial=start, total=tr.rl_steps)
    pending = asyncio.ensure_future(collect(start, start)) if start < tr.rl_steps else None
    for s in bar:
        # COLLECT
        trajs, rollout_s = await pending
        if tr.off_policy_overlap and s + 1 < tr.rl_steps:
            # Runs while this step trains: sampled with the weights before this step's update
            # (staleness 1; the importance ratio uses the rollout logprobs).
            pending = asyncio.ensure_future(collect(s + 1, s))
        t_train = time.perf_counter()
        # ADVANTAGES on the global batch; this process packs its episodes into its rows, with
        # group and anchor ids made global (disjoint across processes).
        longest = max(len(t.token_ids) for t in trajs) - 1
        packed = pack(
            trajs,
            buckets=_bucket(int(D.gather_rows(longest).max()), tr.seq_buckets),
            batch_size=rows,
            max_turns=r.max_turns,
            pad_id=c.chat.pad_id,
        )
        b, ep = packed.batch, packed.episodes
        n_turns = ep.anchor_ids.shape[1]
        ep = ep._replace(
            group_ids=ep.group_ids + first_row,
            anchor_ids=np.where(ep.anchor_ids >= 0, ep.anchor_ids + first_row * n_turns, -1),
        )
        gb, gep = B.place(b, sharding), B.place(ep, sharding)
        rewards = gep.rewards
        kl_metrics = {}
        if ref_params is not None and c.loss_cfg.kl_as_reward:
            # KL to the reference as a reward penalty (rather than a loss term).
            ref_lp = ref_fn(ref_params, gb)
            rewards, kl_traj = kl_reward(
                rewards,
                logprobs=gb.old_logprobs,
                ref_logprobs=ref_lp,
                loss_mask=gb.loss_mask,
                kind=c.loss_cfg.kl_estimator,
                coef=c.loss_cfg.kl_coef,
            )
            kl_metrics = {"kl_reward": float(D.host_value(jnp.mean(kl_traj)))}
        inputs = AdvantageInputs(
            rewards=rewards,
            group_ids=gep.group_ids,
            loss_mask=gb.loss_mask,
            turn_ids=gb.turn_ids,
            turn_rewards=gep.turn_rewards,
            turn_mask=gep.turn_mask,
            anchor_ids=gep.anchor_ids,
        )
        adv, adv_stats = adv_fn(inputs)
        b = b._replace(
            advantages=D.local_rows(adv.advantages, sharding),
            returns=D.local_rows(adv.returns, sharding) if adv.returns is not None else b.returns,
        )
        # UPDATE: each process draws its minibatch rows from its own rows.
        metrics: dict[str, Any] = {}
        mb_rows = rows // tr.minibatches
        perm = np.random.default_rng(cfg.seed + s).permutation(rows)
        for _epoch in range(tr.ppo_epochs):
            for m in range(tr.minibatches):
                pick = perm[m * mb_rows : (m + 1) * mb_rows]
                mb = B.place(jax.tree.map(lambda x, pick=pick: x[pick], b), sharding)
                extra = {
                    "denom": aggregation_denominator(
                        mb.loss_mask, c.loss_cfg.agg_mode, max_len=c.loss_cfg.max_len_norm
                    )
                }
                if ref_params is not None and not c.loss_cfg.kl_as_reward:
                    extra["ref_logprobs"] = ref_fn(ref_params, mb)
                state, metrics = await asyncio.to_thread(step_fn, state, mb, extra)
        metrics = D.host_value(metrics)
        # PUSH
        engine.update_weights(c.sampler_model(state.params))
        if not tr.off_policy_overlap and s + 1 < tr.rl_steps:
            pending = asyncio.ensure_future(collect(s + 1, s + 1))
        train_s = time.perf_counter() - t_train
        # LOG / EVAL / CHECKPOINT: over the global batch (episodes all-gathered without their
        # token lists; rollout time is the slowest process's). ``compiles`` is process 0's engine.
        everyone = _all_episodes(trajs, group_offset=share.start, slim=True)
        roll = summarize(everyone)
        per_proc = D.gather_rows(
            np.array([rollout_s, float(b.loss_mask.sum()), packed.truncated], np.float64)
        )
        rollout_s = float(per_proc[:, 0].max())
        row = {
            "reward": float(np.mean([t.reward for t in everyone])),
            "success": roll["success"],
            "mean_turns": roll["mean_turns"],
            "mean_tool_calls": roll["mean_tool_calls"],
            **{f"reward/{k}": v for k, v in roll["reward_terms"].items()},
            **{f"failure/{k}": v for k, v in roll["failure_modes"].items()},
            **{k: float(v) for k, v in D.host_value(adv_stats).items()},
            "rollout_s": rollout_s,
            "train_s": train_s,
            "gen_tok_s": float(per_proc[:, 1].sum()) / max(rollout_s, 1e-9),
            "truncated": int(per_proc[:, 2].sum()),
            "staleness": float(np.mean([tr.sft_steps + s - t.policy_version for t in everyone])),
            "compiles": getattr(engine, "compile_count", 0),
            **{k: float(np.asarray(v)) for k, v in metrics.items()},
            **kl_metrics,
        }
        logger.log(s + 1, row, stage="rl")
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(reward=f"{row['reward']:.2f}", success=f"{row['success']:.2f}")
        if (s + 1) % tr.log_trajectories_every == 0:
            # Process 0's first episodes, i.e. the first rows of the global batch.
            logger.trajectories(s + 1, trajs[: min(8, len(trajs))])
        point = {"step": s + 1, "reward": row["reward"], "train_success": row["success"]}
        meta = {"stage": "rl", "stage_step": s + 1}
        if tr.eval_every and (s + 1) % tr.eval_every == 0 and s + 1 < tr.rl_steps:
            summary, _ = await evaluate_heldout(c, engine, heldout, version=tr.sft_steps + s + 1)
            point["heldout_success"] = summary["success"]
            logger.log(s + 1, {"heldout_success": summary["success"]}, stage="eval")
            ckpt.save_best(
                tr.sft_steps + s + 1, state, meta, {"heldout_success": summary["success"]}
            )
        curve.append(point)
        if (s + 1) % tr.checkpoint_every == 0 or s + 1 == tr.rl_steps:
            ckpt.save(tr.sft_steps + s + 1, state, meta)
            stages["curve"] = curve
            if jax.process_index() == 0:
                (c.run_dir / "stages.json").write_text(json.dumps(stages, indent=2))
    return state, curve


def _ref_logprobs(c: Components, params, batch):
    from jaxrl_agents.training.logprobs import token_stats

    model = c.merged(params)
    return token_stats(
        model,
        batch.input_ids,
        batch.positions,
        batch.segment_ids,
        batch.target_ids,
        chunk=c.cfg.trainer.logprob_chunk,
        with_entropy=False,
    ).logprobs


def _bar(it, desc: str, enabled: bool, **kw):
    if not enabled or jax.process_index() != 0:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, dynamic_ncols=True, **kw)


def _write_summary(c, stages, curve, export_dir, wall_s, state) -> dict[str, Any]:
    sft, rl = stages.get("sft_eval", {}), stages.get("rl_eval", {})
    summary = {
        "seed": c.cfg.seed,
        "env": c.env_cls.__name__,
        "heldout_tasks": rl.get("n", 0),
        "sft_heldout_success": sft.get("success"),
        "sft_heldout_ci95": sft.get("success_ci95"),
        "rl_heldout_success": rl.get("success"),
        "rl_heldout_ci95": rl.get("success_ci95"),
        "sft": sft,
        "rl": rl,
        "skipped_updates": int(D.host_value(state.skipped)),
        "export_dir": str(export_dir) if export_dir else None,
        "wall_s": wall_s,
    }
    if jax.process_index() == 0:
        from jaxrl_agents.evaluation.plots import learning_curve

        plot = c.run_dir / "learning_curve.png"
        learning_curve(curve, plot, sft_success=sft.get("success"), rl_success=rl.get("success"))
        summary["learning_curve"] = str(plot)
        (c.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
