"""Dr. GRPO's loss scale does not follow the length bucket: with ``max_len_norm: null`` the job
uses the episode's generation budget, so the same episodes give the same loss whether they are
padded to 128 or to 256 positions."""

import jax.numpy as jnp
import numpy as np

from jaxrl_agents.algos import aggregate


def test_null_max_len_norm_is_the_generation_budget_not_the_bucket():
    from jaxrl_agents.cli.app import compose
    from jaxrl_agents.cli.train import to_run_config
    from jaxrl_agents.jobs.system import effective_loss

    cfg = to_run_config(compose("config", ["loss=dr_grpo", "loss.max_len_norm=null"]))
    loss = effective_loss(cfg.loss, cfg.rollout)
    assert cfg.loss.max_len_norm is None
    assert loss.max_len_norm == cfg.rollout.max_turns * cfg.rollout.max_new_tokens == 192
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 100)).astype(np.float32)
    m = (rng.random((4, 100)) < 0.5).astype(np.float32)
    pad = lambda a, t: jnp.asarray(np.pad(a, ((0, 0), (0, t - a.shape[1]))))
    values = [
        float(aggregate(pad(x, t), pad(m, t), loss.agg_mode, max_len=loss.max_len_norm))
        for t in (128, 256)
    ]
    assert values[0] == values[1]
    # with the padded length instead (the old default), the scale halves between the buckets
    old = [float(aggregate(pad(x, t), pad(m, t), loss.agg_mode, max_len=None)) for t in (128, 256)]
    assert abs(old[0] / old[1] - 2.0) < 1e-5
