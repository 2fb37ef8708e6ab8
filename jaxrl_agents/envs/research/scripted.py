"""Scripted policies of the ``research`` env: the oracle (SFT's golden data) and a wrong one."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.base import check_kinds
from jaxrl_agents.envs.registry import retry_timed_out_calls
from jaxrl_agents.envs.research.corpus import QUESTION_KINDS, _corpus_of, build_corpus
from jaxrl_agents.types import Message, Task


def _msg(k: int, name: str, arguments: dict[str, Any]) -> Message:
    call = {
        "id": f"call_{k}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def oracle_policy(
    task: Task,
    *,
    cite: bool = True,
    premature_prob: float = 0.0,
    premature_kinds: Sequence[str] | None = None,
    premature_hop: str = "first",
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
    those, even when decoding greedily. ``premature_hop``: after which hop's document the habit
    answers: ``first`` (the first's), or ``random`` (a hop drawn uniformly from all but the
    last, per episode): on 3-hop questions (``env.tasks.max_hops=3``) the turn that decides
    the episode then varies. ``k``: the results it asks ``search`` for (1-10)."""
    check_kinds("premature_kinds", premature_kinds, QUESTION_KINDS)
    if not 1 <= k <= 10:
        raise ValueError(f"k={k}: the search tool takes 1-10 results")
    if premature_hop not in PREMATURE_HOPS:
        raise ValueError(f"premature_hop={premature_hop!r}; valid: {', '.join(PREMATURE_HOPS)}")
    chain = task.data["chain"]
    kind = task.data["key"].split("/")[2]
    early = (
        premature_prob > 0
        and len(chain) > 1
        and (premature_kinds is None or kind in premature_kinds)
        and _draw(rng) < premature_prob
    )
    hops = len(chain)  # the hops it opens before answering
    if early:
        hops = 1 if premature_hop == "first" else 1 + int(_draw(rng) * (len(chain) - 1))

    def policy(messages: list[Message]) -> Message:
        tool_msgs = [m["content"] for m in messages if m["role"] == "tool"]
        n = len(tool_msgs)
        hop, phase = divmod(n, 2)
        if hop < hops:
            if phase == 0:
                return _msg(n, "search", {"query": chain[hop], "k": k})
            titles = dict(re.findall(r"^\[(d\d{3})\] ([^:]+):", tool_msgs[-1], flags=re.M))
            doc_id = next((i for i, t in titles.items() if t == chain[hop]), "d000")
            return _msg(n, "open", {"doc_id": doc_id})
        opened = [m.splitlines()[0].split("]")[0] + "]" for m in tool_msgs[1::2]]
        refs = " ".join(opened) if cite else ""
        return {"role": "assistant", "content": f"{task.data['answer']} {refs}".strip()}

    return retry_timed_out_calls(policy)


PREMATURE_HOPS = ("first", "random")
"""``oracle_policy``'s ``premature_hop`` values."""


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
