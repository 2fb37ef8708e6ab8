"""Scripted policies of the ``travel`` env: the oracle (two styles, SFT's golden data) and a
wrong one."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.registry import retry_timed_out_calls
from jaxrl_agents.types import Message, Task


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
        return retry_timed_out_calls(_filter_policy(task, slip))

    def choose(lines: list[str], hotel: bool) -> str:
        if hotel:
            ok = [l for l in lines if int(re.search(r" (\d)\* ", l).group(1)) >= min_stars]
            # slipping: the cheapest hotel under the stars requirement, when there is one
            lines = ([l for l in lines if l not in ok] or lines) if slip else ok
        return min(lines, key=lambda l: int(re.search(r"\$(\d+)", l).group(1))).split()[0]

    return retry_timed_out_calls(_policy(task, choose))


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Books the first result of every search (ignores budget and stars)."""
    return _policy(task, lambda lines, hotel: lines[0].split()[0])
