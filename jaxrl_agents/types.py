"""Host-side records shared by every layer, and the glossary of array axis names.

Host data (strings, ragged lists, tool calls) lives in the dataclasses here; fixed-shape device
arrays live in the NamedTuples of ``jaxrl_agents.batches`` (``rollout.packing`` is the one module
that converts between the two).

Axis glossary used in shape annotations across the package (``Float['B T V']`` style docstrings):

=====  =====================================================================
``B``  batch (trajectories / sequences)
``T``  tokens along a sequence (padded to a bucket)
``S``  KV-cache length (slots' maximum context)
``V``  vocabulary
``D``  model width (hidden size); ``F`` MLP width
``H``  query heads; ``K`` key/value heads; ``Dh`` head dim
``L``  decoder layers
``N``  turns of an episode (padded to ``max_turns``)
``G``  samples per task (group size)
=====  =====================================================================

Messages are plain OpenAI-style dicts (``{"role": ..., "content": ..., "tool_calls": [...]}``) so
they serialise to JSONL and feed Hugging Face chat templates without conversion; :class:`Message`
and :class:`ToolCallDict` type them (for annotations only: at run time they are ordinary dicts).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict


class ToolCallFunction(TypedDict):
    """The ``function`` of a :class:`ToolCallDict`: the tool's name and its arguments, a dict (the
    package's own messages) or a JSON string (OpenAI's wire form, decoded when rendered)."""

    name: str
    arguments: dict[str, Any] | str


class ToolCallDict(TypedDict):
    """One entry of an assistant message's ``tool_calls``, in OpenAI's function-call form
    (``ToolCall.to_openai`` makes one; :class:`ToolCall` is the parsed record, with its error)."""

    id: str
    type: Literal["function"]
    function: ToolCallFunction


class _MessageKeys(TypedDict):
    """The keys every :class:`Message` has."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


# The optional keys through total=False, not NotRequired[...]: under ``from __future__ import
# annotations`` Python 3.11 would list NotRequired keys in ``__required_keys__``.
class Message(_MessageKeys, total=False):
    """An OpenAI-style chat message: ``role`` in {system, user, assistant, tool}, ``content``
    (rendering reads a missing or None content as ""), and by role: ``tool_calls`` and
    ``reasoning_content`` (assistant: the calls it made, the reasoning a thinking template shows
    apart), ``tool_call_id`` / ``name`` (tool: the call answered, the tool's name)."""

    tool_calls: list[ToolCallDict]
    reasoning_content: str
    tool_call_id: str
    name: str


class EndReason(str, enum.Enum):  # noqa: UP042 (StrEnum would change str())
    """Why an episode ended. Every trajectory carries exactly one."""

    ANSWERED = "answered"  # the policy gave a final answer (no tool call) or the env said done
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"  # the episode's total-token budget ran out
    CONTEXT_FULL = "context_full"  # the sampler's KV cache / context window is full
    EPISODE_TIMEOUT = "episode_timeout"
    ENV_ERROR = "env_error"  # the environment itself raised (not a tool: tools fail softly)
    REWARD_ERROR = "reward_error"  # a reward term raised or the reward was not finite: the
    # episode is kept for the record but left out of the update


class ToolErrorKind(str, enum.Enum):  # noqa: UP042
    """Why a tool call produced an error message instead of a result."""

    MALFORMED = "malformed"  # could not be parsed (bad JSON, missing name)
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"  # violates the tool's JSON schema
    TOOL_ERROR = "tool_error"  # the tool raised
    TIMEOUT = "timeout"


class Ann:
    """Standard annotation keys. Environments put these in ``EnvStep.annotations`` (per turn) and
    ``Verdict.info`` (per episode); reward terms and the evaluation taxonomy read them. All keys
    are optional: a consumer treats a missing key as "no information"."""

    # per turn (EnvStep.annotations / Turn.annotations)
    EVIDENCE_COMPLETE = "evidence_complete"  # bool: all evidence the answer needs was gathered
    ANSWERED = "answered"  # bool: this turn gave a final answer
    CONSTRAINT_VIOLATIONS = "constraint_violations"  # list[str]: constraints the state breaks now
    PROGRESS = "progress"  # float in [0, 1]: env-provided progress shaping signal
    STATE_KEY = "state_key"  # str: digest of the env state before this turn (GiGPO anchors)
    # per episode (Verdict.info / Trajectory.info)
    REQUIRED_STEPS = "required_steps"  # list[str]: steps a correct solution must take
    MISSING_STEPS = "missing_steps"  # list[str]: required steps that were never taken
    EVIDENCE_IN_ANSWER = "evidence_in_answer"  # bool: retrieved evidence actually used in answer
    EXPECTED = "expected"  # the ground-truth answer, for reports
    ANSWER = "answer"  # the parsed final answer
    SLICES = "slices"  # list[str]: the report slices the episode belongs to ("two-step", ...)


