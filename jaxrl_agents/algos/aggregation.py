"""Per-sequence reductions and the four published loss-aggregation modes, shared by the policy
losses (``algos.losses``) and the rollout correction (``algos.correction``).

Aggregation (``LossConfig.agg_mode``), with ``m`` the mask, ``n_i = sum_t m_it`` and ``S`` the
number of sequences that have at least one sampled token:

* ``token-mean``               ``sum_it m x / sum_it m``                 (DAPO; every token equal)
* ``seq-mean-token-sum``       ``sum_it m x / S``
* ``seq-mean-token-mean``      ``(1/S) sum_i (sum_t m x) / n_i``        (original GRPO, GSPO)
* ``seq-mean-token-sum-norm``  ``sum_it m x / (S * max_len)``           (Dr. GRPO's constant;
  ``max_len`` = ``LossConfig.max_len_norm`` or ``T``. verl once divided by ``T`` only; the extra
  ``1/S`` matches the Dr. GRPO paper's listing and is a constant factor for fixed batch size.)

Every mode is ``numerator / denominator``; pass ``denominator=aggregation_denominator(full_mask,
...)`` when a batch is split into micro-batches so the summed micro-batch losses equal the
full-batch loss.

Packed rows (``rollout.packing``): a row may hold several trajectories, told apart by
``segment_ids`` (``1, 2, ...`` per row, 0 = padding). Pass ``segment_ids`` and every per-sequence
quantity (``S``, ``n_i``, GSPO's sequence ratio, the ``*_seq`` / ``mis_geo`` corrections) is per
segment, so a packed batch gives the same loss and gradients as one trajectory per row. Without
``segment_ids`` a row is one sequence.

Numerics: every importance log-ratio is clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` (20)
before ``exp`` (:func:`clamp_log_ratio`), with the gradient flowing only inside the range (verl
``core_algos`` ``compute_policy_loss``: ``torch.clamp(negative_approx_kl, -20, 20)``), so one
token whose old logprob is far below its new one cannot overflow ``exp`` and turn the whole
gradient into NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOG_RATIO_BOUND = 20.0
"""Importance log-ratios are clamped to +-this before exp (verl: 20; exp(20) ~ 4.9e8)."""


# -- aggregation ------------------------------------------------------------------------------


def sequence_table(x: Array, segment_ids: Array) -> tuple[Array, Array]:
    """Per-sequence sums of ``x: Float['B T']`` over the sequences ``(row, segment id)`` of
    ``segment_ids: Int['B T']``: ``(Float['B*(T+1)'] sums, Int['B T'] each position's entry)``.
    Entry ``b*(T+1)`` collects row ``b``'s padding (segment 0)."""
    B, T = x.shape
    seg = jnp.clip(segment_ids, 0, T)
    ids = jnp.arange(B, dtype=seg.dtype)[:, None] * (T + 1) + seg
    tot = jax.ops.segment_sum(x.reshape(-1), ids.reshape(-1), num_segments=B * (T + 1))
    return tot, ids


def sequence_sum(x: Array, segment_ids: Array | None = None) -> Array:
    """``Float['B T']``: at every position, the sum of ``x`` over its sequence (the row without
    ``segment_ids``)."""
    if segment_ids is None:
        return jnp.broadcast_to(x.sum(-1, keepdims=True), x.shape)
    tot, ids = sequence_table(x, segment_ids)
    return tot[ids]


def _num_seqs(mask: Array, segment_ids: Array | None = None) -> Array:
    if segment_ids is None:
        n = (mask.sum(-1) > 0).sum()
    else:
        n = (sequence_table(mask, segment_ids)[0] > 0).sum()
    return jnp.maximum(n.astype(mask.dtype), 1.0)


def aggregation_denominator(
    mask: Array, mode: str, *, max_len: int | None = None, segment_ids: Array | None = None
) -> Array:
    """The scalar a mode divides by, for ``mask: Float['B T']`` (see the module docstring);
    sequences are the segments of ``segment_ids`` when given, else the rows."""
    if mode == "token-mean":
        return jnp.maximum(mask.sum(), 1.0)
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return _num_seqs(mask, segment_ids)
    if mode == "seq-mean-token-sum-norm":
        return _num_seqs(mask, segment_ids) * float(max_len or mask.shape[-1])
    raise ValueError(f"unknown agg_mode {mode!r}; valid: {', '.join(AGG_MODES)}")


def aggregate(
    x: Array,
    mask: Array,
    mode: str,
    *,
    max_len: int | None = None,
    denominator: Array | None = None,
    segment_ids: Array | None = None,
) -> Array:
    """Reduce per-token ``x: Float['B T']`` to a scalar by ``mode`` (only masked entries count);
    sequences are the segments of ``segment_ids`` when given, else the rows."""
    denom = (
        aggregation_denominator(mask, mode, max_len=max_len, segment_ids=segment_ids)
        if denominator is None
        else denominator
    )
    xm = jnp.where(mask > 0, x, 0.0)
    if mode == "seq-mean-token-mean":
        if segment_ids is None:
            num = (xm.sum(-1) / jnp.maximum(mask.sum(-1), 1.0)).sum()
        else:
            sums, _ = sequence_table(xm, segment_ids)
            counts, _ = sequence_table(mask, segment_ids)
            num = (sums / jnp.maximum(counts, 1.0)).sum()
    else:
        num = xm.sum()
    return num / denom


def masked_mean(x: Array, mask: Array) -> Array:
    """Mean of ``x`` over the positions where ``mask > 0`` (0 when there are none)."""
    return jnp.where(mask > 0, x, 0.0).sum() / jnp.maximum(mask.sum(), 1.0)


def clamp_log_ratio(log_ratio: Array) -> Array:
    """``log_ratio`` clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]``; the gradient is the
    identity inside the range and 0 outside (so ``exp`` of it is finite and so is its gradient)."""
    return jnp.clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
