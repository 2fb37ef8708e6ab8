"""Does a freshly initialised policy learn in-context copying (an induction head) from the copy
rows of ``trainer.sft.copy_steps``, and when?  The check behind the preset's copy steps
(EXPERIMENTS.md): it trains the model of ``experiment=<name>`` on the job's copy rows through the
job's own SFT step, batching and optimizer (``trainer.sft.lr``, held), and prints the repeat's
NLL every 50 steps against chance (the log of the vocabulary the rows draw from).

    python scripts/check_copy_head.py                        # sql's model, rows of 64 tokens
    python scripts/check_copy_head.py --length 256 --steps 1000 --batch 16    # the rows that fail

On 2 CPU cores, rows of 64 take ~0.17 s a step.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import jax.numpy as jnp
import numpy as np

from jaxrl_agents import distributed as D
from jaxrl_agents.cli.app import compose
from jaxrl_agents.cli.train import to_run_config
from jaxrl_agents.jobs.system import build_train
from jaxrl_agents.training.copy_rows import COPY_LEN, copy_rows, ordinary_ids
from jaxrl_agents.training.objectives import sft_loss
from jaxrl_agents.training.step import LossInputs, init_train_state, make_train_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="sql")
    ap.add_argument("--length", type=int, default=COPY_LEN)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = to_run_config(
        compose("config", [f"experiment={args.experiment}", "mesh=single", f"seed={args.seed}"])
    )
    system = build_train(cfg)
    tx = dataclasses.replace(cfg.optimizer, lr=cfg.trainer.sft.lr, decay_steps=0).build()
    state = D.replicated_on(init_train_state(system.initial_params, tx), system.mesh)
    step = make_train_step(
        system.graphdef, tx, sft_loss(chunk=cfg.trainer.batching.logprob_chunk), rest=system.rest
    )
    vocab = ordinary_ids(system.chat.tokenizer)
    rng = np.random.default_rng(args.seed)
    share = slice(0, args.batch)
    print(
        f"copy rows of {args.length} tokens, {args.batch} a step, lr {cfg.trainer.sft.lr}; "
        f"chance NLL {math.log(len(vocab)):.2f}",
        flush=True,
    )
    t0, nll, formed = time.time(), [], None
    for s in range(1, args.steps + 1):
        rows = copy_rows(rng, vocab, args.batch, length=args.length)
        batch = system.collector.sft_batch(rows, share, pack=cfg.trainer.batching.pack_rows)
        state, m = step(state, batch, LossInputs(denom=jnp.sum(batch.loss_mask)))
        nll.append(float(m["nll"]))
        if formed is None and np.mean(nll[-10:]) < 1.0:
            formed = s
        if s % 50 == 0:
            print(
                f"step {s:5d}  copy NLL {np.mean(nll[-50:]):.3f}  {time.time() - t0:.0f} s",
                flush=True,
            )
    print("the repeat is copied (NLL over 10 steps < 1.0) from step", formed or "never")


if __name__ == "__main__":
    main()
