"""``travel``: stateful trip booking under a budget and calendar constraints.

The user asks for a round trip (outbound flight on the start date, return flight on the end date,
a hotel in the destination for exactly those nights with a minimum star rating) within a budget.
Tools: ``search_flights``, ``search_hotels``, ``book_flight``, ``book_hotel``, ``cancel``,
``get_itinerary``. The catalogue is generated per task (deterministic in the task) and arranged so
that booking the first result of every search breaks the budget or the star rating.

Success iff the final state books each required item exactly once and violates no constraint.
``Ann.CONSTRAINT_VIOLATIONS`` lists what the state breaks after every turn (budget exceeded, a
flight on the wrong date or route, overlapping or wrongly dated stays, too few stars, duplicates),
so drift across turns is visible; items not booked yet are missing steps, not violations.

Options, for agents that compare less and copy more (the ``experiment=travel`` preset):
``make_tasks(listing="cheapest")`` lists search results cheapest first (default ``premium``:
flights by time, hotels by stars), tasks still chosen so that booking every search's first result
fails (there, the cheapest hotel is below the star minimum); ``search_hotels``' ``min_stars``
filter then makes "the first result" the right hotel. ``TravelEnv(tools=[...])`` offers a subset
of the tools, ``max_results`` caps the lines of a search.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, split_of
from jaxrl_agents.envs.tools import ToolBox, ToolError, tool
from jaxrl_agents.types import Ann, Message, Task, Verdict

LISTINGS = ("premium", "cheapest")
"""Orders of search results (``make_tasks(listing=...)``): ``premium`` (flights by departure time,
hotels by stars then price, highest first) or ``cheapest`` (by price, lowest first)."""
CITIES = ("Lisbon", "Oslo", "Prague", "Vienna", "Madrid", "Dublin", "Athens", "Zurich")
_HOTEL_NAMES = ("Aurora", "Harbor", "Central", "Grand", "Park", "Lumen", "Vista")
REQUIRED = ["book_outbound", "book_return", "book_hotel"]


def _date(s: str, what: str) -> dt.date:
    try:
        return dt.date.fromisoformat(s)
    except (TypeError, ValueError):
        raise ToolError(f"{what} must be a date YYYY-MM-DD, got {s!r}") from None


def _catalog(data: dict[str, Any]) -> dict[str, Any]:
    """Flights on the trip's routes around its dates, and hotels in the destination."""
    rng = random.Random(data["catalog_seed"])
    o, d = data["origin"], data["dest"]
    start, end = dt.date.fromisoformat(data["start"]), dt.date.fromisoformat(data["end"])
    flights = {}
    for src, dst, day in [(o, d, start), (d, o, end)]:
        for delta in (-1, 0, 1):
            date = (day + dt.timedelta(days=delta)).isoformat()
            for _ in range(4):
                fid = f"FL{rng.randint(100, 999)}{len(flights)}"
                flights[fid] = {
                    "id": fid,
                    "origin": src,
                    "dest": dst,
                    "date": date,
                    "time": f"{rng.randint(6, 21):02d}:{rng.choice((0, 15, 30, 45)):02d}",
                    "price": rng.randint(8, 60) * 10,
                }
    hotels = {}
    for i, name in enumerate(rng.sample(_HOTEL_NAMES, 5)):
        hid = f"HT{i + 1}{rng.randint(10, 99)}"
        hotels[hid] = {
            "id": hid,
            "name": f"Hotel {name}",
            "city": d,
            "stars": rng.randint(2, 5),
            "night": rng.randint(6, 30) * 10,
        }
    return {"flights": flights, "hotels": hotels}


def _flight_lines(flights: list[dict[str, Any]], listing: str = "premium") -> list[dict[str, Any]]:
    if listing == "cheapest":
        return sorted(flights, key=lambda f: (f["price"], f["time"], f["id"]))
    return sorted(flights, key=lambda f: (f["time"], f["id"]))


