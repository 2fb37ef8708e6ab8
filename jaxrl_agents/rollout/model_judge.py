"""A judge that is a model: a rubric score of an episode, sampled from a local model.

:class:`ModelJudge` is an async callable ``(traj) -> float``, usable as the ``judge`` reward term's
judge (``RewardComposer(cfg, judges={"model": judge})``). For each episode it renders the final
answer (``on='answer'``) or the whole trajectory (``on='trajectory'``: the task, the assistant
turns, their tool calls and the tool results, cut to ``max_prompt_tokens``) under the rubric,
prompts the judge model through its own chat format and samples the judgment with an engine
session (greedy by default). The judgment's last line must be ``SCORE: <number in [lo, hi]>``;
:func:`parse_score` reads it (a few tolerant spellings) and the score is mapped onto [0, 1].

A missing, non-numeric or out-of-range score raises :class:`JudgmentError`: the ``judge`` term's
``on_error`` decides what it becomes (``raise``: that episode ends as ``reward_error``; ``zero``:
score 0, counted in ``JUDGE_FAILURES``), never the whole step. Judgments are cached by the hash
of the prompt's tokens, so an identical request is sampled once. :class:`JudgeStats` counts
calls, cache hits, errors and seconds for the training step's log row (``judge/*``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from jaxrl_agents import facts
from jaxrl_agents.generation.config import SamplingParams
from jaxrl_agents.types import Message, Trajectory

JUDGE_ON = ("answer", "trajectory")

DEFAULT_RUBRIC = (
    "Judge whether the assistant solved the user's task: a correct, complete final answer that "
    "the tool results support scores high; a wrong, missing or unsupported one scores low."
)

# Tolerant spellings of the score line, tried in order; the last match in the text wins.
_NUMBER = r"([-+]?\d+(?:\.\d+)?|[-+]?\.\d+)"
_PATTERNS = (
    re.compile(r"\bscore\b\s*[:=]?\s*\**\s*" + _NUMBER, re.IGNORECASE),
    re.compile(r"\bscore\b[^\n\d+-]{0,20}" + _NUMBER, re.IGNORECASE),
    re.compile(r"^\s*" + _NUMBER + r"\s*(?:/\s*\d+(?:\.\d+)?)?\s*$", re.MULTILINE),
)


class JudgmentError(ValueError):
    """The judge model's output holds no usable score (missing, non-numeric, out of range)."""


def parse_score(text: str, lo: float, hi: float) -> float:
    """The score of a judgment in ``[lo, hi]``: the last ``SCORE: x`` (also ``score = x``,
    ``Score is x``, ``**Score:** x``), else a last line that is just a number (``7`` or ``7/10``).
    :class:`JudgmentError` when none is found or it lies outside ``[lo, hi]``."""
    for pattern in _PATTERNS:
        found = pattern.findall(text)
        if found:
            value = float(found[-1])
            if not lo <= value <= hi:
                raise JudgmentError(f"judge score {value:g} is outside [{lo:g}, {hi:g}]")
            return value
    tail = text.strip().splitlines()[-1:] or [""]
    raise JudgmentError(f"no 'SCORE: <number>' in the judgment (last line {tail[0][:80]!r})")


def _task_text(traj: Trajectory) -> str:
    user = next((m for m in traj.messages if m.get("role") == "user"), None)
    return str(user.get("content") or "") if user else str(traj.task.data)


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, sort_keys=True)


def render_answer(traj: Trajectory) -> str:
    """The task and the episode's final answer (``facts.answer_turn``, else the last turn)."""
    k = facts.answer_turn(traj)
    turn = traj.turns[k] if k is not None else (traj.turns[-1] if traj.turns else None)
    answer = turn.text.strip() if turn is not None else "(no answer)"
    return f"TASK:\n{_task_text(traj)}\n\nFINAL ANSWER:\n{answer or '(empty)'}"


