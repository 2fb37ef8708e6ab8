"""A toy NNX language model with the policy's interface (``hidden_states`` +
``logits_from_hidden``), for train-step tests independent of the decoder."""

import jax.numpy as jnp
from flax import nnx


class ToyLM(nnx.Module):
    def __init__(self, vocab=32, dim=16, *, rngs):
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.mix = nnx.Linear(dim, dim, rngs=rngs)
        self.head = nnx.Linear(dim, vocab, rngs=rngs)

    def hidden_states(self, tokens, positions, *, segment_ids=None, cache=None):
        h = self.embed(tokens)
        # causal running mean: position t sees tokens <= t
        h = jnp.cumsum(h, axis=1) / (1.0 + positions[..., None])
        return jnp.tanh(self.mix(h)), None

    def logits_from_hidden(self, h):
        return self.head(h)
