"""Sampling correctness against plain-Python reference distributions (chi-square), key handling."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxrl_agents.generation.sampling import SlotSampling, filter_logits, sample

LOGITS = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]
N = 6000


def reference_probs(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """HF-order filters with plain Python loops: temperature, top-k, top-p, min-p."""
    scaled = [x / temperature for x in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    keep = order[:top_k] if top_k else list(order)

    def softmax(ids):
        m = max(scaled[i] for i in ids)
        z = sum(math.exp(scaled[i] - m) for i in ids)
        return {i: math.exp(scaled[i] - m) / z for i in ids}

    p = softmax(keep)
    kept, mass = [], 0.0
    for i in keep:  # descending
        if mass >= top_p:
            break
        kept.append(i)
        mass += p[i]
    p = softmax(kept)
    pmax = max(p.values())
    kept = [i for i in kept if p[i] >= min_p * pmax]
    p = softmax(kept)
    return np.array([p.get(i, 0.0) for i in range(len(logits))])


def draw(n, *, seed=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, logits=LOGITS):
    params = SlotSampling(
        seed=jnp.full((n,), seed, jnp.uint32),
        temperature=jnp.full((n,), temperature, jnp.float32),
        top_k=jnp.full((n,), top_k, jnp.int32),
        top_p=jnp.full((n,), top_p, jnp.float32),
        min_p=jnp.full((n,), min_p, jnp.float32),
    )
    # Same seed, distinct positions: distinct keys, so rows are independent draws.
    out = jax.jit(sample)(
        jnp.tile(jnp.asarray(logits, jnp.float32), (n, 1)), params, jnp.arange(n, dtype=jnp.int32)
    )
    return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=1.0),
        dict(temperature=0.7),
        dict(temperature=1.5, top_k=3),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=0.9, min_p=0.2),
        dict(temperature=1.2, top_k=5, top_p=0.9, min_p=0.05),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_empirical_frequencies_match_reference(kw):
    expected = reference_probs(LOGITS, **kw)
    out = draw(N, **kw)
    counts = np.bincount(out.token, minlength=len(LOGITS))
    support = expected > 0
    assert counts[~support].sum() == 0, f"filtered-out tokens sampled: {counts}"
    _, pvalue = chisquare(counts[support], N * expected[support])
    assert pvalue > 1e-3, (counts, N * expected)
    # Policy logprob: T=1 unfiltered; sampling logprob: under the filtered distribution.
    policy = jax.nn.log_softmax(jnp.asarray(LOGITS))
    np.testing.assert_allclose(out.logprob, np.asarray(policy)[out.token], atol=1e-5)
    np.testing.assert_allclose(out.sampling_logprob, np.log(expected[out.token]), atol=1e-5)


def test_greedy_and_mixed_rows():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 50)), jnp.float32)
    params = SlotSampling(
        seed=jnp.arange(4, dtype=jnp.uint32),
        temperature=jnp.asarray([0.0, 1.0, 0.0, 0.5]),
        top_k=jnp.asarray([0, 0, 5, 2]),
        top_p=jnp.ones(4),
        min_p=jnp.zeros(4),
    )
    out = jax.jit(sample)(logits, params, jnp.zeros(4, jnp.int32))
    am = np.argmax(np.asarray(logits), -1)
    assert out.token[0] == am[0] and out.token[2] == am[2]
    assert out.sampling_logprob[0] == 0.0
    top2 = np.argsort(-np.asarray(logits[3]))[:2]
    assert int(out.token[3]) in top2
    all_greedy = params._replace(temperature=jnp.zeros(4))
    np.testing.assert_array_equal(
        jax.jit(sample)(logits, all_greedy, jnp.zeros(4, jnp.int32)).token, am
    )


def test_same_seed_same_tokens_and_batch_independence():
    a = draw(64, seed=7, temperature=1.0, top_p=0.9)
    b = draw(64, seed=7, temperature=1.0, top_p=0.9)
    c = draw(64, seed=8, temperature=1.0, top_p=0.9)
    np.testing.assert_array_equal(a.token, b.token)
    assert (a.token != c.token).any()
    # Row 5 alone (position 5) draws what it drew inside the batch of 64.
    one = jax.jit(sample)(
        jnp.asarray([LOGITS], jnp.float32),
        SlotSampling(
            seed=jnp.asarray([7], jnp.uint32),
            temperature=jnp.ones(1),
            top_k=jnp.zeros(1, jnp.int32),
            top_p=jnp.full((1,), 0.9),
            min_p=jnp.zeros(1),
        ),
        jnp.asarray([5], jnp.int32),
    )
    assert int(one.token[0]) == int(a.token[5])


def test_filter_support_matches_reference_on_a_large_vocab():
    """The bisection thresholds keep exactly the reference's tokens (random rows, V=1000)."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(12, 1000)) * rng.uniform(0.5, 4, size=(12, 1))
    kws = [
        dict(
            temperature=float(rng.uniform(0.5, 1.5)),
            top_k=int(rng.choice([0, 1, 7, 300])),
            top_p=float(rng.choice([1.0, 0.9, 0.5, 0.05])),
            min_p=float(rng.choice([0, 0.1])),
        )
        for _ in range(12)
    ]
    params = SlotSampling(
        seed=jnp.zeros(12, jnp.uint32),
        **{
            k: jnp.asarray([kw[k] for kw in kws])
            for k in ("temperature", "top_k", "top_p", "min_p")
        },
    )
    scaled = jnp.asarray(logits, jnp.float32) / params.temperature[:, None]
    masked = np.asarray(
        filter_logits(scaled, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    )
    for row, kw in zip(range(12), kws, strict=True):
        expected = reference_probs(logits[row].astype(np.float32).tolist(), **kw)
        np.testing.assert_array_equal(np.isfinite(masked[row]), expected > 0, err_msg=str(kw))


def test_multi_block_inverse_cdf():
    """V=300 spans three 128-token blocks of the two-level inverse CDF."""
    logits = np.full(300, -6.0)  # the tail holds ~0.6% of the mass: a bin of its own
    where = [5, 127, 128, 200, 255, 256, 290, 299]
    logits[where] = LOGITS
    expected = reference_probs(logits.tolist(), temperature=0.8)
    out = draw(N, temperature=0.8, logits=logits.tolist())
    counts = np.bincount(out.token, minlength=300)
    tail = np.setdiff1d(np.arange(300), where)
    obs = np.append(counts[where], counts[tail].sum())
    exp = np.append(expected[where], expected[tail].sum()) * N
    _, pvalue = chisquare(obs, exp)
    assert pvalue > 1e-3, (obs, exp)
