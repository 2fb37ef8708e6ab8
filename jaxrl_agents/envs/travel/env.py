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
from collections.abc import Sequence
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, split_of
from jaxrl_agents.envs.tools import ToolBox, ToolError, tool
from jaxrl_agents.envs.travel.catalog import (
    CITIES,
    LISTINGS,
    REQUIRED,
    _catalog,
    _cheapest_plan,
    _flight_lines,
    _hotel_lines,
    _overlaps,
)
from jaxrl_agents.types import Ann, Task, Verdict


def _date(s: str, what: str) -> dt.date:
    try:
        return dt.date.fromisoformat(s)
    except (TypeError, ValueError):
        raise ToolError(f"{what} must be a date YYYY-MM-DD, got {s!r}") from None


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