def _hotel_lines(hotels: list[dict[str, Any]], listing: str = "premium") -> list[dict[str, Any]]:
    if listing == "cheapest":
        return sorted(hotels, key=lambda h: (h["night"], -h["stars"], h["id"]))
    return sorted(hotels, key=lambda h: (-h["stars"], -h["night"], h["id"]))  # premium first


def _cheapest_plan(
    data: dict[str, Any], cat: dict[str, Any], listing: str = "premium"
) -> tuple[int, int] | None:
    """(cheapest valid total, total of booking every search's first result)."""
    nights = (dt.date.fromisoformat(data["end"]) - dt.date.fromisoformat(data["start"])).days
    legs = [
        (data["origin"], data["dest"], data["start"]),
        (data["dest"], data["origin"], data["end"]),
    ]
    opts = [
        [f for f in cat["flights"].values() if (f["origin"], f["dest"], f["date"]) == leg]
        for leg in legs
    ]
    ok_hotels = [h for h in cat["hotels"].values() if h["stars"] >= data["min_stars"]]
    if not ok_hotels:
        return None
    best = sum(min(f["price"] for f in o) for o in opts) + nights * min(
        h["night"] for h in ok_hotels
    )
    first = sum(_flight_lines(o, listing)[0]["price"] for o in opts)
    first += nights * _hotel_lines(list(cat["hotels"].values()), listing)[0]["night"]
    return best, first


def _overlaps(stays: list[tuple[str, str, str]]) -> list[str]:
    """One violation per stay that overlaps a stay starting no later (``(booking_id, checkin,
    checkout)`` in booking order, ISO dates): ``"overlapping stays: <earlier> and <this>"``.

    A sweep by check-in, O(n log n) with at most n - 1 messages (listing every overlapping pair is
    quadratic: 2000 stays on the same dates are 2M pairs). Each stay involved in an overlap is
    named at least once: the partner is the stay reaching furthest so far, which overlaps it.
    """
    out: list[str] = []
    reach: tuple[str, str] | None = None  # (checkout, booking id) of the stay reaching furthest
    for bid, checkin, checkout in sorted(stays, key=lambda t: t[1]):  # stable: ties by booking
        if reach is not None and checkin < reach[0]:
            out.append(f"overlapping stays: {reach[1]} and {bid}")
        if reach is None or checkout > reach[0]:
            reach = (checkout, bid)
    return out


