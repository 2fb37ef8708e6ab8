"""The training job: SFT warm start, then multi-turn RL, with held-out checks, checkpoints,
resume, Hugging Face export and a run summary.

``train(cfg)`` runs (or resumes) the whole job for a typed :class:`RunConfig`; ``jaxrl-train`` only
composes that config. The RL loop reads like the algorithm::

    for step:
        COLLECT    this process's share of the step's tasks x group_size episodes (Collector)
        REWARD     compose each trajectory's reward (RewardComposer)
        UPDATE     advantages, then epochs x minibatches of PPO-style updates: one device program
                   (training.update)
        PUSH       the new weights to the sampler engine
        hooks      log, sample trajectories, held-out evaluation + keep-best, checkpoint

Randomness comes from named streams (``rng.Keys``) derived per step with ``fold_in``, so a
resumed run draws what an uninterrupted one would. Checkpoints carry the stage and step; rerunning
the same command continues from the last complete one (SFT or RL). The KL reference is the SFT
result, restored from ``checkpoints/sft/`` after a resume.

Multi-host (``jax.distributed``): every process runs this same program; the collector splits each
step's tasks over the processes and places each process's rows into the global batch
(``rollout.collector``), and episodes are all-gathered for logs and summaries, so every process
reports the same numbers. Only process 0 writes logs, records and the export.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_agents import distributed as D
from jaxrl_agents.evaluation.step_log import StepRecord, step_row
from jaxrl_agents.jobs import report
from jaxrl_agents.jobs.baselines import rft
from jaxrl_agents.jobs.config import JobAborted, RunConfig
from jaxrl_agents.jobs.export import export_policy
from jaxrl_agents.jobs.judge import frozen_copy, start_judge
from jaxrl_agents.jobs.records import every
from jaxrl_agents.jobs.restore import check_sft_source, sft_params_from
from jaxrl_agents.jobs.run import Run
from jaxrl_agents.jobs.sft import load_for_run, sft_stage
from jaxrl_agents.jobs.system import TrainSystem, build_train, check_oracle_fits
from jaxrl_agents.rollout import DeviceBatch
from jaxrl_agents.training.logprobs import SamplingTransform
from jaxrl_agents.training.step import TrainState
from jaxrl_agents.training.update import make_rl_update
from jaxrl_agents.training.wandb_sink import require_wandb
from jaxrl_agents.types import Trajectory


def train(cfg: RunConfig, system: TrainSystem | None = None) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the summary written to ``summary.json``.

    ``system``: the components to run with (default ``build_train(cfg)``): tests and tools pass
    one whose collector or sampler view they instrument."""
    require_wandb(
        cfg.trainer.log.wandb
    )  # trainer.log.wandb.project set without the package: stop now
    D.maybe_initialize(cfg.mesh)
    return asyncio.run(_train(cfg, system))


