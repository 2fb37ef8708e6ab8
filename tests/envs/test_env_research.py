"""Research env: BM25 vs a naive reference, oracle/wrong/uncited policies, splits."""

from __future__ import annotations

import asyncio
import math
import re

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


@pytest.mark.parametrize("names", ["words", "numbered"])
@pytest.mark.parametrize("max_hops", [2, 3])
def test_oracle_solves_and_wrong_or_uncited_fail(max_hops, names):
    tasks = ResearchEnv.make_tasks("heldout", 15, max_hops=max_hops, corpora=5, names=names)
    for task in tasks:
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


def test_numbered_names_keep_the_facts_and_the_search():
    """``names="numbered"``: every entity is its kind and a number unique in its corpus ("Company
    417"), the corpus has the same documents and hops as with words, and searching a title finds
    its document first; the words corpus is what it was (pinned: the numbered path draws nothing
    from its random stream, so runs on made-up words keep their questions)."""
    for seed in range(4):
        words, numbered = build_corpus(seed), build_corpus(seed, "numbered")
        kinds = {"companies": "Company", "people": "Person", "cities": "City"}
        numbers = []
        for key, kind in kinds.items():
            got = [c["name"] for c in numbered[key]] if key == "companies" else list(numbered[key])
            assert all(re.fullmatch(rf"{kind} [1-9]\d\d", n) for n in got), got
            numbers += [n.split()[1] for n in got]
        assert all(re.fullmatch(r"Country [1-9]\d\d", n) for n in numbered["countries"])
        numbers += [n.split()[1] for n in numbered["countries"]]
        assert len(set(numbers)) == len(numbers) == 104
        assert len(numbered["docs"]) == len(words["docs"]) == 96  # 36 + 36 + 24 documents
        index = BM25Index({i: f"{d['title']} {d['text']}" for i, d in numbered["docs"].items()})
        for doc_id, d in numbered["docs"].items():
            assert index.search(d["title"], 1)[0][0] == doc_id, d["title"]
    zero = build_corpus(0)
    assert (zero["companies"][0]["name"], zero["docs"]["d000"]["title"]) == (
        "Zupu Group",
        "Fevor Daifa",
    )
    task = ResearchEnv.make_tasks("train", 1, names="numbered")[0]
    assert re.fullmatch(r"Company [1-9]\d\d", task.data["chain"][0])
    assert task.data["chain"][0] in task.data["question"] and task.data["names"] == "numbered"
    for bad in ("Words", "numbers", None, 3):
        with pytest.raises(ValueError, match="names=.*words, numbered"):
            ResearchEnv.make_tasks("train", 1, names=bad)
