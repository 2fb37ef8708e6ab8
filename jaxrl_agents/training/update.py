"""The RL update as one jitted device program.

``update(state, batch, episodes, key, ref_params) -> (state, RLMetrics)`` does, on device:

0. **Old policy** (only when ``loss.is_correction`` is on, or a KL reward needs the policy's
   temperature-1 logprobs under a sampling transform): one forward pass of the starting
   parameters over the batch gives ``pi_old``, the learner's logprobs under the sampling
   transform. It becomes the PPO ratio's denominator, and ``rho = pi_old / mu`` against the
   sampler's behaviour logprobs ``mu`` gives the truncated-IS weights or the masked-IS mask
   (``algos.correction.rollout_correction``). The pass costs about a third of one epoch (forward
   only), so it is not run when nothing needs it; the mismatch diagnostic then comes free from
   the first update's forward pass (see ``RLMetrics.mismatch_kl``).
1. **KL reference** (when the loss has a KL coefficient): the frozen reference's logprobs of the
   batch, temperature 1 and unfiltered (the KL is between the policies, not the samplers); with
   ``kl_as_reward`` the KL becomes a per-trajectory reward penalty (``algos.kl_reward``) before
   advantages, otherwise it is a loss term.
2. **Advantages** with the configured estimator on the whole (global) batch, so estimators that
   whiten or normalise over the batch see every process's rows. Estimators run in *episode
   space*, ``[E, T]`` with one trajectory per row (``compute_advantages`` as written): the batch
   may pack several trajectories per row (``rollout.packing``), so the per-token inputs (loss
   mask, turn ids, the critic's values, the logprobs of a KL reward) are gathered from the rows
   by the episodes' ``row`` / ``offset`` / ``length``, and advantages and returns are scattered
   back (:class:`_Layout`).
3. **K epochs x M minibatches** as one ``lax.scan``: each epoch draws a permutation of the rows
   from ``fold_in(key, epoch)``, the minibatch rows are gathered on device (a packed row's
   trajectories stay together), and every minibatch is one optimizer update (``training.step``:
   micro-batch accumulation, clipping, the non-finite guard) with its own aggregation
   denominator. Per-sequence terms reduce per segment (``algos.losses``), so a packed batch and
   one trajectory per row give the same loss and gradients for the same minibatch trajectories.

Nothing goes back to the host in between; the metrics come back as one named record.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_agents.algos import (
    AdvantageConfig,
    AdvantageInputs,
    LossConfig,
    aggregation_denominator,
    compute_advantages,
    kl_reward,
)
from jaxrl_agents.algos.correction import rollout_correction
from jaxrl_agents.batches import EpisodeArrays, TrainBatch
from jaxrl_agents.training.logprobs import SamplingTransform, normalize_transform, token_stats
from jaxrl_agents.training.objectives import RLLossInputs, rl_loss
from jaxrl_agents.training.step import TrainState, WithRest, train_step_fn


class RLMetrics(NamedTuple):
    """One RL step's metrics (device scalars). Loss-side values are means over the step's
    ``epochs x minibatches`` updates (``ratio_max``: their max; ``skipped``: their count);
    a value that does not apply to the configuration (``kl`` without a reference, ``vf_*``
    without a critic) is NaN, which the run logger leaves out."""

    loss: jax.Array
    pg_loss: jax.Array
    clip_frac: jax.Array
    approx_kl: jax.Array
    ratio_mean: jax.Array
    ratio_max: jax.Array
    entropy: jax.Array
    logprob_diff: jax.Array
    kl: jax.Array
    kl_reward: jax.Array
    vf_loss: jax.Array
    explained_variance: jax.Array
    """``1 - Var(returns - V) / Var(returns)`` of the critic's values at the step's starting
    weights over sampled tokens (NaN without a critic): 1 is a perfect critic, 0 a constant."""
    grad_norm: jax.Array
    skipped: jax.Array
    """Updates of this step dropped by the non-finite guard."""
    adv_mean: jax.Array
    adv_abs: jax.Array
    mismatch_kl: jax.Array
    """k3 estimate of KL(sampler || learner) at the step's starting weights, token mean:
    ``exp(l) - 1 - l``, ``l = log pi_old - log mu`` (verl's ``rollout_corr/k3_kl``). Over the
    whole batch when the old-policy pass runs (``is_correction`` on), else over the first
    minibatch's rows (free: the first update's forward pass is at the starting weights)."""
    is_weight_mean: jax.Array
    """Mean mismatch-correction weight over sampled tokens (kept fraction for masked IS); NaN
    without a correction."""
    is_truncated_frac: jax.Array
    """Fraction of sampled tokens whose truncated-IS weight hit the cap (NaN unless ``tis_*``)."""
    is_masked_frac: jax.Array
    """Fraction of sampled tokens masked IS dropped (NaN unless ``mis_*``)."""

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


_MEAN_FIELDS = (
    "loss",
    "pg_loss",
    "clip_frac",
    "approx_kl",
    "ratio_mean",
    "entropy",
    "logprob_diff",
    "kl",
    "vf_loss",
    "grad_norm",
)


def _explained(returns: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    n = jnp.maximum(jnp.sum(mask), 1.0)

    def var(x):
        mean = jnp.sum(x * mask) / n
        return jnp.sum(((x - mean) * mask) ** 2) / n

    return 1.0 - var(returns - values) / jnp.maximum(var(returns), 1e-8)


class _Layout:
    """Where the batch's trajectories lie: gathers rows -> episode space ``[E, T]`` and scatters
    back (the identity when the episodes carry no placement: one trajectory per row)."""

    def __init__(self, batch: TrainBatch, episodes: EpisodeArrays):
        self.shape = batch.loss_mask.shape
        self.identity = episodes.row is None
        if self.identity:
            return
        T = self.shape[1]
        t = jnp.arange(T)[None, :]
        self.inside = t < episodes.length[:, None]  # [E, T]
        self.row = episodes.row[:, None]
        self.col = jnp.where(self.inside, episodes.offset[:, None] + t, 0)

    def to_episodes(self, x: jax.Array, fill=0) -> jax.Array:
        """``[R, T]`` rows -> ``[E, T]``: trajectory ``e``'s positions from 0, ``fill`` after."""
        if self.identity:
            return x
        return jnp.where(self.inside, x[self.row, self.col], jnp.asarray(fill, x.dtype))

    def to_rows(self, y: jax.Array) -> jax.Array:
        """``[E, T]`` -> ``[R, T]`` rows (0 where no trajectory lies)."""
        if self.identity:
            return y
        col = jnp.where(self.inside, self.col, self.shape[1])  # out of range: dropped
        return jnp.zeros(self.shape, y.dtype).at[self.row, col].set(y, mode="drop")