def render_trajectory(traj: Trajectory) -> str:
    """The task, then every assistant turn with its tool calls and their results, as text."""
    lines = [f"TASK:\n{_task_text(traj)}", ""]
    for turn in traj.turns:
        lines.append(f"ASSISTANT (turn {turn.index + 1}):\n{turn.text.strip() or '(empty)'}")
        for call in turn.tool_calls:
            lines.append(f"TOOL CALL: {call.name}({_arguments(call.arguments)})")
            if call.error:
                lines.append(f"  invalid call: {call.error}")
        for r in turn.tool_results:
            kind = f" [{r.error_kind.value}]" if r.error_kind is not None else ""
            lines.append(f"TOOL RESULT ({r.call.name}){kind}:\n{r.content.strip()}")
        lines.append("")
    lines.append(f"EPISODE END: {traj.end_reason.value}")
    return "\n".join(lines)


@dataclasses.dataclass
class JudgeStats:
    """What the judge did since the last :meth:`take`: sampled calls, cache hits, judgments that
    failed (unparsable, out of range, or the engine raised) and the seconds spent sampling."""

    calls: int = 0
    cache_hits: int = 0
    errors: int = 0
    seconds: float = 0.0

    def take(self) -> dict[str, float]:
        """The counts as ``judge/*`` log entries; zeroes them."""
        row = {
            "judge/calls": float(self.calls),
            "judge/cache_hits": float(self.cache_hits),
            "judge/errors": float(self.errors),
            "judge/s": float(self.seconds),
        }
        self.calls, self.cache_hits, self.errors, self.seconds = 0, 0, 0, 0.0
        return row


