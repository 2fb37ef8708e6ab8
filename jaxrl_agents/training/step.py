"""The jitted, sharded train step: gradient accumulation, clipping, a non-finite guard.

One function serves SFT and RL; only the loss differs (:mod:`jaxrl_agents.training.objectives`).

* **Accumulation**: the batch ``[B, T]`` is split into ``k`` micro-batches ``[k, B/k, T]`` and a
  ``lax.scan`` sums their gradients, so ``k`` micro-batches give the same update as one full batch
  (each micro-batch loss is weighted by its share of the aggregation denominator; see
  ``objectives``).
* **Non-finite guard**: if the loss or any gradient is NaN/inf the update is skipped (parameters
  and optimizer state kept), ``skipped`` is incremented, and training goes on.
* **Sharding**: parameters and optimizer state keep the shardings they were created with
  (``sharding.shard_model``); the batch is placed with its leading axis over (``data``, ``fsdp``).
  XLA's SPMD partitioner inserts the FSDP all-gathers and gradient reduce-scatters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_agents.batches import TrainBatch


class TrainState(NamedTuple):
    """The trained state, as one pytree. Randomness and data order are not state: the jobs derive
    them from the run's seed and the step number (``jax.random.fold_in``), so a resumed run
    draws exactly what an uninterrupted one would."""

    params: Any  # nnx.State of the policy's nnx.Param variables
    opt_state: Any
    step: jax.Array  # Int[]: optimizer updates applied
    skipped: jax.Array  # Int[]: updates skipped by the non-finite guard


@dataclasses.dataclass
class OptimizerConfig:
    """optax AdamW with warmup + cosine decay and global-norm clipping."""

    lr: float = 3e-4
    """Peak learning rate."""
    warmup_steps: int = 2
    """Linear warmup over this many updates: update ``k < warmup_steps`` uses
    ``lr * (k + 1) / (warmup_steps + 1)``, so the first update is never a no-op (0: none)."""
    decay_steps: int = 0
    """Cosine decay length after warmup (0 = constant after warmup)."""
    hold_steps: int = 0
    """Updates at the peak ``lr`` between the warmup and the cosine decay. SFT sets its own: its
    copy steps (``trainer.sft.copy_steps``), so the golden steps get the whole decay."""
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global-norm clip (0 disables)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        for name in ("warmup_steps", "decay_steps", "hold_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1]")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0):
            raise ValueError(f"b1={self.b1} and b2={self.b2} must lie in [0, 1)")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.eps <= 0:
            raise ValueError(
                f"grad_clip={self.grad_clip}, weight_decay={self.weight_decay} must be >= 0 and "
                f"eps={self.eps} > 0"
            )

    def schedule(self) -> optax.Schedule:
        """The learning rate of update ``k``: warmup, ``hold_steps`` at ``lr``, cosine decay."""
        w = self.warmup_steps
        if self.decay_steps > 0:
            after = optax.cosine_decay_schedule(self.lr, self.decay_steps, self.min_lr_ratio)
        else:
            after = optax.constant_schedule(self.lr)
        if self.hold_steps > 0 and self.decay_steps > 0:
            after = optax.join_schedules(
                [optax.constant_schedule(self.lr), after], [self.hold_steps]
            )
        if w == 0:
            return after
        warm = optax.linear_schedule(self.lr / (w + 1), self.lr * w / (w + 1), max(w - 1, 1))
        return optax.join_schedules([warm, after], [w])

    def build(self) -> optax.GradientTransformation:
        sched = self.schedule()
        parts = [optax.clip_by_global_norm(self.grad_clip)] if self.grad_clip > 0 else []
        parts.append(
            optax.adamw(sched, b1=self.b1, b2=self.b2, eps=self.eps, weight_decay=self.weight_decay)
        )
        return optax.chain(*parts)


def init_train_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(
        params=params,
        opt_state=tx.init(params),
        step=jnp.zeros((), jnp.int32),
        skipped=jnp.zeros((), jnp.int32),
    )


class LossInputs(NamedTuple):
    """What a loss needs besides the model and the micro-batch rows."""

    denom: jax.Array
    """Float[]: the *full* batch's aggregation denominator (tokens for token-mean, sequences for
    the seq-mean modes; ``algos.aggregation_denominator``), shared by every micro-batch so that
    micro-batch losses sum to the loss of the whole batch."""
    ref_logprobs: jax.Array | None = None
    """Float['B T']: the frozen reference's logprobs, when a KL loss term is on."""


LossFn = Callable[[Any, TrainBatch, LossInputs], tuple[jax.Array, dict[str, jax.Array]]]
"""``(model, micro_batch, inputs) -> (loss, metrics)``."""