def make_rl_update(
    graphdef: nnx.GraphDef,
    rest: Any,
    tx: optax.GradientTransformation,
    *,
    loss_cfg: LossConfig,
    adv_cfg: AdvantageConfig,
    epochs: int,
    minibatches: int,
    microbatches: int,
    logprob_chunk: int,
    batch_sharding: Any = None,
    sampling: SamplingTransform | None = None,
):
    """Build the jitted ``update(state, batch, episodes, key, ref_params)`` (state donated;
    ``rest``, the model's non-trained state, goes in as an argument of every call: ``WithRest``).

    ``batch`` / ``episodes`` are the device arrays of one step (``rollout.Collector``): packed
    rows or one trajectory per row, with the episodes' placement in the rows;
    ``key`` is this step's update key; ``ref_params`` the frozen KL reference (None when the loss
    has no KL term). Rows must divide into ``minibatches``, and a minibatch's rows into
    ``microbatches`` (checked at start-up by the jobs).

    ``sampling``: the transform the rollouts were sampled under,
    ``SamplingTransform.from_rollout(cfg.rollout)`` (None: temperature 1, unfiltered). The
    learner's logprobs are computed under it so that they match the behaviour logprobs the
    orchestrator stored (``batch.old_logprobs``).
    """
    program = _RLUpdate(
        graphdef,
        tx,
        loss_cfg=loss_cfg,
        adv_cfg=adv_cfg,
        epochs=epochs,
        minibatches=minibatches,
        microbatches=microbatches,
        logprob_chunk=logprob_chunk,
        batch_sharding=batch_sharding,
        sampling=sampling,
    )
    return WithRest(jax.jit(program.update, donate_argnums=(0,)), rest)


class _Advantages(NamedTuple):
    """What the advantage phase hands on: the batch with advantages and returns in its rows, and
    their metrics."""

    batch: TrainBatch
    adv_mean: jax.Array
    adv_abs: jax.Array


