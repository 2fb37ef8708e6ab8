"""The train job's SFT stage: the golden pool (the env's oracle driven through the rollout path,
and the user's ``trainer.sft.data`` file), the synthetic copy rows of a fresh model's first steps
(``trainer.sft.copy_steps``), and the SFT steps themselves."""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.chat import ChatFormat
from jaxrl_agents.jobs.config import ConfigError, JobAborted, TrainerSpec
from jaxrl_agents.jobs.records import every
from jaxrl_agents.jobs.run import Run
from jaxrl_agents.jobs.system import seq_buckets
from jaxrl_agents.rollout import RolloutConfig
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.training.copy_rows import copy_rows, ordinary_ids
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.sft_data import SftDataError, SftFile, load
from jaxrl_agents.training.step import LossInputs, TrainState, make_train_step
from jaxrl_agents.types import EndReason


def load_for_run(trainer: TrainerSpec, rollout: RolloutConfig, chat: ChatFormat) -> SftFile | None:
    """The run's ``trainer.sft.data`` checked line by line (None when unset or without SFT):
    :class:`ConfigError` in one line on the first problem. Nothing is written or compiled."""
    tr = trainer
    if tr.sft.data is None or tr.sft.steps == 0:
        return None
    largest = max(seq_buckets(trainer, rollout))
    if tr.batching.seq_buckets is not None:
        hint = (
            f"trainer.batching.seq_buckets={sorted(tr.batching.seq_buckets)}: add a larger length"
        )
    else:
        hint = (
            f"the buckets follow rollout.max_total_tokens={rollout.max_total_tokens}: raise "
            "it (with sampler.max_seq_len) or set trainer.batching.seq_buckets"
        )
    try:
        return load(tr.sft.data, chat, max_positions=largest, hint=hint)
    except SftDataError as e:
        raise ConfigError(str(e)) from None


async def sft_stage(
    run: Run, state: TrainState, start: int, sft_file: SftFile | None = None
) -> TrainState:
    """The SFT stage from step ``start``: copy rows first (``trainer.sft.copy_steps``), then the
    golden pool (the oracle's episodes and the ``trainer.sft.data`` file) in a seeded order."""
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
        system.graphdef,
        run.sft_tx,
        sft_loss(chunk=tr.batching.logprob_chunk),
        microbatches=tr.batching.microbatches,
        rest=system.rest,
    )
    order = np.random.default_rng(run.keys.seed("sft_order")).permutation(len(data))
    copies = tr.sft.copy_steps
    vocab = None
    if start < copies:
        vocab = ordinary_ids(system.chat.tokenizer)
        print(
            f"SFT: steps {start + 1}-{copies} on synthetic copy rows (trainer.sft.copy_steps), "
            f"then {tr.sft.steps - copies} on the golden data",
            flush=True,
        )
    # Every process holds all golden data (scripted, or read from the file) and packs its share
    # of each batch.
    share = D.even_share(tr.sft.batch_size, "trainer.sft.batch_size")
    copy_share = D.even_share(tr.sft.copy_batch, "trainer.sft.copy_batch") if copies else share
    bar = run.bar(start, tr.sft.steps, "SFT")
    last = None  # the step before the one in flight
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
        jax.block_until_ready(last)  # one step in flight: the bar counts finished steps
        last = m
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


async def _oracle_rows(run: Run) -> list[tuple[list[int], list[int]]]:
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
            file=sys.stderr,
            flush=True,
        )
    if tr.sft.filter == "verified":  # the annotator's data filtered by the env's verdict
        kept = [t for t in answered if t.success]
        run.record.set("sft_filter", {"answered": len(answered), "verified": len(kept)})
        print(
            f"SFT golden data: {len(kept)} of {len(answered)} answered episodes verified "
            "(trainer.sft.filter=verified)",
            flush=True,
        )
        answered = kept
    return [(t.token_ids, t.loss_mask) for t in answered]


def _note_sft_data(run: Run, oracle_rows: int, sft_file: SftFile | None) -> None:
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
