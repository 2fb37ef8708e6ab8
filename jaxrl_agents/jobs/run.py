"""The training job's long-lived pieces (:class:`Run`): the wired system, the PRNG streams, the
run folder's records, the logger, the checkpoints, the task splits and the two optimizers, with
the hooks the stages share (held-out evaluation, episode-error checks, checkpoint metadata)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import optax
from flax import nnx
from tqdm.auto import tqdm

from jaxrl_agents import distributed as D
from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.jobs.config import ConfigError, JobAborted, ModelSpec, RunConfig
from jaxrl_agents.jobs.records import RunRecord, environment
from jaxrl_agents.jobs.system import TrainSystem
from jaxrl_agents.models import Transformer
from jaxrl_agents.models.lora import base_fingerprint
from jaxrl_agents.rng import Keys
from jaxrl_agents.rollout.dynamic import StepSource
from jaxrl_agents.training.checkpoint import Checkpointer
from jaxrl_agents.training.metrics import RunLogger
from jaxrl_agents.training.step import TrainState, init_train_state
from jaxrl_agents.types import EndReason, Trajectory

_ERRORS = (EndReason.ENV_ERROR, EndReason.REWARD_ERROR)


def has_steps(ckpt_dir: Path) -> bool:
    """Whether a checkpoint set under ``ckpt_dir`` holds a step folder (complete or not)."""
    return any(p.name.isdigit() for sub in ("latest", "sft") for p in (ckpt_dir / sub).glob("*"))


def lora_base(
    spec: ModelSpec, seed: int, model: Transformer, record: RunRecord, has_checkpoints: bool
) -> dict | None:
    """With LoRA (``model.lora.rank``), the identity of the frozen base the adapters are trained
    on (``stages.json``'s ``lora_base`` and every checkpoint's metadata): its path and
    ``models.lora.base_fingerprint``. A run folder with checkpoints made on another base stops
    in one line (its adapters mean nothing on this one)."""
    if spec.lora.config() is None:
        return None
    where = spec.path or f"a fresh model.init (seed {seed})"
    base = {"path": where, "fingerprint": base_fingerprint(model)}
    old = record.stages.get("lora_base")
    if has_checkpoints and old is not None and old["fingerprint"] != base["fingerprint"]:
        raise ConfigError(
            f"model.path={where}: the LoRA adapters in {str(record.dir)!r} were trained on "
            f"another base ({old['path']}, fingerprint {old['fingerprint']}; this one is "
            f"{base['fingerprint']}): resume on that base, or use a new run_dir"
        )
    record.set("lora_base", base)
    return base


class Run:
    """The run's long-lived pieces: system, keys, records, logger, checkpoints, held-out tasks."""

    def __init__(self, cfg: RunConfig, system: TrainSystem):
        self.cfg, self.tr = cfg, cfg.trainer
        self.sys = system
        self.keys = Keys(cfg.seed, rl_seed=cfg.trainer.rl.seed)
        self.record = RunRecord(cfg.run_dir)
        ckpt_dir = self.record.dir / "checkpoints"
        # before anything is written:
        has_checkpoints = has_steps(ckpt_dir)
        self.record.check_config(cfg, has_checkpoints=has_checkpoints)
        self.base = lora_base(cfg.model, cfg.seed, system.model, self.record, has_checkpoints)
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

    def step_source(self, *, dynamic: bool) -> StepSource:
        """Each RL step's scored episodes (``rollout.dynamic``); with ``dynamic``, refilled per
        ``trainer.dynamic_*`` (the RFT stage samples without)."""
        tr = self.tr
        return StepSource(
            self.sys.train_collector(),
            partial(self.sys.env.tasks, "train"),
            self.keys,
            self.train_tasks,
            tr.rl.tasks_per_step,
            self.cfg.rollout.group_size,
            dynamic=dynamic,
            max_rounds=tr.rl.dynamic_max_rounds,
            dynamic_on=tr.rl.dynamic_sampling_on,
        )

    def fresh_state(self, params: nnx.State, tx: optax.GradientTransformation) -> TrainState:
        return D.replicated_on(init_train_state(params, tx), self.sys.mesh)

    def bar(self, start: int, total: int, desc: str) -> Iterable[int]:
        it = range(start, total)
        if not self.tr.log.progress or jax.process_index() != 0:
            return it
        return tqdm(it, desc=desc, dynamic_ncols=True, initial=start, total=total)

    async def evaluate(
        self, engine: Any, *, version: int, split: str = "heldout"
    ) -> tuple[dict[str, Any], list[Trajectory]]:
        """Greedy success on the held-out (test) or the validation tasks."""
        tasks = self.heldout if split == "heldout" else self.validation
        trajs = await self.sys.collector.evaluate(
            engine, tasks, seed=self.cfg.seed, version=version
        )
        self.check_errors(trajs, f"{split} evaluation (policy version {version})")
        return summarize(trajs), trajs

    def check_errors(self, trajs: list[Trajectory], where: str) -> None:
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
            raise JobAborted(
                f"{line} (more than trainer.log.error_abort_frac={self.tr.log.error_abort_frac})"
            )
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
