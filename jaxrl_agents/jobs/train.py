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

Randomness comes from named streams (``records.Keys``) derived per step with ``fold_in``, so a
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
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.jobs import report
from jaxrl_agents.jobs.baselines import rft
from jaxrl_agents.jobs.build import (
    TrainSystem,
    build_train,
    check_oracle_fits,
)
from jaxrl_agents.jobs.config import JobAborted, RunConfig
from jaxrl_agents.jobs.copy_rows import copy_rows, ordinary_ids
from jaxrl_agents.jobs.records import Keys, RunRecord, environment, every
from jaxrl_agents.jobs.sft_data import SftFile, load_for_run
from jaxrl_agents.jobs.steps import StepSource
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.training.checkpoint import Checkpointer
from jaxrl_agents.training.logprobs import SamplingTransform
from jaxrl_agents.training.metrics import RunLogger
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import LossInputs, TrainState, init_train_state, make_train_step
from jaxrl_agents.training.update import make_rl_update
from jaxrl_agents.training.wandb_sink import require_wandb
from jaxrl_agents.types import EndReason

log = logging.getLogger("jaxrl_agents")
_ERRORS = (EndReason.ENV_ERROR, EndReason.REWARD_ERROR)


def train(cfg: RunConfig, system: TrainSystem | None = None) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the summary written to ``summary.json``.

    ``system``: the components to run with (default ``build_train(cfg)``): tests and tools pass
    one whose collector or sampler view they instrument."""
    # trainer.log.wandb.project set without the package: stop now
    require_wandb(cfg.trainer.log.wandb)
    D.maybe_initialize(cfg.mesh)
    return asyncio.run(_train(cfg, system))


class _Run:
    """The run's long-lived pieces: system, keys, records, logger, checkpoints, held-out tasks."""

    def __init__(self, cfg: RunConfig, system: TrainSystem):
        self.cfg, self.tr = cfg, cfg.trainer
        self.sys = system
        self.keys = Keys(cfg.seed, rl_seed=cfg.trainer.rl.seed)
        self.record = RunRecord(cfg.run_dir)
        ckpt_dir = self.record.dir / "checkpoints"
        # before anything is written:
        has_checkpoints = report.has_steps(ckpt_dir)
        self.record.check_config(cfg, has_checkpoints=has_checkpoints)
        self.base = report.lora_base(cfg, system.model, self.record, has_checkpoints)
        self.record.write_config(cfg)
        self.record.note_environment(environment())
        self.logger = RunLogger(
            cfg.run_dir, wandb=self.tr.log.wandb, config=dataclasses.asdict(cfg)
        )
        self.ckpt = Checkpointer(
            ckpt_dir,
            keep=self.tr.checkpoint.keep,
            async_save=self.tr.checkpoint.async_save,
            best_metric="validation_success",
        )
        env = self.sys.env
        self.heldout = env.tasks("heldout", self.tr.eval.heldout_tasks, seed=cfg.seed)
        n_val = self.tr.eval.validation_tasks or self.tr.eval.heldout_tasks
        self.validation = env.tasks("validation", n_val, seed=cfg.seed)
        n_train = max(self.tr.rl.steps * self.tr.rl.tasks_per_step, 1)
        self.train_tasks = env.tasks("train", n_train, seed=self.keys.seed("rl_tasks"))
        opt = cfg.optimizer
        # SFT's copy steps (trainer.sft.copy_steps) hold the peak lr; the golden steps decay.
        copies = self.tr.sft.copy_steps
        sft_opt = dataclasses.replace(
            opt, lr=self.tr.sft.lr, hold_steps=copies, decay_steps=self.tr.sft.steps - copies
        )
        self.sft_tx, self.rl_tx = sft_opt.build(), opt.build()

    def fresh_state(self, params: Any, tx: Any) -> TrainState:
        return D.replicated_on(init_train_state(params, tx), self.sys.mesh)

    def bar(self, start: int, total: int, desc: str):
        it = range(start, total)
        if not self.tr.log.progress or jax.process_index() != 0:
            return it
        from tqdm.auto import tqdm

        return tqdm(it, desc=desc, dynamic_ncols=True, initial=start, total=total)

    async def evaluate(
        self, engine: Any, *, version: int, split: str = "heldout"
    ) -> tuple[dict[str, Any], list]:
        """Greedy success on the held-out (test) or the validation tasks."""
        tasks = self.heldout if split == "heldout" else self.validation
        trajs = await self.sys.collector.evaluate(
            engine, tasks, seed=self.cfg.seed, version=version
        )
        self.check_errors(trajs, f"{split} evaluation (policy version {version})")
        return summarize(trajs), trajs

    def check_errors(self, trajs: list, where: str) -> None:
        """Loud on the console past ``trainer.log.error_warn_frac``, abort past
        ``error_abort_frac``."""
        bad = [t for t in trajs if t.end_reason in _ERRORS]
        frac = len(bad) / max(len(trajs), 1)
        if not bad or frac <= self.tr.log.error_warn_frac:
            return
        kinds = {e.value: sum(t.end_reason == e for t in bad) for e in _ERRORS}
        lines = (bad[0].error or "").strip().splitlines()
        first = lines[0][:300] if lines else "?"
        line = f"{where}: {len(bad)}/{len(trajs)} episodes ended in errors {kinds}; first: {first}"
        # the summary lists every such step, not only the console (see report.summary)
        entry = {"where": where, "episodes": len(trajs), **kinds, "first": first}
        self.record.set("episode_errors", [*self.record.stages.get("episode_errors", []), entry])
        if frac > self.tr.log.error_abort_frac:
            raise JobAborted(f"{line} (more than trainer.log.error_abort_frac="
                             f"{self.tr.log.error_abort_frac})")  # fmt: skip
        print(f"WARNING: {line}", file=sys.stderr, flush=True)

    def meta(self, stage: str, stage_step: int) -> dict[str, Any]:
        """A checkpoint's metadata: stage, step and (LoRA) the base the adapters belong to."""
        base = {} if self.base is None else {"lora_base": self.base}
        return {"stage": stage, "stage_step": stage_step, **base}

    def checkpoint(self, step: int, state: TrainState, stage: str, stage_step: int, **kw) -> None:
        self.ckpt.save(step, state, self.meta(stage, stage_step), **kw)

    def offer_best(self, rl_step: int, state: TrainState, val_success: float) -> None:
        """Offer the state after RL step ``rl_step`` to keep-best, by *validation* success (the
        test split's numbers stay unbiased by the selection)."""
        meta = self.meta("rl", rl_step)
        metrics = {"validation_success": val_success}
        self.ckpt.save_best(self.tr.sft.steps + rl_step, state, meta, metrics)