class ModelJudge:
    """``await judge(traj) -> score in [0, 1]`` from a judge model (see the module docstring).

    Args:
      chat: the judge model's ``ChatFormat`` (its own template and stop tokens).
      engine: anything with ``async open_session()`` (the JAX ``Engine``, a ``ScriptedEngine``);
        None until :meth:`attach` (a call before raises, which the term's ``on_error`` handles).
      rubric: what a good episode is; the prompt adds the task, the episode and the format.
      on: ``answer`` (the task and the final answer) or ``trajectory`` (the whole episode).
      scale: ``(lo, hi)``, the range the judge is asked to score in; mapped onto [0, 1].
      max_new_tokens: the judgment's length limit.
      max_prompt_tokens: the rendered episode is cut (its middle) so the prompt holds this many.
      cache: reuse the judgment of an identical prompt instead of sampling it again.
      temperature: 0 is greedy.
    """

    def __init__(
        self,
        chat: Any,
        engine: Any = None,
        *,
        rubric: str = DEFAULT_RUBRIC,
        on: str = "answer",
        scale: Sequence[float] = (0.0, 10.0),
        max_new_tokens: int = 32,
        max_prompt_tokens: int = 384,
        cache: bool = True,
        temperature: float = 0.0,
    ):
        if on not in JUDGE_ON:
            raise ValueError(f"on={on!r}: expected one of {', '.join(JUDGE_ON)}")
        lo, hi = (float(x) for x in scale)
        if not lo < hi:
            raise ValueError(f"scale={list(scale)}: needs low < high")
        self.chat, self.engine = chat, engine
        self.rubric, self.on, self.scale = rubric.strip(), on, (lo, hi)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.cache_enabled, self.temperature = cache, temperature
        self.stats = JudgeStats()
        self._cache: dict[str, str] = {}
        self._pending: dict[str, asyncio.Future] = {}

    def attach(self, engine: Any) -> None:
        """Sample with ``engine`` from now on (a started one); None detaches."""
        self.engine = engine
        self._pending.clear()

    # -- the prompt ------------------------------------------------------------------------------
    def messages(self, body: str) -> list[Message]:
        lo, hi = self.scale
        system = (
            "You are a strict grader of an AI assistant's work.\n"
            f"Rubric: {self.rubric}\n"
            f"Reply with at most two short sentences of reasons, then a last line exactly of the "
            f"form 'SCORE: <number from {lo:g} to {hi:g}>'."
        )
        what = "final answer" if self.on == "answer" else "episode"
        user = f"Grade this {what}.\n\n{body}\n\nEnd with the line 'SCORE: <number>'."
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def prompt_ids(self, traj: Trajectory) -> list[int]:
        """The judge prompt's tokens: the rendered episode, its middle cut to fit."""
        body = render_answer(traj) if self.on == "answer" else render_trajectory(traj)
        ids = self.chat.prompt_ids(self.messages(body), None)
        over = len(ids) - self.max_prompt_tokens
        if over <= 0:
            return ids
        toks = self.chat.encode_plain(body)
        decode = self.chat.tokenizer.decode
        for _ in range(4):  # decoding and re-encoding a cut can shift a few tokens: shrink again
            keep = len(toks) - over - 16  # room for the cut marker's own tokens
            if keep < 32:
                raise JudgmentError(
                    f"the judge prompt's template and rubric take {len(ids) - len(toks)} of "
                    f"max_prompt_tokens={self.max_prompt_tokens}: raise it or shorten the rubric"
                )
            head, tail = toks[: keep // 2], toks[len(toks) - (keep - keep // 2) :]
            cut = f"{decode(head)}\n[... {len(toks) - keep} tokens cut ...]\n{decode(tail)}"
            cut_ids = self.chat.prompt_ids(self.messages(cut), None)
            if len(cut_ids) <= self.max_prompt_tokens:
                return cut_ids
            over += len(cut_ids) - self.max_prompt_tokens
        raise JudgmentError(f"cannot cut the episode to max_prompt_tokens={self.max_prompt_tokens}")

    # -- judging ---------------------------------------------------------------------------------
    async def __call__(self, traj: Trajectory) -> float:
        try:
            ids = self.prompt_ids(traj)
            text = await self._judgment(ids)
            lo, hi = self.scale
            return (parse_score(text, lo, hi) - lo) / (hi - lo)
        except Exception:
            self.stats.errors += 1
            raise

    async def judgment_text(self, traj: Trajectory) -> str:
        """The raw judgment of ``traj`` (cached as :meth:`__call__`'s)."""
        return await self._judgment(self.prompt_ids(traj))

    async def _judgment(self, ids: list[int]) -> str:
        key = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
        if self.cache_enabled:
            if key in self._cache:
                self.stats.cache_hits += 1
                return self._cache[key]
            if key in self._pending:  # the same prompt is being sampled: share its judgment
                self.stats.cache_hits += 1
                return await asyncio.shield(self._pending[key])
        future = asyncio.get_running_loop().create_future()
        if self.cache_enabled:
            self._pending[key] = future
        try:
            text = await self._sample(ids)
        except BaseException as e:
            # A request sharing this judgment gets an error of its own, never this one's
            # cancellation (e.g. its ``timeout_s``), which would cancel its caller's task.
            shared = e if isinstance(e, Exception) else RuntimeError(f"judgment cancelled: {e!r}")
            future.set_exception(shared)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            self._pending.pop(key, None)
        future.set_result(text)
        if self.cache_enabled:
            self._cache[key] = text
        return text

    async def _sample(self, ids: list[int]) -> str:
        if self.engine is None:
            raise RuntimeError("the model judge has no engine (not started)")
        self.stats.calls += 1
        t = time.perf_counter()
        session = await self.engine.open_session()
        try:
            if hasattr(session, "bind"):  # a scripted judge reads the prompt's messages
                session.bind(self._bound_messages(ids), None)
            params = SamplingParams(
                temperature=self.temperature,
                max_new_tokens=self.max_new_tokens,
                stop_token_ids=tuple(self.chat.stop_token_ids),
                seed=0,
            )
            res = await session.generate(list(ids), params)
        finally:
            await session.close()
            self.stats.seconds += time.perf_counter() - t
        stop = set(self.chat.stop_token_ids)
        return self.chat.tokenizer.decode(
            [i for i in res.token_ids if i not in stop], skip_special_tokens=True
        )

    def _bound_messages(self, ids: list[int]) -> list[Message]:
        return [{"role": "user", "content": self.chat.tokenizer.decode(ids)}]