class _RLUpdate:
    """The phases of :func:`make_rl_update`'s program, in the order :meth:`update` traces them
    (the numbered steps of the module docstring). Nothing here runs eagerly: every method is
    traced once, inside ``jax.jit``."""

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        tx: optax.GradientTransformation,
        *,
        loss_cfg: LossConfig,
        adv_cfg: AdvantageConfig,
        epochs: int,
        minibatches: int,
        microbatches: int,
        logprob_chunk: int,
        batch_sharding: Any,
        sampling: SamplingTransform | None,
    ):
        self.graphdef, self.loss_cfg, self.adv_cfg = graphdef, loss_cfg, adv_cfg
        self.epochs, self.minibatches = epochs, minibatches
        self.logprob_chunk, self.batch_sharding = logprob_chunk, batch_sharding
        self.sampling = sampling = normalize_transform(sampling)
        self.step = train_step_fn(
            graphdef,
            tx,
            rl_loss(loss_cfg, chunk=logprob_chunk, sampling=sampling),
            microbatches=microbatches,
        )
        self.uses_ref = loss_cfg.kl_coef > 0
        self.correct = loss_cfg.is_correction != "none"
        # The KL reward compares temperature-1 logprobs; under a transform the stored ones are not.
        self.need_old = self.correct or (
            self.uses_ref and loss_cfg.kl_as_reward and sampling is not None
        )
        self.critic = loss_cfg.vf_coef > 0

    def update(
        self, state: TrainState, batch: TrainBatch, episodes: EpisodeArrays, key, ref_params, rest
    ):
        nan = jnp.full((), jnp.nan, jnp.float32)
        behaviour = batch.old_logprobs
        lay = _Layout(batch, episodes)
        ep_mask = lay.to_episodes(batch.loss_mask)  # episode space: one trajectory per row
        old, old_values = self.old_policy(state.params, rest, batch)
        rewards, ref_lp, kl_rew = self.reference(
            ref_params, rest, batch, episodes, lay, ep_mask, old, nan
        )
        adv = self.advantages(batch, episodes, lay, ep_mask, rewards, old_values)
        batch = adv.batch
        ret = batch.returns
        mask = batch.loss_mask
        batch, is_w, corr = self.correction(batch, old, behaviour)
        state, ms = self.minibatch_loop(state, batch, key, ref_lp, is_w, old_values, rest)
        get = lambda name: jnp.mean(ms[name]).astype(jnp.float32) if name in ms else nan
        metrics = RLMetrics(
            **{name: get(name) for name in _MEAN_FIELDS},
            ratio_max=jnp.max(ms["ratio_max"]),
            kl_reward=kl_rew,
            skipped=jnp.sum(ms["nonfinite"].astype(jnp.int32)),
            adv_mean=adv.adv_mean,
            adv_abs=adv.adv_abs,
            # Without the old-policy pass, the first update's approx_kl is k3(mu -> pi) at the
            # starting weights over the first minibatch: the mismatch, for free.
            mismatch_kl=ms["approx_kl"][0] if corr is None else corr.mismatch_kl,
            is_weight_mean=corr.weight_mean if self.correct else nan,
            is_truncated_frac=corr.truncated_frac if self.correct else nan,
            is_masked_frac=corr.masked_frac if self.correct else nan,
            explained_variance=nan if old_values is None else _explained(ret, old_values, mask),
        )
        return state, metrics

    def stats_of(self, params, rest, batch: TrainBatch, transform, with_values: bool = False):
        """Token statistics of ``batch`` under ``params``, no gradient."""
        model = nnx.merge(self.graphdef, params, rest)
        stats = token_stats(
            model,
            batch.input_ids,
            batch.positions,
            batch.segment_ids,
            batch.target_ids,
            chunk=self.logprob_chunk,
            with_entropy=False,
            sampling=transform,
            with_values=with_values,
        )
        return jax.tree.map(jax.lax.stop_gradient, stats)

    def old_policy(self, params, rest, batch: TrainBatch):
        """Step 0: the starting parameters' token statistics (``pi_old``, the critic's values)
        when a correction, a transformed KL reward or the critic needs them, else None; and the
        critic's values at the starting weights (GAE inputs, the clipped value loss's anchor)."""
        old = None
        if self.need_old or self.critic:
            old = self.stats_of(params, rest, batch, self.sampling, self.critic)
        old_values = None
        if self.critic:
            old_values = old.values * batch.loss_mask
        return old, old_values

    def reference(self, ref_params, rest, batch, episodes, lay: _Layout, ep_mask, old, nan):
        """Step 1: ``(rewards, ref_logprobs, kl_reward)``. The frozen reference's logprobs
        (temperature 1, unfiltered) for the KL loss term; with ``kl_as_reward`` the KL becomes a
        per-trajectory reward penalty instead (``ref_logprobs`` None, ``kl_reward`` its mean)."""
        cfg = self.loss_cfg
        rewards, kl_rew, ref_lp = episodes.rewards, nan, None
        if not self.uses_ref:
            return rewards, ref_lp, kl_rew
        ref_lp = self.stats_of(ref_params, rest, batch, None).logprobs
        if cfg.kl_as_reward:
            behaviour = batch.old_logprobs
            rewards, kl_traj = kl_reward(
                rewards,
                logprobs=lay.to_episodes(behaviour if old is None else old.policy_logprobs),
                ref_logprobs=lay.to_episodes(ref_lp),
                loss_mask=ep_mask,
                kind=cfg.kl_estimator,
                coef=cfg.kl_coef,
            )
            valid = episodes.row_valid
            kl_rew = jnp.sum(kl_traj * valid) / jnp.maximum(jnp.sum(valid), 1.0)
            ref_lp = None  # a reward penalty, not a loss term
        return rewards, ref_lp, kl_rew

    def advantages(self, batch, episodes, lay: _Layout, ep_mask, rewards, old_values):
        """Step 2: the estimator in episode space, advantages and returns scattered back to the
        rows; the critic without value targets from the estimator regresses on the Monte-Carlo
        return."""
        adv_cfg = self.adv_cfg
        inputs = AdvantageInputs(
            rewards=rewards,
            group_ids=episodes.group_ids,
            loss_mask=ep_mask,
            turn_ids=lay.to_episodes(batch.turn_ids, fill=-1),
            turn_rewards=episodes.turn_rewards,
            turn_mask=episodes.turn_mask,
            anchor_ids=episodes.anchor_ids,
            values=None if old_values is None else lay.to_episodes(old_values),
        )
        adv = compute_advantages(adv_cfg.name, inputs, adv_cfg)
        returns = adv.returns
        if returns is None and self.critic:
            # An estimator without value targets (grpo, rloo, ...): the critic regresses on the
            # Monte-Carlo return (GAE with V = 0, lambda = 1: the discounted trajectory reward).
            mc_cfg = AdvantageConfig(name="gae", gamma=adv_cfg.gamma, lam=1.0)
            mc_inputs = inputs._replace(values=jnp.zeros_like(ep_mask))
            returns = compute_advantages("gae", mc_inputs, mc_cfg).returns
        advantages = lay.to_rows(adv.advantages)
        batch = batch._replace(
            advantages=advantages,
            returns=lay.to_rows(returns) if returns is not None else batch.returns,
        )
        mask = batch.loss_mask
        n_tok = jnp.maximum(jnp.sum(mask), 1.0)
        adv_mean = jnp.sum(advantages * mask) / n_tok
        adv_abs = jnp.sum(jnp.abs(advantages) * mask) / n_tok
        return _Advantages(batch, adv_mean, adv_abs)

    def correction(self, batch: TrainBatch, old, behaviour):
        """The sampler/learner mismatch of step 0 applied: ``(batch, is_weights, correction)``.
        With a correction on, ``pi_old`` becomes the ratio's denominator (``mu`` enters only
        through ``rho``) and masked IS drops tokens from the loss mask."""
        cfg = self.loss_cfg
        mask = batch.loss_mask
        is_w, corr = None, None
        if old is not None and self.need_old:
            corr = rollout_correction(
                old.logprobs,
                behaviour,
                mask,
                mode=cfg.is_correction,
                cap=cfg.is_cap,
                segment_ids=batch.segment_ids,
            )
        if self.correct:
            batch = batch._replace(old_logprobs=old.logprobs)
            if corr.keep is not None:  # masked IS: the dropped tokens leave the loss
                batch = batch._replace(loss_mask=mask * corr.keep)
            is_w = corr.weights
        return batch, is_w, corr

    def minibatch_loop(self, state: TrainState, batch, key, ref_lp, is_w, old_values, rest):
        """Step 3: ``epochs x minibatches`` optimizer updates as one ``lax.scan`` over row
        permutations drawn from ``fold_in(key, epoch)``; returns the state and the stacked
        per-update metrics."""
        cfg = self.loss_cfg
        rows = batch.input_ids.shape[0]
        per_mb = rows // self.minibatches
        epoch_keys = jax.vmap(lambda e: jax.random.fold_in(key, e))(jnp.arange(self.epochs))
        perms = jax.vmap(lambda k: jax.random.permutation(k, rows))(epoch_keys)
        picks = perms.reshape(self.epochs * self.minibatches, per_mb)

        def one_update(st: TrainState, pick):
            take = lambda x: x[pick]
            mb = jax.tree.map(take, batch)
            ref_mb = None if ref_lp is None else take(ref_lp)
            w_mb = None if is_w is None else take(is_w)
            v_mb = None if old_values is None else take(old_values)
            if self.batch_sharding is not None:
                mb = jax.lax.with_sharding_constraint(mb, self.batch_sharding)
            denom = aggregation_denominator(
                mb.loss_mask,
                cfg.agg_mode,
                max_len=cfg.max_len_norm,
                segment_ids=mb.segment_ids,
            )
            inputs = RLLossInputs(
                denom=denom, ref_logprobs=ref_mb, is_weights=w_mb, old_values=v_mb
            )
            st, m = self.step(st, mb, inputs, rest)
            return st, m

        return jax.lax.scan(one_update, state, picks)