class TravelEnv(Env):
    """Book a round trip and hotel; success iff the final bookings satisfy every constraint."""

    name = "travel"

    def __init__(
        self,
        *,
        tools: Sequence[str] | None = None,
        max_results: int | None = None,
        config: EnvConfig | None = None,
        **env_kwargs: Any,
    ):
        """``tools``: the tools offered (default all); ``max_results``: at most this many lines
        per search (default all)."""
        super().__init__(config=config, **env_kwargs)
        if tools is not None:
            every = list(self.tools.tools)
            if isinstance(tools, str | bytes) or not tools:
                raise ValueError(f"tools={tools!r}: expected a non-empty list of {every}")
            unknown = [t for t in tools if t not in every]
            if unknown:
                raise ValueError(f"tools: unknown {unknown}; travel's tools are {every}")
            self.tools = ToolBox([self.tools.tools[t] for t in every if t in tools])
        if max_results is not None and (
            isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1
        ):
            raise ValueError(f"max_results={max_results!r}: expected an integer >= 1 or None")
        self.max_results = max_results
        self._cat: dict[str, Any] = {"flights": {}, "hotels": {}}
        self._bookings: dict[str, dict[str, Any]] = {}  # active only; cancel removes
        self._issued = 0
        self._listing = "premium"

    @classmethod
    def make_tasks(
        cls,
        split: str,
        n: int,
        *,
        seed: int = 0,
        heldout_frac: float = 0.2,
        listing: str = "premium",
    ) -> list[Task]:
        """``n`` trips of ``split``. Budgets sit 10-25% above the cheapest valid plan, below the
        cost of booking each search's first result (or that plan breaks the star rating).
        ``listing`` (:data:`LISTINGS`): the order of search results in these tasks' episodes."""
        check_split(split)
        if listing not in LISTINGS:
            raise ValueError(f"listing={listing!r}: expected one of {', '.join(LISTINGS)}")
        rng = random.Random(f"travel/{seed}/{split}")
        tasks: list[Task] = []
        seen: set[str] = set()
        while len(tasks) < n:
            o, d = rng.sample(CITIES, 2)
            start = dt.date(2025, rng.randint(1, 12), rng.randint(1, 28))
            nights, min_stars = rng.randint(2, 5), rng.randint(3, 4)
            key = f"travel/{o}/{d}/{start}/{nights}/{min_stars}"
            if split_of(key, heldout_frac=heldout_frac) != split or key in seen:
                continue
            data = {
                "origin": o,
                "dest": d,
                "start": start.isoformat(),
                "end": (start + dt.timedelta(days=nights)).isoformat(),
                "min_stars": min_stars,
                "catalog_seed": int(hashlib.sha1(key.encode()).hexdigest()[:8], 16),
            }
            cat = _catalog(data)
            plan = _cheapest_plan(data, cat, listing)
            if plan is None:
                continue
            best, first = plan
            budget = int(best * rng.uniform(1.10, 1.25)) // 10 * 10 + 10
            first_hotel = _hotel_lines(list(cat["hotels"].values()), listing)[0]
            if first <= budget and first_hotel["stars"] >= min_stars:
                continue  # the naive plan would pass: not a test of constraint tracking
            seen.add(key)
            data.update(key=key, budget=budget, required_steps=list(REQUIRED))
            if listing != "premium":
                data["listing"] = listing
            data["question"] = (
                f"Book a round trip from {o} to {d}: fly out on {data['start']} and back on "
                f"{data['end']}, with a hotel in {d} of at least {min_stars} stars for those "
                "nights. "
                f"Total budget: ${budget}. Reply when everything is booked."
            )
            tasks.append(
                Task(
                    id=f"travel-{split}-{seed}-{len(tasks):05d}",
                    env=cls.name,
                    split=split,
                    data=data,
                )
            )
        return tasks

    def system_prompt(self, task: Task) -> str:
        return "You are a travel agent. Use the tools to search and book; respect every constraint."

    def setup(self, task: Task, seed: int) -> None:
        self._cat, self._bookings, self._issued = _catalog(task.data), {}, 0
        self._listing = task.data.get("listing", "premium")

    # -- tools -------------------------------------------------------------------------------------
    @tool
    def search_flights(self, origin: str, dest: str, date: str) -> str:
        """Find flights on one day.

        Args:
            origin: departure city.
            dest: arrival city.
            date: YYYY-MM-DD.
        """
        day = _date(date, "date").isoformat()
        hits = [
            f
            for f in self._cat["flights"].values()
            if (f["origin"].lower(), f["dest"].lower(), f["date"])
            == (origin.lower(), dest.lower(), day)
        ]
        if not hits:
            return f"No flights from {origin} to {dest} on {day}."
        return "\n".join(
            f"{f['id']} {f['time']} ${f['price']}"  # the route and day are the query's
            for f in _flight_lines(hits, self._listing)[: self.max_results]
        )

    @tool
    def search_hotels(self, city: str, checkin: str, checkout: str, min_stars: int = 1) -> str:
        """Find hotels for a stay.

        Args:
            city: the city.
            checkin: YYYY-MM-DD.
            checkout: YYYY-MM-DD (after checkin).
            min_stars: only hotels with at least this many stars (1-5).
        """
        nights = (_date(checkout, "checkout") - _date(checkin, "checkin")).days
        if nights < 1:
            raise ToolError(f"checkout {checkout} must be after checkin {checkin}")
        if not 1 <= min_stars <= 5:
            raise ToolError(f"min_stars must be between 1 and 5, got {min_stars}")
        hits = [h for h in self._cat["hotels"].values() if h["city"].lower() == city.lower()]
        if not hits:
            return f"No hotels in {city}."
        hits = [h for h in hits if h["stars"] >= min_stars]
        if not hits:
            return f"No hotels in {city} with at least {min_stars} stars."
        return "\n".join(
            f"{h['id']} {h['name']} {h['stars']}* ${h['night']}/night "
            f"(${h['night'] * nights} total)"
            for h in _hotel_lines(hits, self._listing)[: self.max_results]
        )

    def _book(self, item: dict[str, Any]) -> str:
        self._issued += 1  # ids are never reused, also after a cancel
        bid = f"B{self._issued}"
        self._bookings[bid] = {"booking_id": bid, **item}
        return bid

    @tool
    def book_flight(self, flight_id: str) -> str:
        """Book a flight.

        Args:
            flight_id: id from search_flights, e.g. FL4121.
        """
        f = self._cat["flights"].get(flight_id.strip())
        if f is None:
            raise ToolError(f"unknown flight_id {flight_id!r}; use an id from search_flights")
        bid = self._book({"kind": "flight", **f, "cost": f["price"]})
        return (
            f"Booked {bid}: flight {f['id']} {f['origin']}->{f['dest']} {f['date']} ${f['price']}"
        )

    @tool
    def book_hotel(self, hotel_id: str, checkin: str, checkout: str) -> str:
        """Book a hotel stay.

        Args:
            hotel_id: id from search_hotels, e.g. HT142.
            checkin: YYYY-MM-DD.
            checkout: YYYY-MM-DD (after checkin).
        """
        h = self._cat["hotels"].get(hotel_id.strip())
        if h is None:
            raise ToolError(f"unknown hotel_id {hotel_id!r}; use an id from search_hotels")
        a, b = _date(checkin, "checkin"), _date(checkout, "checkout")
        if (b - a).days < 1:
            raise ToolError(f"checkout {checkout} must be after checkin {checkin}")
        cost = h["night"] * (b - a).days
        bid = self._book(
            {
                "kind": "hotel",
                **h,
                "checkin": a.isoformat(),
                "checkout": b.isoformat(),
                "cost": cost,
            }
        )
        return f"Booked {bid}: {h['name']} {a}..{b} ${cost}"

    @tool
    def cancel(self, booking_id: str) -> str:
        """Cancel a booking (full refund).

        Args:
            booking_id: e.g. B1.
        """
        if booking_id not in self._bookings:
            active = ", ".join(self._bookings) or "none"
            raise ToolError(f"no active booking {booking_id!r}. Active: {active}")
        b = self._bookings.pop(booking_id)
        return f"Cancelled {booking_id} (refund ${b['cost']})"

    @tool
    def get_itinerary(self) -> str:
        """Show active bookings, total cost and budget left."""
        lines = []
        for b in self._bookings.values():
            if b["kind"] == "flight":
                lines.append(
                    f"{b['booking_id']} flight {b['id']} {b['origin']}->{b['dest']} "
                    f"{b['date']} ${b['cost']}"
                )
            else:
                lines.append(
                    f"{b['booking_id']} {b['name']} {b['checkin']}..{b['checkout']} ${b['cost']}"
                )
        total = self._total()
        lines.append(
            f"Total ${total}; budget ${self.task.data['budget']}; "
            f"left ${self.task.data['budget'] - total}"
        )
        return "\n".join(lines)

    # -- state checks ------------------------------------------------------------------------------
    def _total(self) -> int:
        return sum(b["cost"] for b in self._bookings.values())

    def _classify(self) -> tuple[dict[str, list[str]], list[str]]:
        """Bookings per required item (valid ones only) and the constraint violations."""
        d = self.task.data
        items: dict[str, list[str]] = {k: [] for k in REQUIRED}
        bad: list[str] = []
        legs = {
            "book_outbound": (d["origin"], d["dest"], d["start"]),
            "book_return": (d["dest"], d["origin"], d["end"]),
        }
        stays = []
        for bid, b in self._bookings.items():
            if b["kind"] == "flight":
                leg = next(
                    (k for k, v in legs.items() if v == (b["origin"], b["dest"], b["date"])), None
                )
                if leg is None:
                    bad.append(
                        f"{bid}: flight {b['origin']}->{b['dest']} on {b['date']} is not "
                        f"a trip leg ({d['origin']}->{d['dest']} {d['start']}, back {d['end']})"
                    )
                else:
                    items[leg].append(bid)
                continue
            stays.append((bid, b["checkin"], b["checkout"]))
            if b["stars"] < d["min_stars"]:
                bad.append(f"{bid}: {b['name']} has {b['stars']} stars < {d['min_stars']}")
            elif (b["checkin"], b["checkout"]) != (d["start"], d["end"]):
                bad.append(
                    f"{bid}: stay {b['checkin']}..{b['checkout']} != trip {d['start']}..{d['end']}"
                )
            else:
                items["book_hotel"].append(bid)
        bad += _overlaps(stays)
        bad += [
            f"duplicate {k[5:]} bookings: {', '.join(v)}" for k, v in items.items() if len(v) > 1
        ]
        if self._total() > d["budget"]:
            bad.append(f"budget exceeded: ${self._total()} > ${d['budget']}")
        return items, bad

    def completed_steps(self) -> set[str]:
        return {k for k, v in self._classify()[0].items() if v} if self.task else set()

    def constraint_violations(self) -> list[str]:
        return self._classify()[1] if self.task else []

    def state_digest(self) -> Any:
        """Privileged anchors (``EnvConfig.privileged_anchors``): the current bookings (id, dates).
        Env-internal but not derived from the ground truth; unlike the observed state it forgets
        searches and bookings later cancelled."""
        return sorted(
            (b["id"], b.get("checkin"), b.get("checkout")) for b in self._bookings.values()
        )

    def judge(self, answer: str | None) -> Verdict:
        items, bad = self._classify()
        ok = all(items.values()) and not bad
        done = sum(bool(v) for v in items.values())
        text = answer or ""
        return Verdict(
            success=ok,
            score=1.0 if ok else 0.5 * done / len(REQUIRED) if not bad else 0.0,
            info={
                Ann.EXPECTED: {"budget": self.task.data["budget"], "items": REQUIRED},
                Ann.ANSWER: answer,
                Ann.EVIDENCE_IN_ANSWER: bool(self._bookings)
                and all(re.search(rf"\b{b}\b", text) for b in self._bookings),
                "total_cost": self._total(),
                "bookings": sorted(self._bookings),
            },
        )


