"""The critic: a value head on the policy's trunk.

``attach_critic(model)`` adds ``model.value_head`` (a ``D -> 1`` linear map, zero-initialised so
the first values are 0 and GAE starts as Monte-Carlo returns); :func:`values` reads it over the
policy's hidden states. Its parameters are ``nnx.Param`` leaves of the policy, so they are trained
by the same optimizer, checkpointed and restored with it; the sampler and the Hugging Face export
ignore them (neither reads ``value_head``).

Trade-off, chosen for this system: a head on the shared trunk costs one ``D``-vector per token
on top of the forward pass the policy loss already runs, and no second model in memory or in the
sampler. Its gradient (scaled by ``loss.vf_coef``) also shapes the trunk's features, which can
interfere with the policy (the reason verl and OpenRLHF train a separate critic model at scale);
a separate critic would double the forward/backward cost here.

Alignment: ``values[b, t]`` is the value of the state after input token ``t`` (it predicts the
return from token ``t + 1`` onwards), indexed like ``loss_mask`` and ``advantages``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

ATTR = "value_head"


class ValueHead(nnx.Module):
    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.proj = nnx.Linear(
            dim, 1, kernel_init=nnx.initializers.zeros, bias_init=nnx.initializers.zeros, rngs=rngs
        )

    def __call__(self, hidden: jax.Array) -> jax.Array:
        return self.proj(hidden.astype(jnp.float32))[..., 0]


def attach_critic(model, *, seed: int = 0, dim: int | None = None):
    """Add a zero-initialised value head to ``model`` (in place; ``dim``: the trunk's width,
    default ``model.cfg.hidden_size``); returns it."""
    if not hasattr(model, ATTR):
        dim = dim or model.cfg.hidden_size
        setattr(model, ATTR, ValueHead(dim, rngs=nnx.Rngs(seed)))
    return model


def has_critic(model) -> bool:
    return hasattr(model, ATTR)


def values(model, hidden: jax.Array) -> jax.Array:
    """``Float['B T']`` values over ``hidden: Float['B T D']``."""
    return getattr(model, ATTR)(hidden)


def without_critic(model):
    """``model`` without its value head (a copy when it has one): what gets exported."""
    if not has_critic(model):
        return model
    clone = nnx.clone(model)
    delattr(clone, ATTR)
    return clone