async def _train(cfg: RunConfig, system: TrainSystem | None) -> dict[str, Any]:
    t_start = time.time()
    system = system if system is not None else build_train(cfg)
    needs = await check_oracle_fits(system)  # before anything is written or compiled
    sft_file = load_for_run(
        cfg.trainer, cfg.rollout, system.chat
    )  # trainer.sft.data: every line checked, encoded
    run = Run(cfg, system)
    tr = run.tr
    run.record.set("oracle_needs", needs)
    state = run.fresh_state(system.initial_params, run.sft_tx)
    stage, step = "sft", 0
    if tr.checkpoint.resume and run.ckpt.latest_step() is not None:
        state, meta = run.ckpt.restore(report.abstract(state))
        stage, step = meta["stage"], int(meta["stage_step"])
        run.logger.truncate_after(stage, step)  # rows logged after that checkpoint come again
        print(f"resuming from checkpoint: stage={stage} step={step}", flush=True)
    if stage == "sft" and step == 0 and tr.sft.init_from is not None:
        src_step = check_sft_source(cfg)
        params = sft_params_from(tr.sft.init_from, state.params, mesh=system.mesh)
        state = run.fresh_state(params, run.sft_tx)
        run.record.set(
            "sft_from", {"run": str(Path(tr.sft.init_from).resolve()), "sft_step": src_step}
        )
        print(
            f"SFT: not trained here; the policy of {tr.sft.init_from}@sft (step {src_step})",
            flush=True,
        )

    async with system.engine(state.params) as engine, contextlib.AsyncExitStack() as judges:
        if stage == "sft":
            state = await sft_stage(run, state, step, sft_file)
        await _start_judge(run, judges, state, resumed_rl=stage == "rl" and step > 0)
        if stage == "sft":
            engine.update_weights(system.sampler_view(state.params))
            summary, trajs = await run.evaluate(engine, version=tr.sft.steps)
            val, _ = await run.evaluate(engine, version=tr.sft.steps, split="validation")
            run.record.set("sft_eval", summary)
            run.record.set("sft_validation", val)
            run.record.save()
            row = {"heldout_success": summary["success"], "validation_success": val["success"]}
            run.logger.log(0, row, stage="eval")
            run.logger.trajectories(0, trajs, name="heldout_sft")
            lo, hi = summary["success_ci95"]
            print(f"SFT held-out success: {summary['success']:.3f} (95% CI {lo:.3f}-{hi:.3f})")
            # RL starts from the SFT weights with a fresh optimizer.
            state, stage, step = run.fresh_state(state.params, run.rl_tx), "rl", 0
            run.checkpoint(tr.sft.steps, state, "rl", 0, force=True)
            run.ckpt.save_sft(tr.sft.steps, state, run.meta("rl", 0))
            run.offer_best(0, state, val["success"])
        if step == 0:  # RL starts here (after SFT, or resumed where it would): the gate
            _gate_rl(run, run.record.stages.get("sft_validation"))
        engine.update_weights(system.sampler_view(state.params))
        if tr.rl.stage == "rft":  # the non-RL baseline (jobs.baselines)
            state = await rft(run, engine, state) if step < tr.rl.steps else state
        else:
            state = await _rl(run, engine, state, step)
        run.ckpt.wait()
        final_model = system.sampler_view(state.params)  # also what process 0 exports
        engine.update_weights(final_model)
        final, trajs = await run.evaluate(engine, version=tr.sft.steps + tr.rl.steps)
        val, _ = await run.evaluate(engine, version=tr.sft.steps + tr.rl.steps, split="validation")
    run.offer_best(tr.rl.steps, state, val["success"])  # the last step competes too
    run.record.set("rl_validation", val)
    run.ckpt.wait()
    run.logger.trajectories(tr.rl.steps, trajs, name="heldout_rl_final")
    export_dir = None
    if (
        tr.checkpoint.export and jax.process_index() == 0
    ):  # the same faithful export as jaxrl-export's
        export_dir = export_policy(final_model, system.tokenizer, cfg, run.record.dir / "hf_export")
    run.record.set("rl_eval", final)
    run.record.save()
    summary = report.summary(run, export_dir, time.time() - t_start, state)
    run.logger.close(curve=run.record.curve)  # after summary.json: W&B logs both as artifacts
    run.ckpt.close()
    return summary


def _gate_rl(run: Run, val: dict[str, Any] | None) -> None:
    """``trainer.rl.start_min_success``: stop before RL (the SFT snapshot is saved) when the
    starting policy's validation success is below it; warn when it is 0 and the gate is off."""
    tr = run.tr
    if val is None or tr.rl.steps == 0:  # no recorded numbers (an older folder), or no RL
        return
    success, n = float(val["success"]), int(val.get("n", 0))
    passed = success >= tr.rl.start_min_success
    run.record.set(
        "rl_gate",
        {"min_success": tr.rl.start_min_success, "validation_success": success, "passed": passed},
    )
    run.record.save()
    where = (
        f"the policy RL would start from solves {round(success * n)} of the {n} validation "
        f"tasks ({success:.3f}, greedy)"
    )
    if not passed:
        run.ckpt.wait()
        raise JobAborted(
            f"{where}, below trainer.rl.start_min_success={tr.rl.start_min_success}: RL not run. "
            f"The SFT snapshot is saved in {run.record.dir}; rerun with a lower "
            "trainer.rl.start_min_success to start RL from it anyway"
        )
    if success == 0.0:
        print(
            f"WARNING: {where}: an outcome reward has little for RL to reinforce (set "
            "trainer.rl.start_min_success to stop here instead)",
            file=sys.stderr,
            flush=True,
        )


