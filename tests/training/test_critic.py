"""The critic learns: on a batch whose return is predictable from the prompt (its first token
decides +1 or -1), the value loss falls and the explained variance of the critic's values passes
0.5 within 40 RL updates (token-level GAE, PPO with the clipped-value term's vf_coef 0.5)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_agents.algos import AdvantageConfig, LossConfig
from jaxrl_agents.batches import EpisodeArrays, TrainBatch
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.training.critic import attach_critic, has_critic, without_critic
from jaxrl_agents.training.logprobs import token_stats
from jaxrl_agents.training.step import OptimizerConfig, init_train_state
from jaxrl_agents.training.update import make_rl_update

B, T = 16, 16


def _model():
    cfg = ModelConfig.from_hf_config(
        {
            "model_type": "qwen2",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 64,
            "tie_word_embeddings": True,
        }
    )
    return attach_critic(Transformer(cfg, rngs=nnx.Rngs(0)))


def _batch(model):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, (B, T + 1)).astype(np.int32)
    ids[:, 0] = np.where(np.arange(B) % 2 == 0, 3, 4)  # the prompt's first token: the outcome
    mask = np.zeros((B, T), np.float32)
    mask[:, 4:] = 1.0
    stats = token_stats(
        model,
        jnp.asarray(ids[:, :-1]),
        jnp.tile(jnp.arange(T), (B, 1)),
        jnp.ones((B, T), jnp.int32),
        jnp.asarray(ids[:, 1:]),
        chunk=16,
        with_entropy=False,
    )
    batch = TrainBatch(
        input_ids=ids[:, :-1],
        positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        segment_ids=np.ones((B, T), np.int32),
        target_ids=ids[:, 1:],
        loss_mask=mask,
        old_logprobs=np.asarray(stats.logprobs) * mask,
        advantages=np.zeros((B, T), np.float32),
        returns=np.zeros((B, T), np.float32),
        turn_ids=np.where(mask > 0, 0, -1).astype(np.int32),
    )
    rewards = np.where(ids[:, 0] == 3, 1.0, -1.0).astype(np.float32)
    episodes = EpisodeArrays(
        rewards=rewards,
        group_ids=np.arange(B, dtype=np.int32),
        turn_rewards=rewards[:, None],
        turn_mask=np.ones((B, 1), np.float32),
        anchor_ids=np.full((B, 1), -1, np.int32),
        row_valid=np.ones((B,), np.float32),
    )
    return jax.tree.map(jnp.asarray, batch), jax.tree.map(jnp.asarray, episodes)


def test_value_loss_falls_and_explained_variance_passes_half():
    model = _model()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = OptimizerConfig(lr=1e-2, warmup_steps=0).build()
    update = make_rl_update(
        graphdef,
        rest,
        tx,
        loss_cfg=LossConfig(name="ppo_clip", vf_coef=0.5, vf_clip=None),
        adv_cfg=AdvantageConfig(name="gae", gamma=1.0, lam=0.95),
        epochs=1,
        minibatches=1,
        microbatches=1,
        logprob_chunk=16,
    )
    batch, episodes = _batch(model)
    state = init_train_state(params, tx)
    ev, vf = [], []
    for s in range(40):
        state, m = update(state, batch, episodes, jax.random.key(s), None)
        ev.append(float(m.explained_variance))
        vf.append(float(m.vf_loss))
    assert ev[0] < 0.05  # zero-initialised head: values 0 at the start
    assert max(ev) > 0.5, ev
    first = next(i for i, e in enumerate(ev) if e > 0.5)
    assert first < 40 and vf[-1] < vf[0] / 4, (first, vf[0], vf[-1])
    assert all(np.isfinite(ev)) and all(np.isfinite(vf))


def test_export_view_has_no_critic():
    model = _model()
    assert has_critic(model) and not has_critic(without_critic(model)) and has_critic(model)
