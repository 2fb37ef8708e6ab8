"""A model-free engine: scripted policies behind the sampler's session interface.

Used to test the orchestrator, environments, rewards and evaluation without weights, and to replay
known behaviours (a policy that loops, one that answers early) through the real rollout path. The
policy maps the message history to the next assistant message; the session renders it with the
chat format exactly as a model would have to generate it, so token accounting is identical.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from jaxrl_agents.envs.registry import scripted_policy
from jaxrl_agents.types import Message, Task, ToolCallDict

Policy = Callable[[list[Message]], Message]


@dataclasses.dataclass
class ScriptedResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    sampling_logprobs: list[float] | None = None


class ScriptedSession:
    def __init__(self, engine: ScriptedEngine):
        self.engine = engine
        self.messages: list[Message] = []
        self.task: Task | None = None
        self.policy: Policy | None = None
        self.length = 0

    def bind(self, messages: list[Message], task: Task) -> None:
        """The orchestrator hands over the live message list and the task (scripted only)."""
        self.messages, self.task = messages, task

    async def generate(self, new_token_ids: list[int], params: Any) -> ScriptedResult:
        self.length += len(new_token_ids)
        if self.engine.latency_s:
            await asyncio.sleep(self.engine.latency_s)
        chat = self.engine.chat
        if self.policy is None:
            self.policy = self.engine.policy_for(self.task)
            if getattr(chat, "single_call_turns", False):
                self.policy = one_call_per_turn(self.policy)
        msg = self.policy(list(self.messages))
        if self.engine.check_round_trip:
            reason = chat.check_round_trip(msg)
            if reason is not None:
                self.engine.mismatches.append(reason)
        # As the SFT path encodes a written assistant turn: the message's own strings as plain
        # text, the template's markup as control tokens.
        ids = chat.assistant_ids(msg) + [chat.stop_token_ids[0]]
        max_new = getattr(params, "max_new_tokens", len(ids))
        finish = "stop"
        if len(ids) > max_new:
            ids, finish = ids[:max_new], "length"
        self.length += len(ids)
        return ScriptedResult(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish)

    async def close(self) -> None:
        self.engine.open_sessions -= 1


class ScriptedEngine:
    """``policy_factory(task) -> Policy`` builds the policy for each episode (e.g. an env's
    ``oracle_policy``); a plain ``policy`` serves every episode. ``check_round_trip``: parse
    each scripted turn back through the chat format and record mismatches (start-up checks)."""

    def __init__(
        self,
        chat: Any,
        *,
        policy: Policy | None = None,
        policy_factory: Callable[[Task], Policy] | None = None,
        latency_s: float = 0.0,
        check_round_trip: bool = False,
    ):
        if (policy is None) == (policy_factory is None):
            raise ValueError("ScriptedEngine needs exactly one of policy= or policy_factory=")
        self.chat, self.latency_s = chat, latency_s
        self._policy, self._factory = policy, policy_factory
        self.open_sessions = 0
        self.check_round_trip = check_round_trip
        self.mismatches: list[str] = []
        """With ``check_round_trip``: why a scripted turn did not parse back to itself through
        the chat format (template / tool-parser mismatch), one entry per such turn."""

    def policy_for(self, task: Task | None) -> Policy:
        return self._policy if self._policy is not None else self._factory(task)

    async def open_session(self) -> ScriptedSession:
        self.open_sessions += 1
        return ScriptedSession(self)


def one_call_per_turn(policy: Policy) -> Policy:
    """``policy`` for chat templates that render one tool call per assistant turn (Llama 3.1
    raises on more): a turn with k calls is issued as k consecutive one-call turns (the content
    goes with the first), and the wrapped policy sees the history as if it had made them in one
    turn, so its own turn counting is unchanged. The env answers each call as it would have."""
    pending: list[ToolCallDict] = []
    continued: set[int] = set()  # positions of the assistant messages that continue a split turn

    def view(messages: list[Message]) -> list[Message]:
        out: list[Message] = []
        for i, m in enumerate(messages):
            if i in continued:
                head = next(x for x in reversed(out) if x.get("role") == "assistant")
                head["tool_calls"] = [*head.get("tool_calls", []), *m.get("tool_calls", [])]
            else:
                out.append(dict(m))
        return out

    def act(messages: list[Message]) -> Message:
        if pending:
            continued.add(len(messages))
            return {"role": "assistant", "content": "", "tool_calls": [pending.pop(0)]}
        msg = dict(policy(view(messages)))
        calls = list(msg.get("tool_calls") or [])
        if len(calls) > 1:
            pending.extend(calls[1:])
            msg["tool_calls"] = calls[:1]
        return msg

    return act


# -- scripted policies of an environment -------------------------------------------------------

SCRIPTED_POLICIES = ("oracle", "wrong", "loop")
"""The names every env understands (``loop`` is built from its oracle); an env's own registered
names (``jaxrl_agents.envs.register_scripted``) work too."""


def oracle_for(env_cls: type) -> Callable[..., Policy]:
    """The scripted solver of an env (``task, **kw -> policy``), as registered
    (``jaxrl_agents.envs.register_scripted``). Raises ``ValueError`` when the env has none."""
    try:
        return scripted_policy(env_cls, "oracle")
    except ValueError as e:
        raise ValueError(f"{e}; SFT on golden data needs one") from None


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes a parameter called ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def scripted_factory(name: str, env_cls: type) -> Callable[[Task], Policy]:
    """``task -> policy`` for a scripted policy name: ``oracle`` / ``wrong`` or any other name
    registered for the env (``jaxrl_agents.envs.register_scripted``), ``loop`` (repeats the
    oracle's first move forever), or the import path of a factory ``pkg.mod.factory``."""
    if name == "loop":
        oracle = oracle_for(env_cls)

        def loop_factory(task: Task) -> Policy:
            first: dict[str, Message] = {}

            def policy(messages: list[Message]) -> Message:
                if "msg" not in first:
                    first["msg"] = oracle(task)(messages)
                return dict(first["msg"])

            return policy

        return loop_factory
    if name == "oracle":
        return oracle_for(env_cls)
    if "." not in name:
        try:
            return scripted_policy(env_cls, name)
        except ValueError as e:
            raise ValueError(f"{e}; or loop, or a factory's import path pkg.mod.factory") from None
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(
            f"scripted policy {name!r}: not one of {SCRIPTED_POLICIES} nor an importable factory "
            f"({e})"
        ) from e