# -- scripted policies ---------------------------------------------------------------------------


def _calls(k: int, *calls: tuple[str, dict[str, Any]]) -> Message:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call_{k + i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }


def _flight_searches(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The trip's two flight searches (out on the start date, back on the end date)."""
    return [
        ("search_flights", {"origin": d["origin"], "dest": d["dest"], "date": d["start"]}),
        ("search_flights", {"origin": d["dest"], "dest": d["origin"], "date": d["end"]}),
    ]


def _policy(
    task: Task, choose: Callable[[list[str], bool], str]
) -> Callable[[list[Message]], Message]:
    d = task.data

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m["content"] for m in messages if m["role"] == "tool"]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:
            return _calls(
                0,
                *_flight_searches(d),
                ("search_hotels", {"city": d["dest"], "checkin": d["start"], "checkout": d["end"]}),
            )
        if turn == 1:
            out, back, hotels = (m.splitlines() for m in tool_msgs[:3])
            return _calls(
                3,
                ("book_flight", {"flight_id": choose(out, False)}),
                ("book_flight", {"flight_id": choose(back, False)}),
                (
                    "book_hotel",
                    {"hotel_id": choose(hotels, True), "checkin": d["start"], "checkout": d["end"]},
                ),
            )
        if turn == 2:
            return _calls(6, ("get_itinerary", {}))
        ids = re.findall(r"^(B\d+) ", tool_msgs[-1], flags=re.M)
        return {
            "role": "assistant",
            "content": f"Booked {', '.join(ids)}. {tool_msgs[-1].splitlines()[-1]}",
        }

    return policy


