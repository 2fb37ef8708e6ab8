"""A non-RL baseline the train job runs in place of the RL stage (``trainer.rl.stage=rft``).

Rejection-sampling fine-tuning (RFT): the policy RL would start from (the SFT result) samples
the RL stage's episode budget, ``trainer.rl.steps x tasks_per_step x rollout.group_size``
episodes on the same task stream and sampling seeds as RL's steps, with the rollout's
temperature, in the env of RL's episodes (``env.rl_options``); with
``trainer.rl.dynamic_sampling`` the budget is the most an RL step can sample,
``trainer.rl.dynamic_max_rounds`` rounds a step on RL's refill streams (RL drops uninformative
groups and usually stops earlier: the baseline never samples less). The env's verdict keeps the
successful ones (written to
``trajectories/rft_kept_step<N>.jsonl`` unless ``trainer.log.trajectories_every=0``); then
``trainer.rl.steps`` SFT steps of ``tasks_per_step x group_size`` rows each (the rows of an RL
update) train on the kept episodes, drawn uniformly, at ``trainer.sft.lr`` with the optimizer's
warm-up and a cosine decay over the stage. The sampler holds one policy throughout: one round
from the starting policy, not expert iteration. Same budget, same updates, no reward beyond the
verdict and no advantage: what RL adds over it is what the comparison measures.

The stage is not resumed midway: a run folder stopped inside it starts the stage again from its
starting checkpoint (the RL stage's step 0); its end is checkpointed as RL's last step.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.jobs.config import JobAborted
from jaxrl_agents.jobs.records import every
from jaxrl_agents.jobs.run import Run
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import LossInputs, TrainState, make_train_step


async def rft(run: Run, engine: Any, state: TrainState) -> TrainState:
    """The RFT stage of ``run`` from ``state`` (the starting policy, which ``engine`` holds);
    returns the fine-tuned state, checkpointed as RL's last step."""
    cfg, tr, system = run.cfg, run.tr, run.sys
    group, collector = cfg.rollout.group_size, system.collector
    source = run.step_source(dynamic=tr.rl.dynamic_sampling)
    kept: list[tuple[list[int], list[int]]] = []
    kept_trajs = []  # what the fine-tuning sees, written for audit
    episodes = 0
    for s in run.bar(0, tr.rl.steps, "RFT sampling"):
        for roll in await source.budget(engine, s, version=tr.sft.steps):
            trajs = collector.everyone(roll)  # every process holds every kept row (as in SFT)
            run.check_errors(trajs, f"RFT sampling round {s + 1}")
            episodes += len(trajs)
            kept += [(t.token_ids, t.loss_mask) for t in trajs if t.success]
            kept_trajs += [t for t in trajs if t.success]
    note = {"episodes": episodes, "kept": len(kept), "kept_frac": len(kept) / max(episodes, 1)}
    run.record.set("rft", note)
    run.record.save()
    if tr.log.trajectories_every:  # every kept episode: the data the stage fine-tunes on
        run.logger.trajectories(tr.rl.steps, kept_trajs, name="rft_kept")
    print(f"RFT: kept {len(kept)} of {episodes} sampled episodes (verified successes)", flush=True)
    if not kept:
        raise JobAborted(
            f"RFT: none of the {episodes} episodes sampled from the starting policy succeeded; "
            "nothing to fine-tune on"
        )
    opt = dataclasses.replace(cfg.optimizer, lr=tr.sft.lr, hold_steps=0, decay_steps=tr.rl.steps)
    tx = opt.build()
    state = run.fresh_state(state.params, tx)
    step_fn = make_train_step(
        system.graphdef,
        tx,
        sft_loss(chunk=tr.batching.logprob_chunk),
        microbatches=tr.batching.microbatches,
        rest=system.rest,
    )
    rows_per_step = tr.rl.tasks_per_step * group
    share = D.even_share(rows_per_step, "trainer.rl.tasks_per_step x rollout.group_size")
    rng = np.random.default_rng(run.keys.seed("rft_order"))
    last = None  # the step before the one in flight
    for s in run.bar(0, tr.rl.steps, "RFT"):
        rows = [kept[i] for i in rng.integers(0, len(kept), rows_per_step)]
        batch = collector.sft_batch(
            rows, share, pack=tr.batching.pack_rows, row_multiple=tr.batching.microbatches
        )
        state, m = step_fn(state, batch, LossInputs(denom=jnp.sum(batch.loss_mask)))
        jax.block_until_ready(last)  # one step in flight: the bar counts finished steps
        last = m
        if every(10, s + 1) or s + 1 == tr.rl.steps:
            run.logger.log(s + 1, D.host_value(m), stage="rft")
    if len(kept) < rows_per_step:
        print(
            f"WARNING: RFT: {len(kept)} kept episodes for batches of {rows_per_step} rows: "
            "each step repeats them",
            file=sys.stderr,
            flush=True,
        )
    run.checkpoint(tr.sft.steps + tr.rl.steps, state, "rl", tr.rl.steps, force=True)
    return state
