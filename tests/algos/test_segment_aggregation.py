"""Per-segment reductions: the same sequences one per row or packed into shared rows give the same
aggregates, GSPO sequence ratios and sequence-level mismatch corrections."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_agents.algos import AGG_MODES, LossConfig, aggregate, aggregation_denominator
from jaxrl_agents.algos.aggregation import sequence_sum
from jaxrl_agents.algos.correction import rollout_correction
from jaxrl_agents.algos.losses import POLICY_LOSSES

LENGTHS = [5, 3, 7, 2, 6, 4]
PLACE = [(0, 0), (0, 5), (1, 0), (1, 7), (2, 0), (2, 6)]  # (row, offset) in rows of 10


def _layouts(seed=0):
    """``(flat, packed)`` dicts of the same per-token arrays (mask with one empty sequence)."""
    rng = np.random.default_rng(seed)
    n, T = len(LENGTHS), max(LENGTHS)
    flat = {k: np.zeros((n, T), np.float32) for k in ("x", "m", "lp", "old", "adv")}
    flat["seg"] = np.zeros((n, T), np.int32)
    packed = {k: np.zeros((3, 10), np.float32) for k in ("x", "m", "lp", "old", "adv")}
    packed["seg"] = np.zeros((3, 10), np.int32)
    for i, L in enumerate(LENGTHS):
        vals = {
            "x": rng.normal(size=L),
            "m": (rng.random(L) < 0.7).astype(np.float32) * (i != 3),  # sequence 3: no tokens
            "lp": rng.normal(-2, 0.5, L),
            "old": rng.normal(-2, 0.5, L),
            "adv": np.full(L, rng.normal()),
        }
        r, o = PLACE[i]
        k = sum(1 for j in range(i) if PLACE[j][0] == r) + 1
        for key, v in vals.items():
            flat[key][i, :L] = v
            packed[key][r, o : o + L] = v
        flat["seg"][i, :L] = 1
        packed["seg"][r, o : o + L] = k
    return {k: jnp.asarray(v) for k, v in flat.items()}, {
        k: jnp.asarray(v) for k, v in packed.items()
    }


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_per_segment_equals_per_row(mode):
    f, p = _layouts()
    a = aggregate(f["x"], f["m"], mode, max_len=16)  # rows: the old path
    b = aggregate(p["x"], p["m"], mode, max_len=16, segment_ids=p["seg"])
    assert float(b) == pytest.approx(float(a), rel=1e-6)
    d_flat = aggregation_denominator(f["m"], mode, max_len=16, segment_ids=f["seg"])
    d_pack = aggregation_denominator(p["m"], mode, max_len=16, segment_ids=p["seg"])
    assert (
        float(d_flat) == float(d_pack) == float(aggregation_denominator(f["m"], mode, max_len=16))
    )
    if mode != "token-mean":
        assert float(d_pack) == 5 * (16 if mode.endswith("norm") else 1)  # one sequence is empty
    # without segment ids a packed row would be one sequence: a different number
    if mode.startswith("seq"):
        assert float(aggregate(p["x"], p["m"], mode, max_len=16)) != pytest.approx(float(a))


def test_sequence_sum_broadcasts_each_segments_total():
    f, p = _layouts()
    s = np.asarray(sequence_sum(p["x"], p["seg"]))
    for i, L in enumerate(LENGTHS):
        r, o = PLACE[i]
        np.testing.assert_allclose(s[r, o : o + L], float(f["x"][i].sum()), rtol=1e-6)


@pytest.mark.parametrize("name", ["gspo", "ppo_clip", "cispo"])
def test_policy_loss_token_values_per_segment(name):
    f, p = _layouts(1)
    cfg = LossConfig(name=name, clip_low=3e-4, clip_high=4e-4) if name == "gspo" else LossConfig()
    kw = lambda d: dict(
        logprobs=d["lp"], old_logprobs=d["old"], advantages=d["adv"], loss_mask=d["m"], cfg=cfg
    )
    fn = POLICY_LOSSES[name]
    extra = {"segment_ids": p["seg"]} if name == "gspo" else {}
    a, b = fn(**kw(f)), fn(**kw(p), **extra)
    for i, L in enumerate(LENGTHS):
        r, o = PLACE[i]
        m = np.asarray(f["m"][i, :L]) > 0
        np.testing.assert_allclose(
            np.asarray(b.ratio)[r, o : o + L][m], np.asarray(a.ratio)[i, :L][m], rtol=1e-6
        )
        np.testing.assert_allclose(
            np.asarray(b.loss)[r, o : o + L][m], np.asarray(a.loss)[i, :L][m], rtol=1e-6
        )


@pytest.mark.parametrize("mode", ["tis_seq", "mis_seq", "mis_geo", "tis_token"])
def test_sequence_corrections_per_segment(mode):
    f, p = _layouts(2)
    cap = 1.3 if mode == "mis_geo" else 3.0
    a = rollout_correction(f["lp"], f["old"], f["m"], mode=mode, cap=cap)
    b = rollout_correction(p["lp"], p["old"], p["m"], mode=mode, cap=cap, segment_ids=p["seg"])
    for name in ("weight_mean", "mismatch_kl"):
        assert float(getattr(b, name)) == pytest.approx(float(getattr(a, name)), rel=1e-6)
    arr_a = a.weights if a.weights is not None else a.keep
    arr_b = b.weights if b.weights is not None else b.keep
    for i, L in enumerate(LENGTHS):
        r, o = PLACE[i]
        np.testing.assert_allclose(
            np.asarray(arr_b)[r, o : o + L], np.asarray(arr_a)[i, :L], rtol=1e-6
        )