STYLES = ("compare", "filter")
"""How the scripted solver works (``oracle_policy(style=...)``): ``compare`` searches everything,
then books the cheapest valid options it reads off the listings, checks the itinerary and
confirms; ``filter`` lets the search tools do the comparing (needs ``listing="cheapest"``
tasks): it books the first result of each search, the hotel searched with ``min_stars``, in four
turns without the itinerary."""


def _filter_policy(task: Task, slip: bool) -> Callable[[list[Message]], Message]:
    d = task.data
    if d.get("listing") != "cheapest":
        raise ValueError(
            f"style='filter' books each search's first result, which is the cheapest only in "
            f"tasks made with listing='cheapest'; task {task.id} lists "
            f"{d.get('listing', 'premium')!r} (set env.tasks.listing=cheapest)"
        )

    def first_id(result: str) -> str:
        return result.split(maxsplit=1)[0]

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m["content"] for m in messages if m["role"] == "tool"]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:
            return _calls(
                0,
                *_flight_searches(d),
            )
        if turn == 1:
            hotel = {"city": d["dest"], "checkin": d["start"], "checkout": d["end"]}
            if not slip:  # slipping: the star minimum is left out of the search
                hotel["min_stars"] = d["min_stars"]
            return _calls(
                2,
                ("book_flight", {"flight_id": first_id(tool_msgs[0])}),
                ("book_flight", {"flight_id": first_id(tool_msgs[1])}),
                ("search_hotels", hotel),
            )
        if turn == 2:
            return _calls(
                5,
                (
                    "book_hotel",
                    {
                        "hotel_id": first_id(tool_msgs[4]),
                        "checkin": d["start"],
                        "checkout": d["end"],
                    },
                ),
            )
        ids = re.findall(r"^Booked (B\d+):", "\n".join(tool_msgs), flags=re.M)
        return {"role": "assistant", "content": f"Booked {', '.join(ids)}."}

    return policy


