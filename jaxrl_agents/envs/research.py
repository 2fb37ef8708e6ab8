"""``research``: multi-hop questions over a generated corpus with ``search`` and ``open`` tools.

The corpus (deterministic in ``corpus_seed``) has ~100 short documents about fictional companies,
people and cities. Facts are spread so no single document answers a question: a company's document
names its founder and headquarters city, a person's document their birthplace, a city's document
its country. Questions:

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

import functools
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_kinds, check_split, mentions, split_of
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.types import Ann, Message, Task, Verdict

_ONSET = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st")
_VOWEL = ("a", "e", "i", "o", "u", "ai", "or")
_INDUSTRY = ("robotics", "shipping", "textile", "software", "brewing", "aerospace", "mining")
_PROFESSION = ("engineer", "archivist", "architect", "economist", "editor", "geologist")
_SUFFIX = ("Labs", "Works", "Systems", "Group", "Industries")
_CITE = re.compile(r"\[(d\d{3})\]")


# -- ranked index --------------------------------------------------------------------------------


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25Index:
    """Okapi BM25 over a fixed document set (``k1``, ``b`` as in Robertson & Zaragoza 2009).

    ``score(q, d) = sum_{t in set(q)} idf(t) tf(t,d) (k1+1) / (tf(t,d) + k1 (1-b + b |d|/avgdl))``
    with ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))``. Ties rank by doc id.
    """

    def __init__(self, docs: dict[str, str], *, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.ids = sorted(docs)
        self.tf = {i: Counter(tokenize(docs[i])) for i in self.ids}
        self.len = {i: sum(self.tf[i].values()) for i in self.ids}
        self.avgdl = sum(self.len.values()) / max(1, len(self.ids))
        df = Counter(t for i in self.ids for t in self.tf[i])
        n = len(self.ids)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> dict[str, float]:
        terms = set(tokenize(query)) & self.idf.keys()
        out = {}
        for i in self.ids:
            tf, norm = self.tf[i], self.k1 * (1 - self.b + self.b * self.len[i] / self.avgdl)
            s = sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if tf[t])
            if s > 0:
                out[i] = s
        return out

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        return sorted(self.scores(query).items(), key=lambda x: (-x[1], x[0]))[:k]


# -- corpus --------------------------------------------------------------------------------------


NAMES = ("words", "numbered")
"""How ``build_corpus`` names its companies, people, cities and countries: ``words``, made-up
words ("Zage Labs", "Tamo Rive", "Storbai"); ``numbered``, the kind and a number ("Company 417",
"Person 258", "City 731", "Country 264"): the same kinds of facts and the same hops, with names a
policy that copies digits can copy."""


def _check_names(names: Any) -> None:
    if names not in NAMES:
        raise ValueError(f"names={names!r}: expected one of {', '.join(NAMES)}")


@functools.lru_cache(maxsize=4)
def build_corpus(corpus_seed: int = 0, names: str = "words") -> dict[str, Any]:
    """``{"docs": {id: {"title", "text"}}, "by_title", "companies", "people", "cities", ...}``."""
    _check_names(names)
    rng = random.Random(f"research-corpus/{corpus_seed}")
    used: set[str] = set()

    def word(syllables: int) -> str:
        while True:
            w = "".join(rng.choice(_ONSET) + rng.choice(_VOWEL) for _ in range(syllables))
            w = w.capitalize()
            if w not in used:
                used.add(w)
                return w

    # numbered: one 3-digit number per entity, unique in the corpus (so a number names one
    # entity and BM25 finds it); multiples of 100 are left out, as staff counts use them. The
    # words corpus draws nothing here, so it stays what it was.
    numbered = names == "numbered"
    pool = [n for n in range(100, 1000) if n % 100] if numbered else []
    numbers = iter(rng.sample(pool, 8 + 24 + 36 + 36) if numbered else ())

    def entity(kind: str, made_up: Callable[[], str]) -> str:
        return f"{kind} {next(numbers)}" if numbered else made_up()

    countries = [entity("Country", lambda: word(3)) for _ in range(8)]
    cities = {
        entity("City", lambda: word(3)): {
            "country": rng.choice(countries),
            "river": word(2),
            "population": rng.randint(20, 900) * 1000,
        }
        for _ in range(24)
    }
    city_names = sorted(cities)
    people = {
        entity("Person", lambda: f"{word(2)} {word(2)}"): {
            "city": rng.choice(city_names),
            "profession": rng.choice(_PROFESSION),
            "year": rng.randint(1930, 1990),
        }
        for _ in range(36)
    }
    founders = rng.sample(sorted(people), 36)
    companies = [
        {
            "name": entity("Company", lambda: f"{word(2)} {rng.choice(_SUFFIX)}"),
            "founder": founders[i],
            "hq": rng.choice(city_names),
            "industry": rng.choice(_INDUSTRY),
            "year": rng.randint(1960, 2015),
            "staff": rng.randint(2, 90) * 100,
        }
        for i in range(36)
    ]
    entries = [
        (
            c["name"],
            f"{c['name']} is a {c['industry']} company founded in {c['year']} by "
            f"{c['founder']}. Its headquarters are in {c['hq']}. It employs about "
            f"{c['staff']} people.",
        )
        for c in companies
    ]
    entries += [
        (p, f"{p} is an {v['profession']} born in {v['city']} in {v['year']}.")
        for p, v in people.items()
    ]
    entries += [
        (
            c,
            f"{c} is a city in {v['country']}, on the {v['river']} river. It has about "
            f"{v['population']} residents.",
        )
        for c, v in cities.items()
    ]
    order = rng.sample(range(len(entries)), len(entries))
    docs = {
        f"d{j:03d}": {"title": entries[i][0], "text": entries[i][1]} for j, i in enumerate(order)
    }
    by_title = {d["title"]: i for i, d in docs.items()}
    return {
        "docs": docs,
        "by_title": by_title,
        "companies": companies,
        "people": people,
        "cities": cities,
        "countries": countries,
    }


def _question_pool(corpus_seed: int, max_hops: int, names: str) -> list[dict[str, Any]]:
    c = build_corpus(corpus_seed, names)
    ids = c["by_title"]
    pool = []
    for co in c["companies"]:
        founder_city = c["people"][co["founder"]]["city"]
        qs = [
            (
                "founder_city",
                f"In which city was the founder of {co['name']} born?",
                [co["name"], co["founder"]],
                founder_city,
                "cities",
            ),
            (
                "hq_country",
                f"In which country is {co['name']} headquartered?",
                [co["name"], co["hq"]],
                c["cities"][co["hq"]]["country"],
                "countries",
            ),
        ]
        if max_hops >= 3:
            qs.append(
                (
                    "founder_country",
                    f"In which country was the founder of {co['name']} born?",
                    [co["name"], co["founder"], founder_city],
                    c["cities"][founder_city]["country"],
                    "countries",
                )
            )
        for kind, question, chain, answer, answer_kind in qs:
            evidence = [ids[t] for t in chain]
            pool.append(
                {
                    "key": f"research/{corpus_seed}/{kind}/{co['name']}",
                    "question": question + " Cite your sources as [doc_id].",
                    "chain": chain,
                    "evidence": evidence,
                    "answer": answer,
                    "answer_kind": answer_kind,
                    "corpus_seed": corpus_seed,
                    "names": names,
                    "required_steps": [f"open:{e}" for e in evidence],
                }
            )
    return pool


# -- environment ---------------------------------------------------------------------------------


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


def _corpus_of(task: Task) -> tuple[int, str]:
    """``build_corpus``'s arguments for a task (tasks made before ``names`` existed: words)."""
    return int(task.data.get("corpus_seed", 0)), task.data.get("names", "words")


