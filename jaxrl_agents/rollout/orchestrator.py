"""The rollout orchestrator: many concurrent multi-turn episodes against one sampler engine.

Token in / token out. An episode's ``token_ids`` are built only from

* the opening messages rendered once by the chat template (``ChatFormat.prompt_ids``),
* the ids the sampler returned, appended verbatim (``loss_mask`` 1, rollout logprobs kept),
* the env's reply rendered once per turn (``ChatFormat.continuation_ids``, ``loss_mask`` 0).

Nothing is decoded and re-tokenized for training: decoding happens only to hand the env readable
text. Every episode ends with exactly one :class:`~jaxrl_agents.types.EndReason`; tool failures are
messages to the model (the env's job), an env that raises ends the episode with ``env_error``, and
the episode deadline is enforced here, so a hanging env cannot stall a rollout.

Engines are duck-typed: anything with ``async open_session()`` returning a session with
``async generate(new_ids, params) -> GenerationResult`` and ``async close()`` works — the JAX
engine, or :class:`~jaxrl_agents.rollout.scripted.ScriptedEngine` for model-free tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from jaxrl_agents.envs.tools import invalid_call_results
from jaxrl_agents.generation.config import Sampling
from jaxrl_agents.types import (
    Ann,
    EndReason,
    EnvStep,
    Message,
    Task,
    Trajectory,
    Turn,
)

MALFORMED_CALLS = ("feedback", "as_text")
"""The values of ``RolloutConfig.malformed_calls``."""


@dataclasses.dataclass
class RolloutConfig:
    """Episode limits and sampling settings for rollouts."""

    group_size: int = 4
    """Samples per task (G). Group estimators (GRPO, RLOO, ...) need G >= 2."""
    max_turns: int = 6
    """Assistant turns per episode before it ends with ``max_turns``."""
    max_new_tokens: int = 64
    """Sampled tokens per assistant turn."""
    max_total_tokens: int = 512
    """Episode token budget (prompt + every turn + env replies); past it: ``max_tokens``."""
    episode_timeout_s: float = 120.0
    """Wall-clock deadline per episode (generation + tools); past it: ``episode_timeout``."""
    concurrency: int = 64
    """Episodes in flight at once (the engine's slots bound this further)."""
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    """Temperature and filters of training rollouts (and of ``jaxrl-eval`` with ``samples > 1``,
    e.g. ``rollout.sampling.temperature=0.7``); held-out evaluation with one sample per task is
    greedy."""
    malformed_calls: str = "feedback"
    """What a tool call that cannot be parsed does: ``feedback`` (an error tool message the
    model reads; the episode goes on) or ``as_text`` (as an OpenAI-compatible server shows it
    to an agent: no call, so a turn left without a parsed call is the final answer). Either way
    it is recorded as a ``malformed`` invalid call. Agent rollouts (``agent``) are ``as_text``
    by nature."""
    agent: str | None = None
    """An agent function in place of the built-in episode loop: the import path
    (``package.module:function``) of an ``async (client, task) -> final answer`` that talks to
    the policy through an ``openai.AsyncOpenAI`` client (``jaxrl_agents.serve.agent_collector``;
    needs the ``serve`` extra). Training and evaluation use it, under the same limits
    (``max_turns``, ``max_new_tokens``, ``max_total_tokens``) and sampling seeds."""

    def __post_init__(self) -> None:
        for name in (
            "group_size",
            "max_turns",
            "max_new_tokens",
            "max_total_tokens",
            "concurrency",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.episode_timeout_s <= 0:
            raise ValueError(f"rollout.episode_timeout_s must be > 0, got {self.episode_timeout_s}")
        if self.malformed_calls not in MALFORMED_CALLS:
            raise ValueError(
                f"rollout.malformed_calls={self.malformed_calls!r}; expected one of "
                f"{', '.join(MALFORMED_CALLS)}"
            )


class _Session(Protocol):
    async def generate(self, new_token_ids: list[int], params: Any) -> Any: ...
    async def close(self) -> None: ...


class _Engine(Protocol):
    async def open_session(self) -> _Session: ...


EnvFactory = Callable[[], Any]
"""Returns a fresh ``Env`` for one episode."""


def episode_seed(seed: int, task_id: str, sample_index: int) -> int:
    """A stable per-episode seed: same (seed, task, sample) -> same sampling keys in every run."""
    return zlib.crc32(f"{seed}/{task_id}/{sample_index}".encode()) & 0x7FFFFFFF


def turn_seed(ep_seed: int, turn_index: int) -> int:
    """The sampling seed of an episode's ``turn_index``-th generation (32 bits, as the engine
    keeps it). The server's agent episodes use the same rule, so an agent that sends what the
    built-in loop sends samples the same tokens."""
    return (ep_seed * 1009 + turn_index) & 0xFFFFFFFF


async def score_episode(reward_fn: Callable[[Trajectory], Any], traj: Trajectory) -> None:
    """Apply ``reward_fn`` (e.g. ``RewardComposer.acompute``) to one trajectory. A term that
    raises, or a total that is not finite, ends the episode as ``reward_error`` (reward 0, the
    error recorded): it is left out of the update instead of poisoning the whole batch."""
    import math

    try:
        out = reward_fn(traj)
        if asyncio.iscoroutine(out):
            await out
        if not math.isfinite(traj.reward):
            raise ValueError(f"non-finite reward {traj.reward} (terms {traj.reward_terms})")
    except Exception as e:  # noqa: BLE001 - one bad episode must not end the step
        was = traj.end_reason.value
        traj.end_reason, traj.reward = EndReason.REWARD_ERROR, 0.0
        traj.reward_terms = {}
        for turn in traj.turns:
            turn.reward_terms = {}
        traj.error = (traj.error or "") + f"reward failed ({was}): {type(e).__name__}: {e}"


def decode_sampled(chat: Any, ids: Sequence[int]) -> str:
    """Readable text of a sampled turn for the env (stop tokens dropped, markup tokens kept)."""
    stop = set(chat.stop_token_ids)
    return chat.tokenizer.decode([i for i in ids if i not in stop], skip_special_tokens=False)


class _EpisodeState:
    """Mutable episode record, kept outside the episode coroutine so a timeout keeps the partial
    trajectory."""

    def __init__(self, task: Task, group_id: int, sample_index: int):
        self.task, self.group_id, self.sample_index = task, group_id, sample_index
        self.messages: list[Message] = []
        self.tools: list[dict] = []
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_len = 0
        self.turns: list[Turn] = []
        self.end: EndReason | None = None
        self.error: str | None = None
        self.timings = {"generate_s": 0.0, "env_s": 0.0}

    def append(self, ids: Sequence[int], *, sampled: bool, logprobs: Sequence[float] = ()) -> None:
        self.ids.extend(int(i) for i in ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if sampled else [0.0] * len(ids))


class Orchestrator:
    """Runs episodes concurrently: ``await orch.run(tasks)`` -> trajectories (``G`` per task).

    Args:
      engine: the sampler (see module docstring for the duck-typed interface).
      chat: a :class:`~jaxrl_agents.chat.render.ChatFormat` for the policy's tokenizer.
      env_factory: builds a fresh environment per episode.
      cfg: limits and sampling settings.
      sampling_params: ``(max_new_tokens, seed) -> SamplingParams`` for the engine in use.
      reward_fn: optional ``RewardComposer``; applied to each finished trajectory.
    """

    def __init__(
        self,
        *,
        engine: _Engine,
        chat: Any,
        env_factory: EnvFactory,
        cfg: RolloutConfig,
        sampling_params: Callable[[int, int], Any],
        reward_fn: Callable[[Trajectory], Awaitable[Any] | Any] | None = None,
        policy_version: int = 0,
    ):
        self.engine, self.chat, self.env_factory, self.cfg = engine, chat, env_factory, cfg
        self.sampling_params, self.reward_fn = sampling_params, reward_fn
        self.policy_version = policy_version

    # -- one episode --------------------------------------------------------------------
    async def run_episode(
        self, task: Task, *, group_id: int = 0, sample_index: int = 0, seed: int = 0
    ) -> Trajectory:
        st = _EpisodeState(task, group_id, sample_index)
        t0 = time.perf_counter()
        ep_seed = episode_seed(seed, task.id, sample_index)
        try:
            env = self.env_factory()
        except Exception as e:  # noqa: BLE001 - an env that cannot be built ends this episode only
            env = None
            st.end = EndReason.ENV_ERROR
            st.error = f"env construction failed: {type(e).__name__}: {e}"
        if env is not None:
            try:
                async with asyncio.timeout(self.cfg.episode_timeout_s):
                    await self._episode(st, env, ep_seed)
            except TimeoutError:
                st.end = EndReason.EPISODE_TIMEOUT
            except Exception as e:  # noqa: BLE001 - the env (not a tool) failed: end softly
                st.end = EndReason.ENV_ERROR
                st.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        verdict = None
        if env is not None:
            try:
                async with asyncio.timeout(max(1.0, self.cfg.episode_timeout_s / 4)):
                    verdict = await env.verify()
            except Exception as e:  # noqa: BLE001
                st.error = (st.error or "") + f"verify failed: {type(e).__name__}: {e}"
            finally:
                try:
                    async with asyncio.timeout(max(1.0, self.cfg.episode_timeout_s / 4)):
                        await env.close()
                except Exception:  # noqa: BLE001 - closing must never lose the trajectory
                    pass
        st.timings["wall_s"] = time.perf_counter() - t0
        traj = Trajectory(
            task=task,
            messages=st.messages,
            tools=st.tools,
            token_ids=st.ids,
            loss_mask=st.mask,
            logprobs=st.logprobs,
            prompt_len=st.prompt_len,
            turns=st.turns,
            end_reason=st.end or EndReason.ENV_ERROR,
            group_id=group_id,
            sample_index=sample_index,
            verdict=verdict,
            policy_version=self.policy_version,
            timings=st.timings,
            error=st.error,
        )
        if self.reward_fn is not None:
            await score_episode(self.reward_fn, traj)
        return traj

    async def _episode(self, st: _EpisodeState, env: Any, ep_seed: int) -> None:
        cfg, chat = self.cfg, self.chat
        t = time.perf_counter()
        reset = await env.reset(st.task, seed=ep_seed)
        st.timings["env_s"] += time.perf_counter() - t
        st.messages, st.tools = list(reset.messages), list(reset.tools)
        new_ids = chat.prompt_ids(st.messages, st.tools)
        st.append(new_ids, sampled=False)
        st.prompt_len = len(new_ids)
        session = await self.engine.open_session()
        if hasattr(session, "bind"):  # scripted policies read the message history
            session.bind(st.messages, st.task)
        try:
            for turn_index in range(cfg.max_turns):
                budget = cfg.max_total_tokens - len(st.ids)
                if budget <= 0:
                    st.end = EndReason.MAX_TOKENS
                    return
                params = self.sampling_params(
                    min(cfg.max_new_tokens, budget), turn_seed(ep_seed, turn_index)
                )
                t = time.perf_counter()
                res = await session.generate(new_ids, params)
                gen_s = time.perf_counter() - t
                st.timings["generate_s"] += gen_s
                if res.finish_reason == "cache_full" and not res.token_ids:
                    st.end = EndReason.CONTEXT_FULL
                    return
                start = len(st.ids)
                # Behaviour logprobs: under the distribution actually sampled from (temperature,
                # top-k/p, min-p) when it differs from the policy; else (T=1, greedy) the policy's.
                s_lp = getattr(res, "sampling_logprobs", None)
                st.append(
                    res.token_ids, sampled=True, logprobs=res.logprobs if s_lp is None else s_lp
                )
                text = decode_sampled(chat, res.token_ids)
                message, calls = chat.parse_assistant(text)
                turn = Turn(
                    index=turn_index,
                    start=start,
                    end=len(st.ids),
                    text=text,
                    tool_calls=calls,
                    finish_reason=res.finish_reason,
                    latency_s={"generate": gen_s},
                )
                unparsed = []
                if cfg.malformed_calls == "as_text":  # not run, not shown: see RolloutConfig
                    unparsed = invalid_call_results([c for c in calls if c.error], {})
                    calls = [c for c in calls if not c.error]
                st.turns.append(turn)
                st.messages.append(message)
                if res.finish_reason != "stop":
                    # A turn cut off mid-text has no stop token: the template cannot continue it.
                    st.end = (
                        EndReason.CONTEXT_FULL
                        if res.finish_reason == "cache_full"
                        else EndReason.MAX_TOKENS
                    )
                    return
                t = time.perf_counter()
                step: EnvStep = await env.step(message, calls)
                env_s = time.perf_counter() - t
                st.timings["env_s"] += env_s
                turn.latency_s["env"] = env_s
                turn.tool_results = unparsed + list(step.tool_results)
                turn.annotations = dict(step.annotations)
                turn.env_reward = step.reward
                if step.done:
                    st.end = EndReason.ANSWERED
                    turn.annotations.setdefault(Ann.ANSWERED, True)
                    return
                st.messages.extend(step.messages)
                new_ids = chat.continuation_ids(step.messages, st.tools)
                st.append(new_ids, sampled=False)
            st.end = EndReason.MAX_TURNS
        finally:
            await session.close()

    def _failed(self, task: Task, group_id: int, k: int, e: Exception) -> Trajectory:
        return Trajectory(
            task=task,
            messages=[],
            tools=[],
            token_ids=[],
            loss_mask=[],
            logprobs=[],
            prompt_len=0,
            turns=[],
            end_reason=EndReason.ENV_ERROR,
            group_id=group_id,
            sample_index=k,
            policy_version=self.policy_version,
            error=f"episode failed: {type(e).__name__}: {e}",
        )

    # -- many episodes ------------------------------------------------------------------
    async def run(
        self,
        tasks: Sequence[Task],
        *,
        group_size: int | None = None,
        seed: int = 0,
        progress: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """All ``len(tasks) * G`` episodes, concurrently; results ordered by (task, sample)."""
        g = group_size or self.cfg.group_size
        limiter = asyncio.Semaphore(self.cfg.concurrency)

        async def one(task_index: int, task: Task, k: int) -> Trajectory:
            async with limiter:
                try:
                    traj = await self.run_episode(
                        task, group_id=task_index, sample_index=k, seed=seed
                    )
                except Exception as e:  # noqa: BLE001 - never let one episode end the batch
                    traj = self._failed(task, task_index, k, e)
            if progress is not None:
                progress(traj)
            return traj

        jobs = [one(i, task, k) for i, task in enumerate(tasks) for k in range(g)]
        return list(await asyncio.gather(*jobs))
