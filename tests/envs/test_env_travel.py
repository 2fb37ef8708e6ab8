"""Travel env: oracle/wrong policies, per-turn constraint drift, cancel, splits."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time

import pytest

from jaxrl_agents.envs.base import calls_from_message, drive
from jaxrl_agents.envs.tools import ToolError
from jaxrl_agents.envs.travel import TravelEnv, oracle_policy, wrong_policy
from jaxrl_agents.envs.travel.catalog import _catalog, _overlaps
from jaxrl_agents.types import Ann


def test_oracle_solves_and_first_result_policy_fails():
    for task in TravelEnv.make_tasks("heldout", 25):
        verdict, messages, anns = asyncio.run(drive(TravelEnv(), task, oracle_policy(task)))
        assert verdict.success, messages
        assert verdict.info["total_cost"] <= task.data["budget"]
        assert all(a[Ann.CONSTRAINT_VIOLATIONS] == [] for a in anns)
        assert verdict.info[Ann.EVIDENCE_IN_ANSWER]
        verdict, _, anns = asyncio.run(drive(TravelEnv(), task, wrong_policy(task)))
        assert not verdict.success
        assert anns[-1][Ann.CONSTRAINT_VIOLATIONS]  # budget or stars, visible per turn


def _msg(*calls):
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"c{i}", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }


def test_constraint_drift_is_visible_and_cancel_repairs_it():
    task = TravelEnv.make_tasks("train", 1, seed=5)[0]
    d = task.data
    cat = _catalog(d)
    env = TravelEnv()

    async def go():
        policy = oracle_policy(task)
        msgs = list((await env.reset(task)).messages)
        anns = []
        for _ in range(2):  # search, then book the valid plan
            m = policy(msgs)
            step = await env.step(m, calls_from_message(m))
            msgs += [m, *step.messages]
            anns.append(step.annotations)
        pricey = max(cat["hotels"].values(), key=lambda h: h["night"])
        extra = _msg(
            ("book_hotel", {"hotel_id": pricey["id"], "checkin": d["start"], "checkout": d["end"]})
        )
        s3 = await env.step(extra, calls_from_message(extra))
        undo = _msg(("cancel", {"booking_id": "B4"}))
        s4 = await env.step(undo, calls_from_message(undo))
        final = {"role": "assistant", "content": "Booked B1, B2, B3."}
        s5 = await env.step(final, [])
        return anns, s3, s4, s5, await env.verify()

    anns, s3, s4, s5, verdict = asyncio.run(go())
    assert anns[1][Ann.CONSTRAINT_VIOLATIONS] == [] and anns[1][Ann.PROGRESS] == 1.0
    drift = s3.annotations[Ann.CONSTRAINT_VIOLATIONS]
    assert any(v.startswith("overlapping stays: B3 and B4") for v in drift), drift
    assert s3.messages[0]["content"].startswith("Booked B4")
    assert s4.messages[0]["content"].startswith("Cancelled B4")
    assert s5.annotations[Ann.CONSTRAINT_VIOLATIONS] == []
    assert s4.annotations[Ann.STATE_KEY] != s5.annotations[Ann.STATE_KEY]
    assert verdict.success and verdict.info["bookings"] == ["B1", "B2", "B3"]


def test_wrong_dates_and_bad_input_are_reported():
    task = TravelEnv.make_tasks("train", 1, seed=2)[0]
    d = task.data
    cat = _catalog(d)
    off_day = next(
        f for f in cat["flights"].values() if f["origin"] == d["origin"] and f["date"] != d["start"]
    )
    turns = iter(
        [
            _msg(
                ("book_flight", {"flight_id": off_day["id"]}),
                ("book_flight", {"flight_id": "FL0"}),
                ("search_hotels", {"city": d["dest"], "checkin": "tomorrow", "checkout": d["end"]}),
                ("cancel", {"booking_id": "B9"}),
            ),
            {"role": "assistant", "content": "done"},
        ]
    )
    verdict, messages, anns = asyncio.run(drive(TravelEnv(), task, lambda m: next(turns)))
    assert "is not a trip leg" in anns[0][Ann.CONSTRAINT_VIOLATIONS][0]
    contents = [m["content"] for m in messages if m["role"] == "tool"]
    assert contents[1] == "Error: unknown flight_id 'FL0'; use an id from search_flights"
    assert contents[2] == "Error: checkin must be a date YYYY-MM-DD, got 'tomorrow'"
    assert contents[3] == "Error: no active booking 'B9'. Active: B1"
    assert not verdict.success and set(verdict.info[Ann.MISSING_STEPS]) == {
        "book_outbound",
        "book_return",
        "book_hotel",
    }


def test_splits_disjoint():
    train = {t.data["key"] for t in TravelEnv.make_tasks("train", 400)}
    held = {t.data["key"] for t in TravelEnv.make_tasks("heldout", 100)}
    assert train.isdisjoint(held) and len(train) == 400 and len(held) == 100


def test_violations_stay_linear_in_bookings():
    """2000 bookings of the same stay: one overlap message per stay, not one per pair (2M)."""
    task = TravelEnv.make_tasks("train", 1, seed=5)[0]
    d = task.data
    cat = _catalog(d)
    env = TravelEnv()
    asyncio.run(env.reset(task))
    hotel = next(h for h in cat["hotels"].values() if h["stars"] >= d["min_stars"])
    outbound = next(
        f
        for f in cat["flights"].values()
        if (f["origin"], f["dest"], f["date"]) == (d["origin"], d["dest"], d["start"])
    )
    n = 2000
    for i in range(n):
        if i % 10 == 0:
            env.book_flight(outbound["id"])
        else:
            env.book_hotel(hotel["id"], d["start"], d["end"])
    start = time.perf_counter()
    violations = env.constraint_violations()
    env.progress()  # _after_turn's other per-turn call
    elapsed = time.perf_counter() - start
    stays = n - n // 10
    overlaps = [v for v in violations if v.startswith("overlapping stays: ")]
    assert len(overlaps) == stays - 1 and overlaps[0] == "overlapping stays: B2 and B3"
    assert any(v.startswith("duplicate hotel bookings: ") for v in violations)
    assert any(v.startswith("duplicate outbound bookings: ") for v in violations)
    assert any(v.startswith("budget exceeded") for v in violations)
    assert len(violations) <= 2 * n
    assert sum(map(len, violations)) <= 100 * n
    assert elapsed < 1.0, elapsed  # the pairwise listing took seconds and ~200 MB


def test_overlap_messages_name_every_overlapping_stay():
    """The sweep reports only true overlaps, and every stay that overlaps another is named."""
    rng = random.Random(0)
    day = lambda k: (dt.date(2025, 1, 1) + dt.timedelta(days=k)).isoformat()
    for _ in range(300):
        stays = []
        for i in range(rng.randint(0, 8)):
            a = rng.randint(0, 12)
            stays.append((f"B{i + 1}", day(a), day(a + rng.randint(1, 5))))
        by_id = {s[0]: s for s in stays}
        pairs = {
            frozenset((x[0], y[0]))
            for i, x in enumerate(stays)
            for y in stays[i + 1 :]
            if x[1] < y[2] and y[1] < x[2]
        }
        msgs = _overlaps(stays)
        assert len(msgs) <= max(len(stays) - 1, 0)
        named = set()
        for m in msgs:
            x, y = m.removeprefix("overlapping stays: ").split(" and ")
            assert frozenset((x, y)) in pairs and by_id[x][1] <= by_id[y][1], (m, stays)
            named |= {x, y}
        assert named == set().union(*pairs), (stays, msgs)


def _first_ids(result: str) -> list[str]:
    return [line.split()[0] for line in result.splitlines()]


def test_cheapest_listing_filter_and_page_size():
    """``listing="cheapest"`` lists by price, lowest first; ``min_stars`` filters hotels;
    ``max_results`` caps a search's lines; the tasks keep the first-result plan failing (there,
    the cheapest hotel is below the star minimum)."""
    tasks = TravelEnv.make_tasks("train", 30, seed=1, listing="cheapest")
    assert all(t.data["listing"] == "cheapest" for t in tasks)
    assert "listing" not in TravelEnv.make_tasks("train", 1, seed=1)[0].data  # default unchanged
    for task in tasks:
        d, cat = task.data, _catalog(task.data)
        # by price; a tie: more stars first, then the id
        hotels = sorted(cat["hotels"].values(), key=lambda h: (h["night"], -h["stars"], h["id"]))
        assert hotels[0]["stars"] < d["min_stars"]  # booking the first hotel must fail
        env = TravelEnv(max_results=2)
        asyncio.run(env.reset(task))
        out = env.search_flights(d["origin"], d["dest"], d["start"])
        prices = [int(line.rsplit("$", 1)[1]) for line in out.splitlines()]
        legs = [
            f
            for f in cat["flights"].values()
            if (f["origin"], f["date"]) == (d["origin"], d["start"])
        ]
        assert prices == sorted(f["price"] for f in legs)[:2]
        every = env.search_hotels(d["dest"], d["start"], d["end"])
        assert _first_ids(every) == [h["id"] for h in hotels[:2]]
        ok = env.search_hotels(d["dest"], d["start"], d["end"], min_stars=d["min_stars"])
        want = [h["id"] for h in hotels if h["stars"] >= d["min_stars"]][:2]
        assert _first_ids(ok) == want
    with pytest.raises(ValueError, match=r"listing='price': expected one of premium, cheapest"):
        TravelEnv.make_tasks("train", 1, listing="price")


def test_star_filter_bad_values_and_empty_results_are_reported():
    task = TravelEnv.make_tasks("train", 1, seed=2)[0]
    d = task.data
    env = TravelEnv()
    asyncio.run(env.reset(task))
    with pytest.raises(ToolError, match="min_stars must be between 1 and 5, got 6"):
        env.search_hotels(d["dest"], d["start"], d["end"], min_stars=6)
    top = max(h["stars"] for h in _catalog(d)["hotels"].values())
    if top < 5:
        out = env.search_hotels(d["dest"], d["start"], d["end"], min_stars=5)
        assert out == f"No hotels in {d['dest']} with at least 5 stars."


def test_tool_subset_is_what_the_model_sees_and_can_call():
    env = TravelEnv(tools=["search_flights", "search_hotels", "book_flight", "book_hotel"])
    task = TravelEnv.make_tasks("train", 1)[0]
    reset = asyncio.run(env.reset(task))
    names = [s["function"]["name"] for s in reset.tools]
    assert names == ["search_flights", "search_hotels", "book_flight", "book_hotel"]
    cancel = _msg(("cancel", {"booking_id": "B1"}))
    step = asyncio.run(env.step(cancel, calls_from_message(cancel)))
    assert step.messages[0]["content"] == (
        "Error: unknown tool 'cancel'. Available: search_flights, search_hotels, book_flight, "
        "book_hotel"
    )
    with pytest.raises(ValueError, match=r"tools: unknown \['refund'\]; travel's tools are"):
        TravelEnv(tools=["search_flights", "refund"])
    with pytest.raises(ValueError, match="tools='search_flights': expected a non-empty list"):
        TravelEnv(tools="search_flights")
    with pytest.raises(ValueError, match="max_results=0: expected an integer >= 1 or None"):
        TravelEnv(max_results=0)


def test_filter_oracle_solves_and_its_slip_drops_the_star_filter():
    """``style="filter"``: the flights first, then the hotel searched with ``min_stars``, every
    booking the first result; slipping, the hotel search leaves ``min_stars`` out and the booked
    hotel breaks the star rating (a violation after the hotel is booked, none before)."""
    tasks = TravelEnv.make_tasks("heldout", 20, listing="cheapest")
    env = TravelEnv(
        tools=["search_flights", "search_hotels", "book_flight", "book_hotel"], max_results=2
    )
    for task in tasks:
        verdict, messages, anns = asyncio.run(drive(env, task, oracle_policy(task, style="filter")))
        assert verdict.success, messages
        assert len(anns) == 4 and verdict.info["total_cost"] <= task.data["budget"]
        assert messages[-1]["content"] == "Booked B1, B2, B3."
        slipped = oracle_policy(task, style="filter", slip_prob=1.0, rng=random.Random(0))
        verdict, messages, anns = asyncio.run(drive(env, task, slipped))
        search = [
            c
            for m in messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
            if c["function"]["name"] == "search_hotels"
        ]
        assert [list(c["function"]["arguments"]) for c in search] == [
            ["city", "checkin", "checkout"]
        ]
        assert not verdict.success
        assert [bool(a[Ann.CONSTRAINT_VIOLATIONS]) for a in anns] == [False, False, True, True]
    with pytest.raises(
        ValueError,
        match=r"style='filter' books each search's first result.*"
        r"listing='cheapest'.*env.tasks.listing=cheapest",
    ):
        oracle_policy(TravelEnv.make_tasks("train", 1)[0], style="filter")
    with pytest.raises(ValueError, match="style='greedy': expected one of compare, filter"):
        oracle_policy(tasks[0], style="greedy")