@functools.lru_cache(maxsize=4)
def _index(corpus_seed: int, names: str = "words") -> BM25Index:
    docs = build_corpus(corpus_seed, names)["docs"]
    return BM25Index({i: f"{d['title']} {d['text']}" for i, d in docs.items()})


# -- scripted policies ---------------------------------------------------------------------------


def _msg(k: int, name: str, arguments: dict[str, Any]) -> Message:
    call = {
        "id": f"call_{k}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call]}


QUESTION_KINDS = ("founder_city", "hq_country", "founder_country")


def oracle_policy(
    task: Task,
    *,
    cite: bool = True,
    premature_prob: float = 0.0,
    premature_kinds: Sequence[str] | None = None,
    k: int = 5,
    rng: Any = None,
) -> Callable[[list[Message]], Message]:
    """Scripted solver: for each hop, search the entity's name, pick its document from the results
    by title, open it; then answer with citations (``cite=False``: the same answer, uncited).

    ``premature_prob`` (drawn once per episode from ``rng``): an annotator who skips the
    cross-check — after opening the first hop's document it answers at once, citing only that
    document (it knows the answer; the evidence for it is not in yet). Such golden data teaches
    an answer given before the evidence is in (``premature`` in the failure taxonomy; the verdict
    fails on the missing citation, and a policy that imitates it must guess).
    ``premature_kinds`` (e.g. ``["hq_country"]``): the habit only on these question kinds, as an
    annotator sure of where companies sit; a policy imitating it skips the second hop on exactly
    those, even when decoding greedily. ``k``: the results it asks ``search`` for (1-10)."""
    check_kinds("premature_kinds", premature_kinds, QUESTION_KINDS)
    if not 1 <= k <= 10:
        raise ValueError(f"k={k}: the search tool takes 1-10 results")
    chain = task.data["chain"]
    kind = task.data["key"].split("/")[2]
    early = (
        premature_prob > 0
        and len(chain) > 1
        and (premature_kinds is None or kind in premature_kinds)
        and _draw(rng) < premature_prob
    )

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m["content"] for m in messages if m["role"] == "tool"]
        n = len(tool_msgs)
        hop, phase = divmod(n, 2)
        if hop < (1 if early else len(chain)):
            if phase == 0:
                return _msg(n, "search", {"query": chain[hop], "k": k})
            titles = dict(re.findall(r"^\[(d\d{3})\] ([^:]+):", tool_msgs[-1], flags=re.M))
            doc_id = next((i for i, t in titles.items() if t == chain[hop]), "d000")
            return _msg(n, "open", {"doc_id": doc_id})
        opened = [m.splitlines()[0].split("]")[0] + "]" for m in tool_msgs[1::2]]
        refs = " ".join(opened) if cite else ""
        return {"role": "assistant", "content": f"{task.data['answer']} {refs}".strip()}

    return policy


def _draw(rng: Any) -> float:
    return float(rng.random()) if rng is not None else random.random()


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Searches once and answers with the first city or country the results mention."""

    def policy(messages: list[Message]) -> Message:
        if not any(m["role"] == "tool" for m in messages):
            return _msg(0, "search", {"query": task.data["question"], "k": 3})
        corpus = build_corpus(*_corpus_of(task))
        cands = [c for c in corpus[task.data["answer_kind"]] if c != task.data["answer"]]
        guess = next((c for c in cands if c in messages[-1]["content"]), cands[0])
        ids = " ".join(f"[{i}]" for i in re.findall(r"\[(d\d{3})\]", messages[-1]["content"]))
        return {"role": "assistant", "content": f"{guess} {ids}"}

    return policy