def oracle_policy(
    task: Task,
    *,
    slip_prob: float = 0.0,
    slip_stars: Sequence[int] | None = None,
    style: str = "compare",
    rng: Any = None,
) -> Callable[[list[Message]], Message]:
    """Scripted solver (``style``, :data:`STYLES`): ``compare`` searches all three in one turn,
    books the cheapest valid options, checks the itinerary, then confirms the booking ids;
    ``filter`` searches the flights, books the first (cheapest) of each and searches hotels with
    ``min_stars``, books the first hotel, then confirms.

    ``slip_prob`` (drawn once per episode from ``rng``): an annotator whose constraints loosen
    turn by turn — it searches the flights correctly, but when it comes to the hotel (its second
    turn) it lets the minimum-stars requirement slip: ``compare`` books the cheapest hotel below
    it (when there is one), ``filter`` searches hotels without ``min_stars`` and books the first,
    the cheapest, which such tasks make one below it. Such golden data teaches constraint drift
    (``Ann.CONSTRAINT_VIOLATIONS`` after the booking turn; the verdict fails). ``slip_stars``
    (e.g. ``[4]``): the slip only on tasks asking for one of these minimums, as an annotator who
    takes "at least 4 stars" for a wish; a policy imitating it lets exactly that constraint slip,
    even when decoding greedily."""
    if slip_stars is not None and (
        isinstance(slip_stars, str | bytes)
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in slip_stars)
    ):
        raise ValueError(f"slip_stars={slip_stars!r}: expected a list of star counts, e.g. [4]")
    if style not in STYLES:
        raise ValueError(f"style={style!r}: expected one of {', '.join(STYLES)}")
    min_stars = task.data["min_stars"]
    slip = (
        slip_prob > 0
        and (slip_stars is None or min_stars in slip_stars)
        and (rng.random() if rng is not None else random.random()) < slip_prob
    )
    if style == "filter":
        return _filter_policy(task, slip)

    def choose(lines: list[str], hotel: bool) -> str:
        if hotel:
            ok = [l for l in lines if int(re.search(r" (\d)\* ", l).group(1)) >= min_stars]
            # slipping: the cheapest hotel under the stars requirement, when there is one
            lines = ([l for l in lines if l not in ok] or lines) if slip else ok
        return min(lines, key=lambda l: int(re.search(r"\$(\d+)", l).group(1))).split()[0]

    return _policy(task, choose)


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Books the first result of every search (ignores budget and stars)."""
    return _policy(task, lambda lines, hotel: lines[0].split()[0])
