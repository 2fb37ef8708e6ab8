"""Per-episode token capture behind the OpenAI-compatible server: token in / token out.

The trainer opens an episode (:meth:`EpisodeStore.open`) and hands its key to the agent, whose
requests carry it. Per episode the store keeps the messages it has served and the exact token
ids of the current *segment*, built as the orchestrator builds a rollout
(``jaxrl_agents.rollout.orchestrator``):

* the first request's messages rendered once by ``ChatFormat.prompt_ids`` (loss mask 0);
* every sampled turn's ids appended verbatim with their behaviour logprobs (loss mask 1);
* for each later request, ONLY the messages after the served history, rendered by
  ``ChatFormat.continuation_ids`` (loss mask 0). The history is never re-tokenized, and the
  engine session of the segment keeps its KV cache, so a later turn prefills only those ids.

**History check.** A request continues the segment when its messages, in canonical form
(:func:`~jaxrl_agents.serve.messages.canonical`), start with the segment's served messages
followed by one of the alternatives served for the last request, and its tools are the same.
Otherwise (the agent rewrote, trimmed or reordered its history, edited an assistant message,
changed its tools, or retried the same request) the current segment is closed and a new one
starts with the request's full prompt ids; the store counts these rewrites per episode and in
total. A request that continues a turn with no stop token at its end (cut off by ``max_tokens``
or ended by a ``stop`` string) also starts a new segment — the template can only continue a
turn after its stop token — but is not counted as a rewrite.

**Alternatives (n > 1).** The ``n`` choices of a request are sampled on ``n`` engine sessions
(the first on the segment's own session, the others on fresh sessions given the segment's ids).
Only the choice the agent continues with — the one whose message appears in its next request —
is kept: its ids join the segment, its session becomes the segment's, the others are closed. When
a segment ends without its last request being continued (the episode is closed, or the next
request rewrites history), the first choice is kept, or at close the choice whose content equals
the agent's final answer.

**Tool calls.** The agent runs its tools; the store sees their results only as the tool messages
of the next request, which become the turn's tool results. A call that is the policy's fault
before anything runs (unparsable, a tool the request did not offer, arguments that break the
offered schema: :func:`~jaxrl_agents.envs.tools.check_call`, the built-in tools' own check) in a
turn that ended with a stop is recorded as that turn's tool error of its kind, so the reward terms
and reports that read invalid calls see an agent's as they see the built-in loop's (a turn cut
off by a length limit is truncated, not invalid: the built-in loop runs none of its calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from typing import Any

from jaxrl_agents.envs.tools import invalid_call_results
from jaxrl_agents.rollout.orchestrator import decode_sampled
from jaxrl_agents.serve.messages import BadRequest, canonical, served_message, template_message
from jaxrl_agents.types import EndReason, Message, Task, ToolCall, ToolResult, Turn


@dataclasses.dataclass
class ServeLimits:
    """Bounds on what one request may ask; past one: a 4xx naming the limit and the value."""

    max_body_bytes: int = 4 << 20
    """Request body size."""
    max_messages: int = 512
    """Messages of one request."""
    max_n: int = 8
    """Choices of one request (each holds an engine slot while it is sampled)."""
    max_tokens: int = 2048
    """``max_tokens`` of one request (per choice)."""
    default_max_tokens: int = 512
    """Used when a request sets no ``max_tokens``."""
    max_segment_tokens: int = 8192
    """Prompt + turns + continuations of one recorded segment (a training sequence)."""
    max_stop: int = 4
    """``stop`` strings of one request."""
    max_requests: int = 1024
    """Requests (model turns) of one episode: ``rollout.max_turns`` for an agent rollout."""
    continue_truncated: bool = True
    """Whether a request may continue a turn cut off by a length limit (``finish_reason``
    ``length``), in a new segment. An agent rollout refuses it and the episode ends
    ``max_tokens``, as the built-in loop ends it (the template cannot continue such a turn)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.type not in ("bool", bool) and getattr(self, f.name) < 1:
                raise ValueError(f"ServeLimits.{f.name} must be >= 1, got {getattr(self, f.name)}")