async def _train(cfg: RunConfig, system: TrainSystem | None) -> dict[str, Any]:
    t_start = time.time()
    system = system if system is not None else build_train(cfg)
    needs = await check_oracle_fits(system)  # before anything is written or compiled
    sft_file = load_for_run(cfg, system.chat)  # trainer.sft.data: every line checked, encoded
    run = _Run(cfg, system)
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
        from jaxrl_agents.jobs.restore import check_sft_source, sft_params_from

        src_step = check_sft_source(cfg)
        params = sft_params_from(tr.sft.init_from, state.params, mesh=system.mesh)
        state = run.fresh_state(params, run.sft_tx)
        run.record.set("sft_from", {"run": str(Path(tr.sft.init_from).resolve()),
                                    "sft_step": src_step})  # fmt: skip
        print(f"SFT: not trained here; the policy of {tr.sft.init_from}@sft "
              f"(step {src_step})", flush=True)  # fmt: skip

    async with system.engine(state.params) as engine:
        if stage == "sft":
            state = await _sft(run, state, step, sft_file)
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
    # the same faithful export as jaxrl-export's
    if tr.checkpoint.export and jax.process_index() == 0:
        from jaxrl_agents.jobs.export import export_policy

        export_dir = export_policy(final_model, system.tokenizer, cfg, run.record.dir / "hf_export")
    run.record.set("rl_eval", final)
    run.record.save()
    summary = report.summary(run, export_dir, time.time() - t_start, state)
    run.logger.close(curve=run.record.curve)  # after summary.json: W&B logs both as artifacts
    run.ckpt.close()
    return summary


def _gate_rl(run: _Run, val: dict[str, Any] | None) -> None:
    """``trainer.rl.start_min_success``: stop before RL (the SFT snapshot is saved) when the
    starting policy's validation success is below it; warn when it is 0 and the gate is off."""
    tr = run.tr
    if val is None or tr.rl.steps == 0:  # no recorded numbers (an older folder), or no RL
        return
    success, n = float(val["success"]), int(val.get("n", 0))
    passed = success >= tr.rl.start_min_success
    run.record.set("rl_gate", {"min_success": tr.rl.start_min_success,
                               "validation_success": success, "passed": passed})  # fmt: skip
    run.record.save()
    where = (f"the policy RL would start from solves {round(success * n)} of the {n} validation "
             f"tasks ({success:.3f}, greedy)")  # fmt: skip
    if not passed:
        run.ckpt.wait()
        raise JobAborted(
            f"{where}, below trainer.rl.start_min_success={tr.rl.start_min_success}: RL not run. "
            f"The SFT snapshot is saved in {run.record.dir}; rerun with a lower "
            "trainer.rl.start_min_success to start RL from it anyway"
        )
    if success == 0.0:
        print(f"WARNING: {where}: an outcome reward has little for RL to reinforce (set "
              "trainer.rl.start_min_success to stop here instead)",
              file=sys.stderr, flush=True)  # fmt: skip


