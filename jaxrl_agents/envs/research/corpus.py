"""The ``research`` env's generated corpus and its multi-hop questions.

The corpus (deterministic in ``corpus_seed``) has ~100 short documents about fictional companies,
people and cities. Facts are spread so no single document answers a question: a company's document
names its founder and headquarters city, a person's document their birthplace, a city's document
its country. Questions:

* ``founder_city`` (2 hops): "In which city was the founder of X born?" -> company, person;
* ``hq_country`` (2 hops): "In which country is X headquartered?" -> company, city;
* ``founder_country`` (3 hops, with ``max_hops=3``): company, person, city.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from jaxrl_agents.envs.research.index import BM25Index
from jaxrl_agents.types import Task

_ONSET = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st")
_VOWEL = ("a", "e", "i", "o", "u", "ai", "or")
_INDUSTRY = ("robotics", "shipping", "textile", "software", "brewing", "aerospace", "mining")
_PROFESSION = ("engineer", "archivist", "architect", "economist", "editor", "geologist")
_SUFFIX = ("Labs", "Works", "Systems", "Group", "Industries")


QUESTION_KINDS = ("founder_city", "hq_country", "founder_country")


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
    entries = _entries(companies, people, cities)
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


def _entries(
    companies: list[dict[str, Any]], people: dict[str, Any], cities: dict[str, Any]
) -> list[tuple[str, str]]:
    """(title, text) of every document: companies, then people, then cities."""
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
    return entries


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


def _corpus_of(task: Task) -> tuple[int, str]:
    """``build_corpus``'s arguments for a task (tasks made before ``names`` existed: words)."""
    return int(task.data.get("corpus_seed", 0)), task.data.get("names", "words")


@functools.lru_cache(maxsize=4)
def _index(corpus_seed: int, names: str = "words") -> BM25Index:
    docs = build_corpus(corpus_seed, names)["docs"]
    return BM25Index({i: f"{d['title']} {d['text']}" for i, d in docs.items()})