def _is_finite_tree(tree: Any) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


StepFn = Callable[[TrainState, TrainBatch, LossInputs], tuple[TrainState, dict[str, jax.Array]]]


class WithRest:
    """A jitted ``fn(*args, rest)`` called as ``fn(*args)``: the model's non-trained state
    (``rest``: RoPE tables, or under LoRA the whole frozen base) goes in as an argument of every
    call, never as a constant of the compiled program (closed-over arrays are baked into the
    program, where XLA constant-folds them: seconds of compile per base weight and a second copy
    of the base inside the executable)."""

    def __init__(self, fn: Any, rest: Any):
        self.fn, self.rest = fn, rest

    def __call__(self, *args):
        return self.fn(*args, self.rest)

    def lower(self, *args):
        return self.fn.lower(*args, self.rest)

    def __getattr__(self, name: str) -> Any:  # _cache_size, ... of the jitted function
        return getattr(self.fn, name)


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    loss_fn: LossFn,
    *,
    microbatches: int = 1,
    rest: Any = None,
) -> StepFn:
    """``step(state, batch, inputs) -> (state, metrics)``, jitted with the state donated
    (``rest`` passed to every call as an argument, see :class:`WithRest`)."""
    step = train_step_fn(graphdef, tx, loss_fn, microbatches=microbatches)
    return WithRest(jax.jit(step, donate_argnums=(0,)), rest)


def train_step_fn(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    loss_fn: LossFn,
    *,
    microbatches: int = 1,
    rest: Any = None,
) -> StepFn:
    """The traceable ``step(state, batch, inputs) -> (state, metrics)``: one optimizer update
    (to be jitted, or called inside a larger program such as ``training.update``).

    ``rest`` is the non-trained model state (e.g. RoPE tables held as non-Param variables, or
    under LoRA the frozen base), merged back with the parameters for every forward pass; the
    step takes it as its last argument (default: this ``rest``), so a jitted step can receive it
    as an input rather than a constant.
    """
    default_rest = rest

    def grads_of(params, mb, extra, rest):
        def f(p):
            model = nnx.merge(graphdef, p, rest) if rest is not None else nnx.merge(graphdef, p)
            return loss_fn(model, mb, extra)

        return jax.value_and_grad(f, has_aux=True)(params)

    def step(state: TrainState, batch: TrainBatch, extra: LossInputs, rest: Any = default_rest):
        B = batch.input_ids.shape[0]
        if B % microbatches:
            raise ValueError(f"batch size {B} is not divisible by microbatches={microbatches}")
        mbs = jax.tree.map(
            lambda x: x.reshape(microbatches, B // microbatches, *x.shape[1:]), batch
        )
        mb_extra = jax.tree.map(
            lambda x: (
                x.reshape(microbatches, B // microbatches, *x.shape[1:])
                if getattr(x, "ndim", 0) >= 1 and x.shape[0] == B
                else jnp.broadcast_to(x, (microbatches, *jnp.shape(x)))
            ),
            extra,
        )

        def body(acc, xs):
            mb, ex = xs
            (loss, metrics), g = grads_of(state.params, mb, ex, rest)
            acc_g, acc_loss, acc_m = acc
            acc_g = jax.tree.map(jnp.add, acc_g, g)
            acc_m = jax.tree.map(jnp.add, acc_m, metrics)
            return (acc_g, acc_loss + loss, acc_m), None

        zeros_g = jax.tree.map(jnp.zeros_like, state.params)
        (_, m0), _ = jax.eval_shape(
            lambda: grads_of(
                state.params,
                jax.tree.map(lambda x: x[0], mbs),
                jax.tree.map(lambda x: x[0], mb_extra),
                rest,
            )
        )
        zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0)
        (g, loss, metrics), _ = jax.lax.scan(
            body, (zeros_g, jnp.zeros((), jnp.float32), zeros_m), (mbs, mb_extra)
        )
        # Losses are pre-weighted so micro-batch losses *sum* to the full-batch loss; metrics are
        # averaged over micro-batches.
        metrics = jax.tree.map(lambda x: x / microbatches, metrics)
        finite = _is_finite_tree(g) & jnp.isfinite(loss)
        grad_norm = optax.tree.norm(g)
        updates, new_opt = tx.update(g, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        new_state = state._replace(
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, state.opt_state),
            step=state.step + finite.astype(jnp.int32),
            skipped=state.skipped + (~finite).astype(jnp.int32),
        )
        metrics = {**metrics, "loss": loss, "grad_norm": grad_norm, "nonfinite": ~finite}
        return new_state, metrics

    return step
