"""``research``: multi-hop questions over a generated corpus with ``search`` and ``open`` tools.

The corpus (:mod:`jaxrl_agents.envs.research.corpus`, deterministic in ``corpus_seed``) has ~100
short documents about fictional companies, people and cities; no single document answers a
question. Questions:

* ``founder_city`` (2 hops): "In which city was the founder of X born?" -> company, person;
* ``hq_country`` (2 hops): "In which country is X headquartered?" -> company, city;
* ``founder_country`` (3 hops, with ``max_hops=3``): company, person, city.

``search(query, k)`` ranks documents with an in-process Okapi BM25 index (:class:`BM25Index`) and
shows ids, titles and a short snippet; ``open(doc_id)`` shows a whole document. Opening an evidence
document is a required step (``open:d012``). The answer must name the right entity (and no other
entity of that kind) and cite every evidence document as ``[d012]``; a correct answer without the
citations scores 0.5 and is not a success (``EVIDENCE_IN_ANSWER`` False: context lost).
"""

from __future__ import annotations

import random
import re
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, mentions, split_of
from jaxrl_agents.envs.research.corpus import (
    _check_names,
    _corpus_of,
    _index,
    _question_pool,
    build_corpus,
)
from jaxrl_agents.envs.research.index import BM25Index
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.types import Ann, Task, Verdict

_CITE = re.compile(r"\[(d\d{3})\]")


class ResearchEnv(Env):
    """Search-and-read questions; success iff the answer is right and cites its evidence."""

    name = "research"

    def __init__(
        self, *, snippet_words: int = 5, config: EnvConfig | None = None, **env_kwargs: Any
    ):
        super().__init__(config=config, **env_kwargs)
        # Short snippets: the facts sit past the first words, so reading needs ``open``.
        self.snippet_words = snippet_words
        self._corpus: dict[str, Any] = {}
        self._index: BM25Index | None = None
        self._opened: list[str] = []

    @classmethod
    def make_tasks(
        cls,
        split: str,
        n: int,
        *,
        seed: int = 0,
        corpus_seed: int = 0,
        corpora: int = 1,
        names: str = "words",
        max_hops: int = 2,
        heldout_frac: float = 0.2,
    ) -> list[Task]:
        """``n`` questions of ``split`` (repeating once the split's pool is used up).

        ``corpora``: questions from the corpora ``corpus_seed .. corpus_seed + corpora - 1``
        (each its own companies, people and places). One corpus has 36 companies, so a split
        holds a few dozen questions whose entities a small model can memorize; with many corpora
        the entities are too many, and a policy must copy them from the question. ``names``
        (:data:`NAMES`): how the entities are named, made-up words or numbered."""
        check_split(split)
        if max_hops not in (2, 3):
            raise ValueError(f"max_hops must be 2 or 3, got {max_hops}")
        if isinstance(corpora, bool) or not isinstance(corpora, int) or corpora < 1:
            raise ValueError(f"corpora={corpora!r}: expected an integer >= 1")
        _check_names(names)
        pool = [
            q
            for cs in range(corpus_seed, corpus_seed + corpora)
            for q in _question_pool(cs, max_hops, names)
            if split_of(q["key"], heldout_frac=heldout_frac) == split
        ]
        random.Random(f"research/{seed}/{split}").shuffle(pool)
        return [
            Task(
                id=f"research-{split}-{seed}-{i:05d}",
                env=cls.name,
                split=split,
                data=dict(pool[i % len(pool)]),
            )
            for i in range(n)
        ]

    def system_prompt(self, task: Task) -> str:
        return (
            "Answer using the document collection: search it, open documents to read them, then "
            "reply with the answer and cite every document you used as [doc_id]."
        )

    def setup(self, task: Task, seed: int) -> None:
        which = _corpus_of(task)
        self._corpus, self._index = build_corpus(*which), _index(*which)
        self._opened = []

    @tool
    def search(self, query: str, k: int = 5) -> str:
        """Search the documents; returns ids, titles and snippets.

        Args:
            query: keywords, e.g. a name.
            k: how many results (1-10).
        """
        if not 1 <= k <= 10:
            raise ToolError(f"k must be between 1 and 10, got {k}")
        hits = self._index.search(query, k)
        if not hits:
            return "No results."
        docs = self._corpus["docs"]
        lines = []
        for doc_id, _ in hits:
            d = docs[doc_id]
            snippet = " ".join(d["text"].split()[: self.snippet_words])
            lines.append(f"[{doc_id}] {d['title']}: {snippet}...")
        return "\n".join(lines)

    @tool(name="open")
    def open_doc(self, doc_id: str) -> str:
        """Read a whole document.

        Args:
            doc_id: the id shown by search, e.g. d012.
        """
        doc_id = doc_id.strip().strip("[]")
        d = self._corpus["docs"].get(doc_id)
        if d is None:
            raise ToolError(
                f"unknown doc_id {doc_id!r}; ids look like d012 (find them with search)"
            )
        if doc_id not in self._opened:
            self._opened.append(doc_id)
            self._completed.add(f"open:{doc_id}")
        return f"[{doc_id}] {d['title']}\n{d['text']}"

    def state_digest(self) -> Any:
        """Privileged anchors (``EnvConfig.privileged_anchors``): the ids of the documents opened
        so far. Env-internal but not derived from the ground truth; it drops the searches and
        their results, which the observed state keeps."""
        return sorted(self._opened)

    def judge(self, answer: str | None) -> Verdict:
        d = self.task.data
        text = answer or ""
        cands = self._corpus[d["answer_kind"]]
        correct = mentions(text, d["answer"]) and not any(
            mentions(text, c) for c in cands if c != d["answer"]
        )
        cited = set(_CITE.findall(text))
        cites_all = set(d["evidence"]) <= cited
        return Verdict(
            success=correct and cites_all,
            score=1.0 if correct and cites_all else 0.5 if correct else 0.0,
            info={
                Ann.EXPECTED: d["answer"],
                Ann.ANSWER: answer,
                Ann.EVIDENCE_IN_ANSWER: cites_all,
                "cited": sorted(cited),
                "evidence": d["evidence"],
            },
        )