async def _sft(
    run: _Run, state: TrainState, start: int, sft_file: SftFile | None = None
) -> TrainState:
    tr, system = run.tr, run.sys
    if start >= tr.sft.steps or tr.sft.init_from is not None:
        return state
    # The pool: the oracle's golden episodes (trainer.sft.oracle), then the user's file
    # (trainer.sft.data, checked and encoded at start-up), both through the same chat path.
    oracle = await _oracle_rows(run) if tr.sft.oracle else []
    file_rows = sft_file.rows if sft_file is not None else []
    data = oracle + file_rows
    _note_sft_data(run, len(oracle), sft_file)
    if not data:
        raise JobAborted("SFT golden data: no oracle episode ended with an answer")
    step_fn = make_train_step(
        system.graphdef, run.sft_tx, sft_loss(chunk=tr.batching.logprob_chunk),
        microbatches=tr.batching.microbatches, rest=system.rest,
    )  # fmt: skip
    order = np.random.default_rng(run.keys.seed("sft_order")).permutation(len(data))
    copies = tr.sft.copy_steps
    vocab = None
    if start < copies:
        vocab = ordinary_ids(system.chat.tokenizer)
        print(f"SFT: steps {start + 1}-{copies} on synthetic copy rows (trainer.sft.copy_steps), "
              f"then {tr.sft.steps - copies} on the golden data", flush=True)  # fmt: skip
    # Every process holds all golden data (scripted, or read from the file) and packs its share
    # of each batch.
    share = D.even_share(tr.sft.batch_size, "trainer.sft.batch_size")
    copy_share = D.even_share(tr.sft.copy_batch, "trainer.sft.copy_batch") if copies else share
    bar = run.bar(start, tr.sft.steps, "SFT")
    for s in bar:
        if s < copies:  # drawn from the step's own stream: a resumed run draws the same rows
            rng = np.random.default_rng(run.keys.seed("sft_copy", s))
            rows = copy_rows(rng, vocab, tr.sft.copy_batch)
        else:
            g = (s - copies) * tr.sft.batch_size
            rows = [data[order[(g + j) % len(data)]] for j in range(tr.sft.batch_size)]
        batch = system.collector.sft_batch(
            rows,
            copy_share if s < copies else share,
            pack=tr.batching.pack_rows,
            row_multiple=tr.batching.microbatches,
        )
        state, m = step_fn(state, batch, LossInputs(denom=jnp.sum(batch.loss_mask)))
        if every(10, s + 1) or s + 1 == tr.sft.steps:
            m = D.host_value(m)
            key = "copy_nll" if s < copies else "nll"  # the copy rows' loss is its own curve
            if s < copies:
                m = {f"copy_{k}": v for k, v in m.items()}
            run.logger.log(s + 1, m, stage="sft")
            if hasattr(bar, "set_postfix"):
                bar.set_postfix({key: f"{float(m[key]):.3f}"})
        if every(tr.checkpoint.every * 5, s + 1) and s + 1 < tr.sft.steps:
            run.checkpoint(s + 1, state, "sft", s + 1)
    return state


async def _oracle_rows(run: _Run) -> list[tuple[list[int], list[int]]]:
    """Golden data: the env's oracle driven through the real rollout path (scripted engine);
    the episodes that ended with an answer, as ``(ids, loss_mask)`` rows."""
    tr, system = run.tr, run.sys
    rng = np.random.default_rng(run.keys.seed("sft_oracle"))
    oracle = system.env.oracle(run.cfg.env.oracle, rng=rng)
    engine = ScriptedEngine(system.chat, policy_factory=oracle)
    tasks = system.env.golden_tasks("train", tr.sft.examples, seed=run.keys.seed("sft_tasks"))
    golden = system.golden_collector().orchestrator(engine, greedy=True, group_size=1)
    trajs = await golden.run(tasks, group_size=1, seed=0)
    run.check_errors(trajs, "SFT golden data")
    answered = [t for t in trajs if t.end_reason == EndReason.ANSWERED]
    if len(answered) < len(trajs):
        ends = sorted({t.end_reason.value for t in trajs if t.end_reason != EndReason.ANSWERED})
        print(
            f"WARNING: SFT golden data: {len(trajs) - len(answered)}/{len(trajs)} oracle episodes "
            f"ended without an answer ({', '.join(ends)}) and are left out",
            file=sys.stderr, flush=True,
        )  # fmt: skip
    if tr.sft.filter == "verified":  # the annotator's data filtered by the env's verdict
        kept = [t for t in answered if t.success]
        run.record.set("sft_filter", {"answered": len(answered), "verified": len(kept)})
        print(f"SFT golden data: {len(kept)} of {len(answered)} answered episodes verified "
              "(trainer.sft.filter=verified)", flush=True)  # fmt: skip
        answered = kept
    return [(t.token_ids, t.loss_mask) for t in answered]


