"""Research env: BM25 vs a naive reference, oracle/wrong/uncited policies, splits."""

from __future__ import annotations

import asyncio
import math

import pytest

from jaxrl_agents.envs.base import drive
from jaxrl_agents.envs.research import (
    BM25Index,
    ResearchEnv,
    build_corpus,
    oracle_policy,
    tokenize,
    wrong_policy,
)
from jaxrl_agents.types import Ann


def _bm25_reference(docs, query, k1=1.5, b=0.75):
    toks = {i: tokenize(t) for i, t in docs.items()}
    n, avg = len(docs), sum(len(t) for t in toks.values()) / len(docs)
    out = {}
    for i, words in toks.items():
        s = 0.0
        for term in set(tokenize(query)):
            df = sum(term in w for w in toks.values())
            tf = words.count(term)
            if df and tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(words) / avg))
        if s > 0:
            out[i] = s
    return out


def test_bm25_matches_reference_and_finds_titles():
    corpus = build_corpus(0)
    docs = {i: f"{d['title']} {d['text']}" for i, d in corpus["docs"].items()}
    index = BM25Index(docs)
    for q in ["robotics company founded", "born in", corpus["companies"][0]["name"] + " river"]:
        ref = _bm25_reference(docs, q)
        got = index.scores(q)
        assert got.keys() == ref.keys()
        for i in ref:
            assert got[i] == pytest.approx(ref[i], rel=1e-12)
    for doc_id, d in corpus["docs"].items():
        assert index.search(d["title"], 1)[0][0] == doc_id


@pytest.mark.parametrize("max_hops", [2, 3])
def test_oracle_solves_and_wrong_or_uncited_fail(max_hops):
    for task in ResearchEnv.make_tasks("heldout", 15, max_hops=max_hops):
        verdict, messages, anns = asyncio.run(drive(ResearchEnv(), task, oracle_policy(task)))
        assert verdict.success and verdict.info[Ann.EVIDENCE_IN_ANSWER], messages
        assert len(task.data["evidence"]) >= 2 and verdict.info[Ann.MISSING_STEPS] == []
        assert anns[-1][Ann.EVIDENCE_COMPLETE]
        verdict, _, anns = asyncio.run(drive(ResearchEnv(), task, oracle_policy(task, cite=False)))
        assert not verdict.success and verdict.score == 0.5
        assert verdict.info[Ann.EVIDENCE_IN_ANSWER] is False
        verdict, _, anns = asyncio.run(drive(ResearchEnv(), task, wrong_policy(task)))
        assert not verdict.success and not anns[-1][Ann.EVIDENCE_COMPLETE]


def test_no_single_document_answers_a_question():
    corpus = build_corpus(0)
    for task in ResearchEnv.make_tasks("train", 60):
        company_doc = corpus["docs"][task.data["evidence"][0]]["text"]
        assert task.data["answer"] not in company_doc


def test_splits_disjoint_and_tool_errors():
    train = {t.data["key"] for t in ResearchEnv.make_tasks("train", 300, max_hops=3)}
    held = {t.data["key"] for t in ResearchEnv.make_tasks("heldout", 100, max_hops=3)}
    assert train.isdisjoint(held) and len(train) > 60 and len(held) > 10
    task = ResearchEnv.make_tasks("train", 1)[0]
    bad = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "a", "function": {"name": "open", "arguments": {"doc_id": "x9"}}},
            {"id": "b", "function": {"name": "search", "arguments": {"query": "a", "k": 50}}},
        ],
    }
    policy = iter([bad, {"role": "assistant", "content": "?"}])
    _, messages, _ = asyncio.run(drive(ResearchEnv(), task, lambda m: next(policy)))
    assert messages[3]["content"] == (
        "Error: unknown doc_id 'x9'; ids look like d012 (find them with search)"
    )
    assert messages[4]["content"] == "Error: k must be between 1 and 10, got 50"


def test_many_corpora_give_unmemorizable_splits():
    """``corpora=N``: questions from N corpora (each its own entities); the splits stay disjoint
    by question key, and every corpus's answer comes from that corpus."""
    from jaxrl_agents.envs.research import ResearchEnv

    keys = {}
    for split in ("train", "validation", "heldout"):
        tasks = ResearchEnv.make_tasks(split, 100_000, corpora=20)
        keys[split] = {t.data["key"] for t in tasks}
        seeds = {t.data["corpus_seed"] for t in tasks}
        assert seeds == set(range(20)), (split, sorted(seeds))
        for t in tasks[:30]:
            corpus = build_corpus(t.data["corpus_seed"])
            assert [corpus["docs"][e]["title"] for e in t.data["evidence"]] == t.data["chain"]
    assert not keys["train"] & keys["heldout"] and not keys["train"] & keys["validation"]
    one = {t.data["key"] for t in ResearchEnv.make_tasks("heldout", 100_000)}
    assert len(keys["heldout"]) > 10 * len(one)  # far more distinct held-out questions
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="corpora="):
            ResearchEnv.make_tasks("train", 1, corpora=bad)