@dataclasses.dataclass
class ToolCall:
    """One tool call parsed from assistant text. ``error`` is set when parsing failed; such a call
    is never executed, it becomes a ``MALFORMED`` tool error the model sees."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    raw: str = ""
    error: str | None = None

    def to_openai(self) -> ToolCallDict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def signature(self) -> str:
        """Exact canonical text of name + arguments (loop detection uses the normalised
        ``jaxrl_agents.facts.call_key``)."""
        return self.name + json.dumps(self.arguments, sort_keys=True, default=str)


@dataclasses.dataclass
class ToolResult:
    """What executing one ``ToolCall`` produced (``content`` is what the model will read)."""

    call: ToolCall
    content: str
    error_kind: ToolErrorKind | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclasses.dataclass
class Task:
    """One problem instance. ``data`` is env-specific and JSON-serialisable."""

    id: str
    env: str
    split: str  # "train" | "heldout"
    data: dict[str, Any]


@dataclasses.dataclass
class EnvReset:
    messages: list[Message]  # opening messages (system, user)
    tools: list[dict[str, Any]]  # OpenAI function-calling JSON schemas


@dataclasses.dataclass
class EnvStep:
    """What ``Env.step`` returns after executing one assistant turn."""

    messages: list[Message]  # new messages (tool results, maybe a user follow-up)
    done: bool
    tool_results: list[ToolResult] = dataclasses.field(default_factory=list)
    reward: float | None = None  # optional env-provided per-turn reward signal
    annotations: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Verdict:
    """The environment's final judgement of an episode."""

    success: bool
    score: float = 0.0  # in [0, 1]; partial credit where the env defines it
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Turn:
    """One assistant turn. ``start``/``end`` index the sampled tokens in ``Trajectory.token_ids``
    (``end`` exclusive); the env's reply tokens follow up to the next turn's ``start``."""

    index: int
    start: int
    end: int
    text: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_results: list[ToolResult] = dataclasses.field(default_factory=list)
    finish_reason: str = ""  # sampler's: "stop" | "length" | "cache_full"
    annotations: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_reward: float | None = None
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)  # turn-assigned
    latency_s: dict[str, float] = dataclasses.field(default_factory=dict)  # generate / tools


@dataclasses.dataclass
class Trajectory:
    """A whole episode: the messages, the exact token ids the policy saw and produced, and every
    signal the reward, advantage and evaluation code needs.

    Invariants: ``len(token_ids) == len(loss_mask) == len(logprobs)``; ``loss_mask[i] == 1`` iff
    token ``i`` was sampled by the policy; ``logprobs[i]`` is the behaviour logprob of token
    ``i``: under the distribution it was sampled from (temperature and filters applied; the
    policy's own when sampling at temperature 1 unfiltered or greedily), 0.0 where the mask is 0.
    """

    task: Task
    messages: list[Message]
    tools: list[dict[str, Any]]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turns: list[Turn]
    end_reason: EndReason
    group_id: int = 0
    sample_index: int = 0
    verdict: Verdict | None = None
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)
    reward: float = 0.0
    policy_version: int = 0  # trainer step whose weights sampled it (staleness accounting)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None  # traceback summary for ENV_ERROR

    # -- derived views -------------------------------------------------------------------
    @property
    def success(self) -> bool:
        return bool(self.verdict and self.verdict.success)

    @property
    def info(self) -> dict[str, Any]:
        return self.verdict.info if self.verdict else {}

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [r for t in self.turns for r in t.tool_results]

    def count_errors(self, kind: ToolErrorKind | None = None) -> int:
        """Tool results that are errors (of ``kind``, or of any kind when None)."""
        return sum(
            1
            for r in self.tool_results
            if r.error_kind is not None and (kind is None or r.error_kind == kind)
        )

    @property
    def num_generated_tokens(self) -> int:
        return int(sum(self.loss_mask))

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        def call(c: dict) -> ToolCall:
            return ToolCall(**c)

        def result(r: dict) -> ToolResult:
            kind = r.get("error_kind")
            return ToolResult(
                call=call(r["call"]),
                content=r["content"],
                error_kind=ToolErrorKind(kind) if kind else None,
                elapsed_s=r.get("elapsed_s", 0.0),
            )

        turns = [
            Turn(
                **{
                    **t,
                    "tool_calls": [call(c) for c in t["tool_calls"]],
                    "tool_results": [result(r) for r in t["tool_results"]],
                }
            )
            for t in d["turns"]
        ]
        verdict = Verdict(**d["verdict"]) if d.get("verdict") else None
        return cls(
            **{
                **d,
                "task": Task(**d["task"]),
                "turns": turns,
                "end_reason": EndReason(d["end_reason"]),
                "verdict": verdict,
            }
        )


def _to_jsonable(x: Any) -> Any:
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {k: _to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_to_jsonable(v) for v in x]
    return x


def write_jsonl(
    path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False
) -> None:
    """Write trajectories one JSON object per line (``append`` to extend an existing file)."""
    with open(path, "a" if append else "w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), default=str) + "\n")


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a trajectory record ({e})") from e