def _note_sft_data(run: _Run, oracle_rows: int, sft_file: SftFile | None) -> None:
    """Record (``stages.json``'s ``sft_data``) and print how many SFT rows came from where."""
    rows = oracle_rows + (len(sft_file.rows) if sft_file is not None else 0)
    note: dict[str, Any] = {"rows": rows, "oracle_rows": oracle_rows, "file_rows": 0}
    parts = [f"{oracle_rows} oracle episodes"] if run.tr.sft.oracle else []
    if sft_file is not None:
        note.update(file_rows=len(sft_file.rows), file=sft_file.record())
        parts.append(f"{len(sft_file.rows)} conversations from {sft_file.path}")
    run.record.set("sft_data", note)
    run.record.save()
    print(f"SFT data: {rows} rows = {' + '.join(parts)}", flush=True)


def _reference(run: _Run, state: TrainState, start: int) -> Any:
    """The frozen KL reference: the SFT result (RL's starting point), also after a resume."""
    if run.cfg.loss.kl_coef <= 0:
        return None
    if start == 0 or not run.ckpt.all_steps("sft"):
        return jax.tree.map(jnp.copy, state.params)
    ref, _ = run.ckpt.restore(report.abstract(state), which="sft")
    return ref.params


async def _rl(run: _Run, engine: Any, state: TrainState, start: int) -> TrainState:
    cfg, tr, system = run.cfg, run.tr, run.sys
    group, collector = cfg.rollout.group_size, system.collector
    rows = tr.rl.tasks_per_step // jax.process_count() * group  # this process's rows of each step
    update = make_rl_update(
        system.graphdef, system.rest, run.rl_tx, loss_cfg=system.loss, adv_cfg=cfg.advantage,
        epochs=tr.rl.ppo_epochs, minibatches=tr.rl.minibatches,
        microbatches=tr.batching.microbatches, logprob_chunk=tr.batching.logprob_chunk,
        batch_sharding=collector.sharding,
        sampling=SamplingTransform.from_rollout(cfg.rollout),
    )  # fmt: skip
    ref = _reference(run, state, start)
    if ref is not None:
        run.record.set("kl_reference", {"from": "sft" if start else "rl_start",
                                        "checksum": report.checksum(ref)})  # fmt: skip

    source = StepSource(
        collector, system.env, run.keys, run.train_tasks, tr.rl.tasks_per_step, group,
        dynamic=tr.rl.dynamic_sampling, max_rounds=tr.rl.dynamic_max_rounds,
        dynamic_on=tr.rl.dynamic_sampling_on,
    )  # fmt: skip
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
            roll, rows=rows, max_turns=cfg.rollout.max_turns, mask_overlong=tr.rl.mask_overlong,
            pack=tr.batching.pack_rows, row_multiple=tr.rl.minibatches * tr.batching.microbatches,
            no_loss=source.no_loss(shaping.get("dynamic/fallback", 0)),
        )  # fmt: skip
        if db.sampled_tokens:
            state, metrics = await asyncio.to_thread(  # UPDATE: advantages + epochs x minibatches
                update, state, db.batch, db.episodes, run.keys.key("update", s), ref
            )
            metrics = {**D.host_value(metrics.as_dict()), "update_skipped": 0.0}
        else:  # no loss token on any process (a count over all): the optimizer does not step
            print(f"RL step {s + 1}: no episode has a loss token; the update is skipped",
                  flush=True)  # fmt: skip
            metrics = {"update_skipped": 1.0}
        metrics = {**metrics, **shaping, "real_frac": db.real_frac}
        if pending is None:
            push(state, s + 1)
            if s + 1 < tr.rl.steps:
                pending = launch(s + 1)
        train_s = time.perf_counter() - t_train
        row = report.step_row(run, roll, everyone, db, metrics, train_s, engine, s)
        if every(tr.eval.every, s + 1) and s + 1 < tr.rl.steps and pending is not None:
            done = await pending  # evaluate the newest weights: wait for the running collection
            pending = asyncio.ensure_future(_ready(done))
            push(state, s + 1)
        await _after_step(run, engine, state, s + 1, row, roll.trajectories, bar)
    return state


async def _ready(value: Any) -> Any:
    return value


async def _after_step(run: _Run, engine, state, step: int, row: dict, trajs: list, bar) -> None:
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
