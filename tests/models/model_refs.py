"""Reference helpers for the model tests: tiny random HF checkpoints of each family, ragged batches.

The reference checkpoints are built with transformers' PyTorch classes (``torch.manual_seed``),
their norm weights and biases perturbed so that a swapped or dropped mapping shows in the logits.
"""

from __future__ import annotations

import numpy as np

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,  # larger than default so logits are O(1) and differences meaningful
)
FAMILIES = ("llama3", "qwen2", "qwen3")


def hf_config(family: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if family == "llama3":
        scaling = dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8,  # small so all three bands hit head_dim=16
        )
        return LlamaConfig(**TINY, rope_theta=500000.0, rope_scaling=scaling)
    if family == "qwen2":
        return Qwen2Config(**TINY, rope_theta=1e6)
    if family == "qwen3":
        # head_dim * heads (128) != hidden (64), as in real Qwen3 checkpoints.
        return Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=True)
    raise ValueError(family)


def build_hf_model(family: str, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def ragged_batch(vocab: int = 128, seed: int = 0):
    """Tokens/positions/segment_ids [3, 10]: left-padded, right-padded and full rows."""
    rng = np.random.RandomState(seed)
    T = 10
    tokens = rng.randint(0, vocab, (3, T)).astype(np.int32)
    seg = np.ones((3, T), np.int32)
    seg[0, :3] = 0  # left padding
    seg[1, -2:] = 0  # right padding
    positions = np.maximum(np.cumsum(seg, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, seg


def hf_logits(model, tokens, positions, seg) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(seg != 0, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def jax_logits(model, tokens, positions, seg) -> np.ndarray:
    from flax import nnx

    @nnx.jit
    def fwd(m, t, p, s):
        return m(t, p, segment_ids=s)[0]

    return np.asarray(fwd(model, tokens, positions, seg))
