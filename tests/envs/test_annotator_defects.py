"""The multi-step envs' annotator defects (the experiments' SFT data): each oracle option injects
the sequence-level failure it names, at about its rate, and the failure taxonomy sees it; at
rate 0 the oracle is unchanged and solves everything."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.jobs.build import build_chat, resolve_env
from jaxrl_agents.jobs.config import ChatSpec, ConfigError, EnvSpec
from jaxrl_agents.rollout import Collector, RolloutConfig, ScriptedEngine

FREE = RolloutConfig(group_size=1, max_turns=24, max_new_tokens=4096, max_total_tokens=1 << 16)
CASES = [  # env, option, failure mode it injects, success of the defective episodes
    ("research", "premature_prob", "premature", False),  # answers before the 2nd document
    ("sql", "premature_prob", "premature", True),  # right number, but no query was run
    ("travel", "slip_prob", "constraint_drift", None),  # the stars constraint slips at booking
]


def run(env_name: str, options: dict, n: int = 60, spec: EnvSpec | None = None):
    env = resolve_env(spec or EnvSpec(name=env_name))
    chat = build_chat(ChatSpec())
    engine = ScriptedEngine(chat, policy_factory=env.oracle(options, rng=np.random.default_rng(0)))
    orch = Collector(chat=chat, env_factory=env.factory, rollout=FREE).orchestrator(
        engine, greedy=True, group_size=1
    )
    return asyncio.run(orch.run(env.tasks("train", n, seed=0), group_size=1))


@pytest.mark.parametrize("env_name, option, mode, defect_succeeds", CASES)
def test_defect_injects_its_failure_mode(env_name, option, mode, defect_succeeds):
    clean = summarize(run(env_name, {option: 0.0}))
    assert clean["success"] == 1.0 and clean["failure_modes"][mode] == 0
    trajs = run(env_name, {option: 0.5})
    s = summarize(trajs)
    hit = [t for t in trajs if mode in _modes(t)]
    assert 0.2 * len(trajs) <= len(hit) <= 0.7 * len(trajs), (len(hit), s["failure_modes"])
    if defect_succeeds is not None:
        assert all(t.success == defect_succeeds for t in hit)
    else:  # a slipped constraint fails unless the cheapest hotel happened to qualify
        assert not any(t.success for t in hit)


def _modes(traj) -> set[str]:
    from jaxrl_agents.evaluation.summary import failure_modes

    return {k for k, v in failure_modes(traj).items() if v}


def test_sql_habit_on_named_cities_only():
    """``premature_words``: the sql annotator skips the query only on questions naming one of
    those cities (at the given rate), so the habit is a property of the question a policy can
    learn; every other question is solved with its query."""
    cities = ["Avalon", "Brixton"]
    trajs = run("sql", {"premature_prob": 1.0, "premature_words": cities}, n=70)
    for t in trajs:
        named = any(c in t.task.data["question"] for c in cities)
        ran_sql = any(
            c["function"]["name"] == "run_sql"
            for m in t.messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        )
        assert ran_sql != named, (t.task.data["question"], ran_sql)
        assert ("premature" in _modes(t)) == named
    assert 5 <= sum(any(c in t.task.data["question"] for c in cities) for t in trajs) <= 50


def test_research_habit_on_one_question_kind_only():
    """``premature_kinds``: the research annotator skips the second hop only on the named kind;
    ``k`` is the number of results it asks search for, and the oracle still solves the rest."""
    trajs = run("research", {"premature_prob": 1.0, "premature_kinds": ["hq_country"], "k": 2})
    for t in trajs:
        kind = t.task.data["key"].split("/")[2]
        opened = [m for m in t.messages if m["role"] == "tool" and m["name"] == "open"]
        searches = [
            c["function"]["arguments"]
            for m in t.messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "search"
        ]
        assert all(a["k"] == 2 for a in searches)
        assert len(opened) == (1 if kind == "hq_country" else 2), kind
        assert t.success == (kind != "hq_country")
        assert ("premature" in _modes(t)) == (kind == "hq_country")
    with pytest.raises(ConfigError, match=r"env.oracle: premature_kinds=\[.hq_city.\]: unknown"):
        resolve_env(EnvSpec(name="research")).oracle({"premature_kinds": ["hq_city"]})


def test_research_habit_at_a_random_hop_of_three():
    """``premature_hop=random``: on 3-hop questions the habit answers after the first or the
    second document, drawn per episode, so the turn that decides the episode varies; 2-hop
    questions keep their one possible early stop. ``first`` is the default; a bad value names
    the valid ones."""
    spec = EnvSpec(name="research", tasks={"max_hops": 3})
    opts = {"premature_prob": 1.0, "premature_kinds": ["founder_country"]}
    trajs = run("research", {**opts, "premature_hop": "random"}, n=90, spec=spec)
    stops = {}
    for t in trajs:
        kind = t.task.data["key"].split("/")[2]
        opened = sum(m["role"] == "tool" and m["name"] == "open" for m in t.messages)
        stops.setdefault(kind, []).append(opened)
        assert t.success == (kind != "founder_country"), (kind, opened)
    assert set(stops["founder_country"]) == {1, 2}, stops  # both early stops occur
    assert 0.25 <= stops["founder_country"].count(1) / len(stops["founder_country"]) <= 0.75
    assert set(stops["founder_city"]) == set(stops["hq_country"]) == {2}
    first = run("research", opts, n=30, spec=spec)  # the default: after the first document
    assert {
        sum(m["role"] == "tool" and m["name"] == "open" for m in t.messages)
        for t in first
        if "founder_country" in t.task.data["key"]
    } == {1}
    with pytest.raises(ConfigError, match=r"premature_hop='last'; valid: first, random"):
        resolve_env(spec).oracle({"premature_hop": "last"})


def test_travel_slip_on_one_star_minimum_only():
    """``slip_stars``: the travel annotator lets the stars constraint slip only on tasks asking for
    those minimums; the other tasks are booked within every constraint."""
    trajs = run("travel", {"slip_prob": 1.0, "slip_stars": [4]})
    fours = [t for t in trajs if t.task.data["min_stars"] == 4]
    assert 10 <= len(fours) <= 50
    for t in trajs:
        if t.task.data["min_stars"] == 4:  # slipped unless no hotel below 4 stars was offered
            assert not t.success or "constraint_drift" not in _modes(t)
        else:
            assert t.success and "constraint_drift" not in _modes(t)
    assert sum("constraint_drift" in _modes(t) for t in fours) >= 0.8 * len(fours)
    with pytest.raises(ConfigError, match=r"env.oracle: slip_stars='4': expected a list"):
        resolve_env(EnvSpec(name="travel")).oracle({"slip_stars": "4"})


def test_sql_answer_prefix_keeps_the_oracle_right_and_the_habit_on_its_cities():
    """``answer_prefix``: every reply is the prefix and then the number (the query's first cell,
    or the known number where the habit skips the query); the judge reads the last number, so
    the oracle still solves every question, and the habit stays on its cities only."""
    cities = ["Avalon", "Brixton"]
    opts = {"answer_prefix": "Answer: ", "premature_prob": 1.0, "premature_words": cities}
    trajs = run("sql", opts, n=40)
    assert all(t.success for t in trajs)
    for t in trajs:
        reply = t.messages[-1]
        assert reply["role"] == "assistant" and reply["content"].startswith("Answer: ")
        assert reply["content"][len("Answer: ") :] == str(t.task.data["answer"])
        named = any(c in t.task.data["question"] for c in cities)
        assert ("premature" in _modes(t)) == named
    assert 0 < sum("premature" in _modes(t) for t in trajs) < len(trajs)


def test_travel_filter_habit_drops_the_star_filter_on_its_minimum_only():
    """The ``experiment=travel`` annotator (``style="filter"`` on ``listing="cheapest"`` tasks,
    four tools, two results a search): on 4-star tasks it searches hotels without ``min_stars``
    and books a hotel below 4 stars (constraint drift, a failed episode); 3-star tasks are
    solved with the filter. Through the chat format, as the SFT data is made."""
    spec = EnvSpec(
        name="travel",
        options={"tools": ["search_flights", "search_hotels", "book_flight", "book_hotel"],
                 "max_results": 2},
        tasks={"listing": "cheapest"},
    )  # fmt: skip
    trajs = run("travel", {"style": "filter", "slip_prob": 1.0, "slip_stars": [4]}, 40, spec)
    assert all(len(t.tools) == 4 for t in trajs)
    fours = [t for t in trajs if t.task.data["min_stars"] == 4]
    assert 10 <= len(fours) <= 35
    for t in trajs:
        hotel_search = [
            c["function"]["arguments"]
            for m in t.messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "search_hotels"
        ]
        four = t.task.data["min_stars"] == 4
        assert [("min_stars" in a) for a in hotel_search] == [not four]
        assert t.success != four and ("constraint_drift" in _modes(t)) == four
