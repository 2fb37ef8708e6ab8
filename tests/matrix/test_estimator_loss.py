"""Path matrix, estimator x loss: every pair of a configs/advantage file and a configs/loss file
(folders enumerated), composed exactly as ``jaxrl-train`` composes them (presets, derived
defaults, the critic when the pair has a value term), runs two steps of the RL update program
on a toy policy: the parameters change and stay finite, every metric that applies is finite."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ADV = sorted(p.stem for p in (CONFIGS / "advantage").glob("*.yaml"))
LOSS = sorted(p.stem for p in (CONFIGS / "loss").glob("*.yaml"))
B, T, G = 8, 16, 4


def _batch(seed):
    from jaxrl_agents.batches import EpisodeArrays, TrainBatch

    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 32, (B, T + 1)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    mask[:, 3:8], mask[:, 10:15] = 1.0, 1.0  # two assistant turns
    turns = np.where(mask > 0, (np.arange(T) >= 10).astype(np.int32)[None], -1).astype(np.int32)
    rewards = rng.normal(size=B).astype(np.float32)
    batch = TrainBatch(
        input_ids=ids[:, :-1],
        positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids=np.ones((B, T), np.int32),
        target_ids=ids[:, 1:],
        loss_mask=mask,
        old_logprobs=np.where(mask > 0, -3.4, 0.0).astype(np.float32),
        advantages=np.zeros((B, T), np.float32),
        returns=np.zeros((B, T), np.float32),
        turn_ids=turns,
    )
    episodes = EpisodeArrays(
        rewards=rewards,
        group_ids=np.repeat(np.arange(B // G), G).astype(np.int32),
        turn_rewards=np.stack([np.zeros(B, np.float32), rewards], 1),
        turn_mask=np.ones((B, 2), np.float32),
        anchor_ids=np.tile(np.array([0, -1], np.int32), (B, 1)),
        row_valid=np.ones((B,), np.float32),
    )
    return jax.tree.map(jnp.asarray, batch), jax.tree.map(jnp.asarray, episodes)


@pytest.mark.parametrize("loss", LOSS)
@pytest.mark.parametrize("adv", ADV)
def test_estimator_x_loss(adv, loss):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from toy_lm import ToyLM

    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.build import uses_critic
    from jaxrl_agents.jobs.system import effective_loss
    from jaxrl_agents.training.critic import attach_critic
    from jaxrl_agents.training.step import init_train_state
    from jaxrl_agents.training.update import make_rl_update

    cfg = to_run_config(compose("config", [f"advantage={adv}", f"loss={loss}"]))
    cfg.advantage.validate(group_size=G, has_turns=True, has_values=uses_critic(cfg.loss))
    model = ToyLM(rngs=nnx.Rngs(0))
    if uses_critic(cfg.loss):
        attach_critic(model, dim=16)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    before = jax.tree.map(np.asarray, params)
    tx = cfg.optimizer.build()
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=effective_loss(cfg.loss, cfg.rollout),
        adv_cfg=cfg.advantage,
        epochs=1,
        minibatches=2,
        microbatches=1,
        logprob_chunk=16,
    )
    ref = jax.tree.map(jnp.copy, params) if cfg.loss.kl_coef > 0 else None
    state = init_train_state(params, tx)
    for s in range(2):
        batch, episodes = _batch(s)
        state, m = update(state, batch, episodes, jax.random.key(s), ref)
        for name in ("loss", "pg_loss", "grad_norm", "adv_abs"):
            assert np.isfinite(float(getattr(m, name))), (name, m)
        assert int(m.skipped) == 0
        if uses_critic(cfg.loss):
            assert np.isfinite(float(m.vf_loss)) and np.isfinite(float(m.explained_variance))
    after = jax.tree.leaves(state.params)
    assert all(np.isfinite(np.asarray(x)).all() for x in after)
    moved = max(
        float(np.max(np.abs(np.asarray(a) - b)))
        for a, b in zip(after, jax.tree.leaves(before), strict=True)
    )
    assert moved > 0, "parameters did not change"