async def _start_judge(
    run: Run, stack: contextlib.AsyncExitStack, state: TrainState, *, resumed_rl: bool
) -> None:
    """The model judge's engine (``judge.enabled``), stopped with ``stack``. A ``reference``
    judge is the policy at RL start: ``state`` (after SFT), or after a resume into RL the SFT
    checkpoint (the current weights when there is none)."""
    system = run.sys

    def reference():
        params = state.params
        if resumed_rl and run.ckpt.all_steps("sft"):
            params = run.ckpt.restore(report.abstract(state), which="sft")[0].params
        return system.sampler_view(frozen_copy(params))

    await start_judge(system.judge, stack, reference, mesh=system.sampler_mesh)


def _reference(run: Run, state: TrainState, start: int) -> nnx.State | None:
    """The frozen KL reference: the SFT result (RL's starting point), also after a resume."""
    if run.cfg.loss.kl_coef <= 0:
        return None
    if start == 0 or not run.ckpt.all_steps("sft"):
        return jax.tree.map(jnp.copy, state.params)
    ref, _ = run.ckpt.restore(report.abstract(state), which="sft")
    return ref.params


def _rl_update(run: Run) -> Callable[..., tuple[TrainState, Any]]:
    """The RL update (advantages, then epochs x minibatches of policy-loss steps): one program."""
    cfg, tr, system = run.cfg, run.tr, run.sys
    return make_rl_update(
        system.graphdef,
        system.rest,
        run.rl_tx,
        loss_cfg=system.loss,
        adv_cfg=cfg.advantage,
        epochs=tr.rl.ppo_epochs,
        minibatches=tr.rl.minibatches,
        microbatches=tr.batching.microbatches,
        logprob_chunk=tr.batching.logprob_chunk,
        batch_sharding=system.collector.sharding,
        sampling=SamplingTransform.from_rollout(cfg.rollout),
    )


async def _update(
    run: Run,
    update: Callable[..., tuple[TrainState, Any]],
    state: TrainState,
    db: DeviceBatch,
    s: int,
    ref: nnx.State | None,
) -> tuple[TrainState, dict[str, Any]]:
    """UPDATE of RL step ``s`` (0-based) on ``db``; skipped when no process has a loss token."""
    if not db.sampled_tokens:  # a count over all processes: the optimizer does not step
        print(f"RL step {s + 1}: no episode has a loss token; the update is skipped", flush=True)
        return state, {"update_skipped": 1.0}
    state, metrics = await asyncio.to_thread(  # advantages + epochs x minibatches
        update, state, db.batch, db.episodes, run.keys.key("update", s), ref
    )
    return state, {**D.host_value(metrics.as_dict()), "update_skipped": 0.0}