@dataclasses.dataclass
class Segment:
    """One recorded training sequence of an episode (see module docstring)."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    reason: str = "first"
    """Why it started: ``first``; ``rewrite`` (the history was not an extension; counted);
    ``cut_off`` (a turn without a stop token was continued); ``restart`` (the previous request
    failed in the engine)."""

    def append(self, ids: list[int], *, sampled: bool, logprobs: list[float] = ()) -> None:
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([int(sampled)] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if sampled else [0.0] * len(ids))


@dataclasses.dataclass
class Choice:
    """One sampled alternative of the last request, not yet kept."""

    message: Message
    calls: list[ToolCall]
    text: str
    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # the engine's: stop | length | cache_full
    stopped: bool  # ends with a stop token: the template can continue after it
    session: Any


@dataclasses.dataclass
class EpisodeRecord:
    """What :meth:`EpisodeStore.close` returns: every recorded segment, oldest first."""

    key: str
    task: Task | None
    segments: list[Segment]
    rewrites: int
    requests: int
    end_hint: EndReason | None = None
    """Set when the server ended the episode's growth itself: ``max_tokens`` (segment token
    limit reached, or a truncated turn it would not continue), ``max_turns`` (request limit)
    or ``context_full`` (the engine's context is full)."""


class _Episode:
    def __init__(self, key: str, task: Task | None, seed: int):
        self.key, self.task, self.seed = key, task, seed
        self.segments: list[Segment] = []
        self.current: Segment | None = None
        self.session: Any = None
        self.pending: list[Choice] = []
        self.rewrites = self.requests = 0
        self.end_hint: EndReason | None = None
        self.lock = asyncio.Lock()
        self.closed = False


class EpisodeStore:
    """The episodes of one server over one engine (``open_session`` / ``generate`` / ``close``).

    Args:
      engine: the sampler (the JAX ``Engine`` or any engine with its session interface).
      chat: the policy's ``ChatFormat``.
      limits: request bounds.
    """

    def __init__(self, engine: Any, chat: Any, limits: ServeLimits | None = None):
        self.engine, self.chat = engine, chat
        self.limits = limits or ServeLimits()
        self._episodes: dict[str, _Episode] = {}
        self.stats = {"requests": 0, "rewrites": 0, "segments": 0, "episodes": 0}

    # -- trainer side -----------------------------------------------------------------------
    def open(self, task: Task | None = None, *, seed: int | None = None) -> str:
        """A new episode; returns its key (send it as ``X-Episode-Id``). ``seed`` seeds the
        requests that bring none (default: the episode's number, so no two episodes of one
        store sample alike)."""
        key = f"ep-{secrets.token_hex(12)}"
        seed = self.stats["episodes"] if seed is None else seed
        self._episodes[key] = _Episode(key, task, seed)
        self.stats["episodes"] += 1
        return key

    async def close(self, key: str, *, final_answer: str | None = None) -> EpisodeRecord:
        """End episode ``key`` (a request still in flight fails) and return its record."""
        ep = self._get(key)
        ep.closed = True
        del self._episodes[key]
        keep = 0
        if final_answer is not None:
            same = [i for i, c in enumerate(ep.pending) if c.message.get("content") == final_answer]
            keep = same[0] if same else 0
        await self._end_segment(ep, keep)
        return EpisodeRecord(key, ep.task, ep.segments, ep.rewrites, ep.requests, ep.end_hint)

    def rewrites(self, key: str) -> int:
        """Rewrites counted so far in open episode ``key``."""
        return self._get(key).rewrites

    def __contains__(self, key: str) -> bool:
        return key in self._episodes

    # -- request side -----------------------------------------------------------------------
    def lookup(self, key: str | None) -> _Episode:
        if not key:
            raise BadRequest(
                "no episode key: send the X-Episode-Id header or an episode_id body field "
                "(episodes are opened by the trainer)",
                param="episode_id",
            )
        if key not in self._episodes:
            raise BadRequest(f"unknown episode {key!r} (not open)", param="episode_id", status=404)
        return self._episodes[key]

    async def prepare(
        self, ep: _Episode, messages: list[Any], tools: list[dict[str, Any]]
    ) -> list[int]:
        """Record a request's messages; returns the ids to feed the segment's session."""
        if ep.requests >= self.limits.max_requests:
            ep.end_hint = EndReason.MAX_TURNS
            raise BadRequest(
                f"the episode has made {ep.requests} requests: "
                f"limits.max_requests={self.limits.max_requests} reached",
                param="messages",
            )
        ep.requests += 1
        self.stats["requests"] += 1
        rendered = [template_message(m, i) for i, m in enumerate(messages)]
        if not rendered:
            raise BadRequest("messages is empty", param="messages")
        seg, keep, start = ep.current, None, "first"
        if seg is not None:
            start = "rewrite" if ep.session is not None else "restart"
            served = [canonical(m) for m in seg.messages]
            got = [canonical(m) for m in rendered]
            if seg.tools == tools and got[: len(served)] == served and len(got) > len(served):
                keep = _continued(ep.pending, got[len(served)], rendered[len(served)])
            if keep is not None and not ep.pending[keep].stopped:
                start = "cut_off"
                if ep.pending[keep].finish_reason != "stop" and not self.limits.continue_truncated:
                    ep.end_hint = EndReason.MAX_TOKENS
                    raise BadRequest(
                        "the last turn was cut off by a length limit (finish_reason "
                        f"{ep.pending[keep].finish_reason!r}) and this episode may not continue "
                        "it (limits.continue_truncated=false)",
                        param="messages",
                    )
        if seg is not None and keep is not None and start != "cut_off":
            new = rendered[len(seg.messages) + 1 :]
            ids = self._render(self.chat.continuation_ids, new, tools)
            await self._commit(ep, keep)
            self._attach_results(seg, new)
            seg.messages.extend(new)
            seg.append(ids, sampled=False)
            return ids
        # A new segment: the first request, a rewritten history, or a cut-off turn continued.
        ids = self._render(self.chat.prompt_ids, rendered, tools)
        await self._end_segment(ep, keep or 0)
        if start == "rewrite":
            ep.rewrites += 1
            self.stats["rewrites"] += 1
        ep.current = Segment(rendered, list(tools), [], [], [], len(ids), reason=start)
        ep.current.append(ids, sampled=False)
        session = await self.engine.open_session()
        if ep.closed:  # closed while waiting for a slot
            await session.close()
            raise BadRequest(f"episode {ep.key!r} was closed", status=409)
        ep.session = session
        self._bind(session, ep)
        self.stats["segments"] += 1
        return ids

    @staticmethod
    def _render(fn: Any, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        try:
            return fn(messages, tools or None)
        except ValueError as e:
            raise BadRequest(f"cannot render the messages: {e}", param="messages") from e

    def room(self, ep: _Episode) -> int:
        """Tokens the current segment may still grow by."""
        return self.limits.max_segment_tokens - len(ep.current.token_ids)

    async def sample(
        self, ep: _Episode, new_ids: list[int], params: list[Any], *, tools_on: bool
    ) -> list[Choice]:
        """Sample one choice per ``params`` entry after ``new_ids`` and hold them as pending."""
        seg, extra = ep.current, []
        feeds = [new_ids] + [list(seg.token_ids) for _ in params[1:]]
        try:
            for _ in params[1:]:
                extra.append(await self.engine.open_session())
                self._bind(extra[-1], ep)
            sessions = [ep.session, *extra]
            results = await asyncio.gather(
                *(s.generate(f, p) for s, f, p in zip(sessions, feeds, params, strict=True))
            )
        except BaseException as e:
            for s in extra:
                await s.close()
            await self._drop_session(ep)
            if isinstance(e, ValueError):  # the engine's own bounds (stop sequences, vocab)
                raise BadRequest(f"the engine refused the request: {e}") from e
            raise
        stops = set(self.chat.stop_token_ids)
        choices = []
        for res, session, p in zip(results, sessions, params, strict=True):
            ids = [int(i) for i in res.token_ids]
            s_lp = getattr(res, "sampling_logprobs", None)
            text = decode_sampled(self.chat, _without_stop_sequence(ids, p))
            parsed, calls = self.chat.parse_assistant(text)
            message = served_message(parsed, calls, tools_on=tools_on, raw=text)
            stopped = bool(ids) and ids[-1] in stops and res.finish_reason == "stop"
            lps = list(res.logprobs if s_lp is None else s_lp)
            choices.append(
                Choice(
                    message,
                    calls if tools_on else [],
                    text,
                    ids,
                    lps,
                    res.finish_reason,
                    stopped,
                    session,
                )
            )
            if res.finish_reason == "cache_full":
                ep.end_hint = EndReason.CONTEXT_FULL
        if ep.closed:  # closed while sampling (its own session is closed already)
            for c in choices[1:]:
                await c.session.close()
            raise BadRequest(f"episode {ep.key!r} was closed", status=409)
        ep.pending = choices
        return choices

    # -- internals ---------------------------------------------------------------------------
    def _get(self, key: str) -> _Episode:
        if key not in self._episodes:
            raise KeyError(f"unknown episode {key!r}")
        return self._episodes[key]

    async def _commit(self, ep: _Episode, k: int) -> None:
        """Keep pending choice ``k``: its ids join the segment, its session becomes the
        segment's; the other choices' sessions are closed."""
        seg, choice = ep.current, ep.pending[k]
        start = len(seg.token_ids)
        seg.append(choice.ids, sampled=True, logprobs=choice.logprobs)
        seg.messages.append(choice.message)
        for i, c in enumerate(ep.pending):
            if i != k:
                await c.session.close()
        ep.session, ep.pending = choice.session, []
        if not choice.ids:  # a full context sampled nothing: no turn (continuing it is cut_off)
            return
        seg.turns.append(
            Turn(
                index=len(seg.turns),
                start=start,
                end=len(seg.token_ids),
                text=choice.text,
                tool_calls=list(choice.calls),
                finish_reason=choice.finish_reason,
                # a turn cut off by a length limit is truncated, not an invalid call (as in the
                # built-in loop, which runs no call of such a turn)
                tool_results=invalid_call_results(choice.calls, _offered(seg.tools))
                if choice.finish_reason == "stop"
                else [],
            )
        )

    async def _end_segment(self, ep: _Episode, keep: int) -> None:
        if ep.current is None:
            return
        if ep.pending:
            await self._commit(ep, min(keep, len(ep.pending) - 1))
        await self._drop_session(ep)
        if ep.current.turns:
            ep.segments.append(ep.current)
        ep.current = None

    async def _drop_session(self, ep: _Episode) -> None:
        session, ep.session = ep.session, None
        if session is not None:
            await session.close()

    @staticmethod
    def _bind(session: Any, ep: _Episode) -> None:
        """Scripted sessions read the live message history, as the orchestrator binds them."""
        if hasattr(session, "bind"):
            session.bind(ep.current.messages, ep.task)

    @staticmethod
    def _attach_results(seg: Segment, new: list[Message]) -> None:
        """Tool messages answering the last turn's calls become that turn's tool results."""
        if not seg.turns:
            return
        turn = seg.turns[-1]
        judged = {id(r.call) for r in turn.tool_results}  # invalid calls, recorded as such
        by_id = {c.id: c for c in turn.tool_calls if id(c) not in judged}  # the served ids
        for m in new:
            if m["role"] == "tool" and m.get("tool_call_id") in by_id:
                turn.tool_results.append(ToolResult(by_id[m["tool_call_id"]], m["content"]))


def _offered(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Name -> parameters schema of the tools a request offered (OpenAI ``tools`` form)."""
    return {
        t["function"]["name"]: t["function"].get("parameters") or {}
        for t in tools
        if isinstance(t.get("function"), dict) and "name" in t["function"]
    }


def _continued(pending: list[Choice], key: tuple, message: Message) -> int | None:
    """Which pending choice ``message`` (canonical form ``key``) is: the first that matches,
    preferring one whose tool-call ids match too (alternatives alike but for their ids)."""
    same = [k for k, c in enumerate(pending) if canonical(c.message) == key]
    ids = [c.get("id") for c in message.get("tool_calls") or []]
    exact = [
        k for k in same if [c["id"] for c in pending[k].message.get("tool_calls") or []] == ids
    ]
    return (exact or same or [None])[0]


def _without_stop_sequence(ids: list[int], params: Any) -> list[int]:
    """``ids`` without a trailing stop sequence (OpenAI leaves the stop string out of the
    text; the record keeps every sampled id)."""
    for seq in getattr(params, "stop_sequences", ()):
        if len(ids) >= len(seq) and tuple(ids[-len(seq) :]) == tuple(seq):
            return ids[: -len(seq)]
    return ids
