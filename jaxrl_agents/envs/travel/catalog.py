"""The ``travel`` env's catalog: flights and hotels generated per task, their listings, and
the checks on an itinerary."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

LISTINGS = ("premium", "cheapest")
"""Orders of search results (``make_tasks(listing=...)``): ``premium`` (flights by departure time,
hotels by stars then price, highest first) or ``cheapest`` (by price, lowest first)."""
CITIES = ("Lisbon", "Oslo", "Prague", "Vienna", "Madrid", "Dublin", "Athens", "Zurich")
_HOTEL_NAMES = ("Aurora", "Harbor", "Central", "Grand", "Park", "Lumen", "Vista")
REQUIRED = ["book_outbound", "book_return", "book_hotel"]


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
