"""The asyncio environment base class: one stateful instance per episode.

An ``Env`` subclass declares tools as ``@tool`` methods and fills a few hooks; the base class runs
the turn protocol the rollout orchestrator relies on:

* ``reset(task)`` -> system + user messages and the tools' JSON schemas;
* ``step(message, tool_calls)`` executes the calls in order (each becomes a ``ToolResult`` and a
  ``{"role": "tool"}`` message). A turn with no calls at all is the final answer (``done``);
  a turn whose calls are all malformed is not: the model sees the parse errors and may retry;
* ``verify()`` -> the final :class:`~jaxrl_agents.types.Verdict`.

Per-turn annotations (``Ann.*``) are computed here from the hooks so every env reports them alike:
``EVIDENCE_COMPLETE`` is measured *before* the turn's calls run, so a final answer given before the
evidence was gathered shows ``False``; ``STATE_KEY`` is the GiGPO anchor state before the turn
(below); ``REPEATED_CALLS`` counts the turn's valid calls whose normalised key
(:func:`jaxrl_agents.facts.call_key`) was already seen in the episode: the same count the ``loop``
reward term and the evaluation taxonomy use.

``STATE_KEY`` hashes the task id with one of two summaries of the state before the turn:

* by default ``observed_state()``, only what the policy has observed so far: the opening (system
  and user) messages and the distinct (``call_key``, tool result content) pairs of the episode's
  calls, failed ones included. No env-internal or ground-truth state enters, so GiGPO groups turns
  whose observations match, as in Feng et al. 2025 (anchors on identical env observations);
* with ``EnvConfig.privileged_anchors``: ``state_digest()``, env-internal state the policy did not
  necessarily observe. The base default is the required steps done so far (``completed_steps``,
  judged against the task's ground truth); env overrides say what they read. For ablations only.

Hooks for subclasses: ``system_prompt``, ``user_prompt``, ``setup``, ``completed_steps``,
``constraint_violations``, ``state_digest``, ``judge``; ``required_steps`` defaults to
``task.data["required_steps"]``. Episode limits (turns, tokens, wall time) are the orchestrator's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from jaxrl_agents.envs.tools import ToolBox
from jaxrl_agents.facts import CallHistory, call_key, decode_arguments
from jaxrl_agents.types import Ann, EnvReset, EnvStep, Message, Task, ToolCall, Verdict

REPEATED_CALLS = "repeated_calls"
"""Annotation key (per turn): valid calls whose ``facts.call_key`` already appeared earlier in the
episode (``facts.repeated_call_counts``)."""

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


@dataclasses.dataclass
class EnvConfig:
    """Environment-level settings shared by every env (episode limits live in ``RolloutConfig``)."""

    tool_timeout_s: float = 10.0
    """Wall-clock limit per tool call; past it the model sees a ``timeout`` tool error."""
    tool_output_max_chars: int = 2000
    """Tool output longer than this is cut, with a ``[truncated N chars]`` marker."""
    privileged_anchors: bool = False
    """GiGPO anchor states (``Ann.STATE_KEY``) from ``Env.state_digest``: env-internal state the
    policy did not observe, possibly derived from the ground truth (e.g. which required steps are
    done). For ablations only; by default anchors are built from the observations alone
    (``Env.observed_state``)."""

    def __post_init__(self) -> None:
        if self.tool_timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {self.tool_timeout_s}")
        if self.tool_output_max_chars < 16:
            raise ValueError(
                f"tool_output_max_chars must be >= 16, got {self.tool_output_max_chars}"
            )


class Env:
    """Base class of stateful, asyncio-native tool environments (see module docstring)."""

    name: ClassVar[str] = "env"

    def __init__(self, *, config: EnvConfig | None = None, **env_kwargs: Any):
        fields = {f.name for f in dataclasses.fields(EnvConfig)}
        unknown = sorted(set(env_kwargs) - fields)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown keyword(s) {unknown}; "
                f"EnvConfig fields are {sorted(fields)}"
            )
        self.config = dataclasses.replace(config or EnvConfig(), **env_kwargs)
        self.tools = ToolBox.from_object(self)
        self.task: Task | None = None
        self.answer: str | None = None
        self.done = False
        self.turns = 0
        self.stats = {"tool_calls": 0, "tool_errors": 0, "repeated_calls": 0}
        self._calls = CallHistory()
        self._completed: set[str] = set()
        self._prompt: list[str] = []  # opening messages' contents
        self._observed: set[tuple[str, str]] = set()  # (call_key, result content) pairs

    # -- task generation (subclasses) --------------------------------------------------------------
    @classmethod
    def make_tasks(cls, split: str, n: int, *, seed: int = 0, **kw: Any) -> list[Task]:
        raise NotImplementedError

    # -- hooks ------------------------------------------------------------------------------------
    def system_prompt(self, task: Task) -> str:
        return "You are a helpful assistant. Use the tools when needed."

    def user_prompt(self, task: Task) -> str:
        return task.data["question"]

    def setup(self, task: Task, seed: int) -> None:
        """Build per-episode state (called by ``reset``)."""

    def required_steps(self) -> list[str]:
        return list(self.task.data.get("required_steps", [])) if self.task else []

    def completed_steps(self) -> set[str]:
        """Required-step names done so far (tools add to ``self._completed`` by default)."""
        return set(self._completed)

    def evidence_complete(self) -> bool:
        done = self.completed_steps()
        return all(s in done for s in self.required_steps())

    def constraint_violations(self) -> list[str]:
        return []

    def progress(self) -> float:
        req = self.required_steps()
        done = self.completed_steps()
        return sum(s in done for s in req) / len(req) if req else float(self.answer is not None)

    def state_digest(self) -> Any:
        """JSON-able summary of env-internal state, hashed into ``STATE_KEY`` only with
        ``EnvConfig.privileged_anchors``. Privileged: it may read state the policy never observed,
        possibly derived from the ground truth. The default is the required steps done so far
        (``completed_steps``, e.g. the calculator's expected intermediate values reached)."""
        return sorted(self.completed_steps())

    def observed_state(self) -> Any:
        """JSON-able summary of what the policy has observed before the turn, hashed into
        ``STATE_KEY`` by default: the opening messages' contents and the sorted distinct
        (``facts.call_key``, result content) pairs of the episode's tool calls so far.

        A set, not the ordered transcript: like GiGPO's anchors (the env observation, not the
        path to it), episodes that learned the same results in another order, or with repeated
        calls, share the state, so a loop that re-asks a question returns to its anchor. Order
        that changes the env (bookings, cancellations) shows in the result contents, which then
        differ. The assistant messages' text is left out: it is the policy's action, not the env's
        state (a call enters only with the result it got)."""
        return [self._prompt, sorted(self._observed)]

    def judge(self, answer: str | None) -> Verdict:
        """Score the final answer (``None``: the episode ended without one)."""
        raise NotImplementedError

    # -- protocol ---------------------------------------------------------------------------------
    async def reset(self, task: Task, *, seed: int = 0) -> EnvReset:
        if task.env != self.name:
            raise ValueError(f"{type(self).__name__} cannot run a task of env {task.env!r}")
        self.task, self.answer, self.done, self.turns = task, None, False, 0
        self.stats = {k: 0 for k in self.stats}
        self._calls, self._completed = CallHistory(), set()
        self.setup(task, seed)
        messages = [
            {"role": "system", "content": self.system_prompt(task)},
            {"role": "user", "content": self.user_prompt(task)},
        ]
        self._prompt, self._observed = [str(m["content"]) for m in messages], set()
        return EnvReset(messages=messages, tools=self.tools.schemas())

    def state_key(self) -> str:
        """GiGPO anchor state before the next turn (``Ann.STATE_KEY``): a hash of the task id and
        ``observed_state()``, or ``state_digest()`` with ``EnvConfig.privileged_anchors``."""
        state = self.state_digest() if self.config.privileged_anchors else self.observed_state()
        blob = json.dumps([self.task.id if self.task else None, state], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    async def step(self, message: Message, tool_calls: list[ToolCall]) -> EnvStep:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the final answer")
        ann: dict[str, Any] = {
            Ann.STATE_KEY: self.state_key(),
            Ann.EVIDENCE_COMPLETE: self.evidence_complete(),
        }
        self.turns += 1
        if not tool_calls:
            self.answer, self.done = str(message.get("content") or ""), True
            ann.update({Ann.ANSWERED: True, REPEATED_CALLS: 0})
            ann.update(self._after_turn())
            return EnvStep(messages=[], done=True, annotations=ann)
        results, messages = [], []
        for call in tool_calls:
            result = await self.tools.execute(
                call,
                timeout_s=self.config.tool_timeout_s,
                max_chars=self.config.tool_output_max_chars,
            )
            results.append(result)
            self._observed.add((call_key(call), result.content))
            messages.append(
                {
                    "role": "tool",
                    "name": call.name,
                    "tool_call_id": call.id,
                    "content": result.content,
                }
            )
        repeated = self._calls.add(tool_calls, results)  # a call after its error is a retry
        self.stats["tool_calls"] += len(results)
        self.stats["tool_errors"] += sum(not r.ok for r in results)
        self.stats["repeated_calls"] += repeated
        ann.update({Ann.ANSWERED: False, REPEATED_CALLS: repeated})
        ann.update(self._after_turn())
        return EnvStep(messages=messages, done=False, tool_results=results, annotations=ann)

    def _after_turn(self) -> dict[str, Any]:
        return {
            Ann.CONSTRAINT_VIOLATIONS: self.constraint_violations(),
            Ann.PROGRESS: self.progress(),
        }

    async def verify(self) -> Verdict:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.verify() called before reset()")
        verdict = self.judge(self.answer)
        done = self.completed_steps()
        req = self.required_steps()
        verdict.info.setdefault(Ann.ANSWER, self.answer)
        verdict.info.update(
            {
                Ann.REQUIRED_STEPS: req,
                Ann.MISSING_STEPS: [s for s in req if s not in done],
                Ann.CONSTRAINT_VIOLATIONS: self.constraint_violations(),
                **self.stats,
            }
        )
        return verdict

    async def close(self) -> None:
        """Release resources (connections, files). Safe to call more than once."""


# -- helpers shared by the built-in environments ---------------------------------------------------


def last_number(text: str | None) -> float | None:
    """The last number in ``text`` ("The answer is 1,234." -> 1234.0), or None."""
    if not text:
        return None
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def normalize_text(text: str) -> str:
    """Lowercase, punctuation to spaces, collapsed whitespace (for name comparisons)."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def mentions(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words, ignoring case and punctuation."""
    return f" {normalize_text(phrase)} " in f" {normalize_text(text)} "


SPLITS = ("train", "validation", "heldout")
VALIDATION_FRAC = 0.1
"""Share of problem keys in the ``validation`` split (model selection), next to ``heldout``
(the test split whose success is reported) and ``train``."""


def split_of(key: str, *, heldout_frac: float = 0.2) -> str:
    """Deterministic split of a problem key: the same problem always lands in the same split, so
    ``train``, ``validation`` and ``heldout`` are disjoint by construction. A hash below
    ``heldout_frac`` is held out; the next :data:`VALIDATION_FRAC` is validation."""
    h = int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big") / 2**64
    if h < heldout_frac:
        return "heldout"
    return "validation" if h < heldout_frac + VALIDATION_FRAC else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")


def check_kinds(name: str, kinds: Any, valid: Sequence[str], *, allow_empty: bool = True) -> None:
    """``ValueError`` naming ``name``'s unknown question kinds (or an empty list, unless
    ``allow_empty``) and the valid ones; ``None`` (every kind) passes."""
    if kinds is None:
        return
    bad = sorted(set(kinds) - set(valid))
    if bad or not (kinds or allow_empty):
        raise ValueError(
            f"{name}={list(kinds)}: unknown {bad or 'empty list'}; valid kinds: {list(valid)}"
        )


def calls_from_message(message: Message) -> list[ToolCall]:
    """``ToolCall`` objects from an OpenAI-style assistant message (what the chat layer's parser
    would produce from the rendered text); arguments are decoded by ``facts.decode_arguments``
    (JSON strings; anything that is not an object becomes a call with ``error`` set)."""
    calls = []
    for i, c in enumerate(message.get("tool_calls") or []):
        fn = c.get("function", c)
        args, error = decode_arguments(fn.get("arguments", {}))
        calls.append(
            ToolCall(
                name=fn.get("name", ""), arguments=args, id=c.get("id", f"call_{i}"), error=error
            )
        )
    return calls


async def drive(
    env: Env, task: Task, policy: Any, *, max_turns: int = 10, seed: int = 0
) -> tuple[Verdict, list[Message], list[dict[str, Any]]]:
    """Run a message-level policy (``history -> assistant message``) against ``env`` without a
    model or tokenizer: returns (verdict, messages, per-turn annotations). For tests and debugging;
    training rollouts go through ``rollout.Orchestrator``."""
    reset = await env.reset(task, seed=seed)
    messages, annotations = list(reset.messages), []
    try:
        for _ in range(max_turns):
            message = policy(list(messages))
            messages.append(message)
            step = await env.step(message, calls_from_message(message))
            annotations.append(step.annotations)
            if step.done:
                break
            messages.extend(step.messages)
        return await env.verify(), messages, annotations
    finally:
        await env.close()