async def _rl(run: Run, engine: Any, state: TrainState, start: int) -> TrainState:
    cfg, tr, system = run.cfg, run.tr, run.sys
    group, collector = cfg.rollout.group_size, system.collector
    rows = tr.rl.tasks_per_step // jax.process_count() * group  # this process's rows of each step
    update = _rl_update(run)
    ref = _reference(run, state, start)
    if ref is not None:
        run.record.set(
            "kl_reference",
            {"from": "sft" if start else "rl_start", "checksum": report.checksum(ref)},
        )
    source = run.step_source(dynamic=tr.rl.dynamic_sampling)
    pushed = {"updates": start}  # RL updates reflected in the sampler's weights

    def push(state: TrainState, updates: int) -> None:
        """PUSH: new weights go to the engine only while no collection is running, so every
        episode is sampled by one policy version (its ``policy_version``)."""
        if updates != pushed["updates"]:
            engine.update_weights(system.sampler_view(state.params))
            pushed["updates"] = updates

    def launch(s: int):
        version = tr.sft.steps + pushed["updates"]
        return asyncio.ensure_future(source.step(engine, s, version=version))

    pending = launch(start) if start < tr.rl.steps else None
    bar = run.bar(start, tr.rl.steps, "RL")
    for s in bar:
        roll, shaping = await pending  # COLLECT + REWARD (+ refills of zero-variance groups)
        pending = None
        push(state, s)  # no collection runs now: the engine catches up (overlap mode)
        if tr.rl.off_policy_overlap and s + 1 < tr.rl.steps:
            # Samples step s+1 while this step trains, with the weights before this update
            # (staleness 1; the importance ratio uses the rollout logprobs).
            pending = launch(s + 1)
        t_train = time.perf_counter()
        everyone = collector.everyone(roll, slim=True)  # all processes' episodes, for the record
        run.check_errors(everyone, f"RL step {s + 1}")
        db = collector.device_batch(
            roll,
            rows=rows,
            max_turns=cfg.rollout.max_turns,
            mask_overlong=tr.rl.mask_overlong,
            pack=tr.batching.pack_rows,
            row_multiple=tr.rl.minibatches * tr.batching.microbatches,
            no_loss=source.no_loss(shaping.get("dynamic/fallback", 0)),
        )
        state, metrics = await _update(run, update, state, db, s, ref)
        metrics = {**metrics, **shaping, "real_frac": db.real_frac}
        if pending is None:
            push(state, s + 1)
            if s + 1 < tr.rl.steps:
                pending = launch(s + 1)
        train_s = time.perf_counter() - t_train
        compiles = getattr(engine, "compile_count", 0)
        judge = system.judge.judge.stats.take() if system.judge is not None else {}
        row = step_row(
            StepRecord(
                everyone,
                roll.seconds,
                db,
                metrics,
                train_s,
                compiles,
                version=tr.sft.steps + s,
                judge=judge,
            )
        )
        if every(tr.eval.every, s + 1) and s + 1 < tr.rl.steps and pending is not None:
            done = await pending  # evaluate the newest weights: wait for the running collection
            pending = asyncio.ensure_future(_ready(done))
            push(state, s + 1)
        await _after_step(run, engine, state, s + 1, row, roll.trajectories, bar)
    return state


async def _ready(value: Any) -> Any:
    return value


async def _after_step(
    run: Run,
    engine: Any,
    state: TrainState,
    step: int,
    row: dict[str, Any],
    trajs: list[Trajectory],
    bar: Iterable[int],
) -> None:
    """Hooks after RL step ``step`` (1-based): log, trajectories, evaluation, checkpoint."""
    tr = run.tr
    run.logger.log(step, row, stage="rl")
    if hasattr(bar, "set_postfix"):
        bar.set_postfix(reward=f"{row['reward']:.2f}", success=f"{row['success']:.2f}")
    if every(tr.log.trajectories_every, step):
        run.logger.trajectories(step, trajs[: min(8, len(trajs))])  # the first rows
    point = {"step": step, "reward": row["reward"], "train_success": row["success"]}
    if every(tr.eval.every, step) and step < tr.rl.steps:
        summary, _ = await run.evaluate(engine, version=tr.sft.steps + step, split="validation")
        point["validation_success"] = summary["success"]
        run.logger.log(step, {"validation_success": summary["success"]}, stage="eval")
        run.offer_best(step, state, summary["success"])
    run.record.curve.append(point)
    if every(tr.checkpoint.every, step) or step == tr.rl.steps:
        run.checkpoint(tr.sft.steps + step, state, "rl", step)
        run.record.save()
