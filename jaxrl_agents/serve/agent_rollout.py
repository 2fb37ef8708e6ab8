"""Agent functions as the rollout: an existing agent talks to the policy through an OpenAI client,
and the server's token capture turns each of its episodes into a :class:`Trajectory`.

    async def agent(client, task) -> str:      # any code that uses an openai.AsyncOpenAI
        ...
    trajs = await run_agents(server, agent, tasks, group_size=4, timeout_s=120,
                             verify=env_judge(CalculatorEnv))

For every task ``G`` episodes run concurrently, each with its own episode key (sent by the
client as ``X-Episode-Id``), so their records never mix. An agent that raises ends only its own
episode (``env_error``, the error kept) and one that runs past ``timeout_s`` is cancelled
(``episode_timeout``), as the orchestrator ends episodes whose env fails or hangs; the turns
sampled until then are kept. An agent that returns ends ``answered``, or ``max_tokens`` /
``context_full`` when its last turn was cut off by a length limit: then, as in the built-in loop,
the episode has no answer (what the agent returned is kept in the last turn's
``final_answer`` annotation, not judged). An agent that raises because the server refused to go
on (the request limit, a truncated turn the rollout does not continue) ends with the server's
reason: ``max_turns``, ``max_tokens``.

**Which tokens train** (episodes whose agent rewrote its history have several segments, see
:mod:`jaxrl_agents.serve.episodes`): the trajectory holds the episode's *last* segment only,
the one holding the final answer, and it carries the episode's reward. Earlier segments are
dropped from the update: each is an exact record of what was sampled, but they were sampled in
contexts the final conversation no longer shows, and giving each the episode's reward as a
separate sequence would weigh the episode in its group's statistics by how often its agent
rewrote history. ``segments_dropped`` on the returned records says how often it happened
(:attr:`Server.stats` counts the rewrites).

Verification: ``verify(task, answer) -> Verdict`` scores the agent's final answer (its return
value, ``str()``-ed); :func:`env_judge` builds one from an environment's ``judge``. Rewards then
come from ``reward_fn`` (a ``RewardComposer``'s ``acompute``), as in the orchestrator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import openai

from jaxrl_agents.rollout.orchestrator import episode_seed, score_episode
from jaxrl_agents.serve.episodes import EpisodeRecord
from jaxrl_agents.serve.server import Server
from jaxrl_agents.types import Ann, EndReason, Task, Trajectory, Verdict

Agent = Callable[[Any, Task], Awaitable[Any]]
"""``async (client, task) -> final answer``."""
Verify = Callable[[Task, str | None], Verdict | Awaitable[Verdict]]


@dataclasses.dataclass
class AgentRun:
    """One episode: its trajectory (the last segment) and the server's whole record."""

    trajectory: Trajectory
    record: EpisodeRecord

    @property
    def segments_dropped(self) -> int:
        return max(len(self.record.segments) - 1, 0)


def openai_client(
    server: Server, key: str, *, timeout_s: float, http_client: Any = None
) -> openai.AsyncOpenAI:
    """The default client of one episode: the server's URL and key, the episode key header.
    ``http_client``: an ``httpx.AsyncClient`` to share (building one costs ~17 ms, most of it
    TLS set-up; :func:`run_agents` shares one across its episodes)."""
    return openai.AsyncOpenAI(
        base_url=server.base_url,
        api_key=server.api_key or "none",
        default_headers={"X-Episode-Id": key},
        max_retries=0,
        timeout=timeout_s,
        http_client=http_client,
    )


def env_judge(env_factory: Callable[[], Any]) -> Verify:
    """``verify`` from an environment: a fresh env reset on the task judges the answer (the
    agent ran its tools itself, so state-based annotations of the verdict see no tool use)."""

    async def verify(task: Task, answer: str | None) -> Verdict:
        env = env_factory()
        try:
            await env.reset(task)
            return env.judge(answer)
        finally:
            await env.close()

    return verify


async def run_agent_episode(
    server: Server,
    agent: Agent,
    task: Task,
    *,
    timeout_s: float,
    group_id: int = 0,
    sample_index: int = 0,
    seed: int = 0,
    verify: Verify | None = None,
    reward_fn: Callable[[Trajectory], Any] | None = None,
    policy_version: int = 0,
    client_factory: Callable[[str], Any] | None = None,
    close_client: bool = True,
) -> AgentRun:
    """One episode of ``agent`` on ``task`` (see module docstring); ``close_client`` False
    leaves the client open (its HTTP client is shared)."""
    key = server.open_episode(task, seed=seed)
    t0 = time.perf_counter()
    answer, end, error, client = None, EndReason.ANSWERED, None, None
    make = client_factory or (lambda k: openai_client(server, k, timeout_s=timeout_s))
    try:
        async with asyncio.timeout(timeout_s):
            client = make(key)
            answer = await agent(client, task)
    except TimeoutError:
        end = EndReason.EPISODE_TIMEOUT
    except Exception as e:  # noqa: BLE001 - the agent failed: this episode ends, not the batch
        end, error = EndReason.ENV_ERROR, f"agent raised {type(e).__name__}: {e}\n"
        error += traceback.format_exc(limit=4)
    finally:
        closing = getattr(client, "close", None) if close_client else None
        if closing is not None:
            try:
                await closing()
            except Exception:  # noqa: BLE001 - closing must never lose the record
                pass
    text = None if answer is None else str(answer)
    record = await server.close_episode(key, final_answer=text)
    traj = _trajectory(record, task, end, error, group_id, sample_index, policy_version)
    judged = text
    if end == EndReason.ANSWERED and traj.turns and traj.turns[-1].finish_reason != "stop":
        traj.end_reason = record.end_hint or EndReason.MAX_TOKENS
        judged = None  # a cut-off turn is no answer (module docstring)
    elif end == EndReason.ENV_ERROR and record.end_hint is not None:
        traj.end_reason = record.end_hint  # the agent gave up because the server stopped it
    if traj.turns:
        traj.turns[-1].annotations[Ann.ANSWERED] = judged is not None
        traj.turns[-1].annotations["final_answer"] = text
    traj.timings["wall_s"] = time.perf_counter() - t0
    if verify is not None:
        try:
            async with asyncio.timeout(max(1.0, timeout_s / 4)):
                out = verify(task, judged)
                traj.verdict = await out if asyncio.iscoroutine(out) else out
            traj.verdict.info.setdefault(Ann.ANSWER, judged)
        except Exception as e:  # noqa: BLE001
            traj.error = (traj.error or "") + f"verify failed: {type(e).__name__}: {e}"
    if reward_fn is not None:
        await score_episode(reward_fn, traj)
    return AgentRun(traj, record)


def _trajectory(
    record: EpisodeRecord,
    task: Task,
    end: EndReason,
    error: str | None,
    group_id: int,
    sample_index: int,
    policy_version: int,
) -> Trajectory:
    seg = record.segments[-1] if record.segments else None
    return Trajectory(
        task=task,
        messages=list(seg.messages) if seg else [],
        tools=list(seg.tools) if seg else [],
        token_ids=list(seg.token_ids) if seg else [],
        loss_mask=list(seg.loss_mask) if seg else [],
        logprobs=list(seg.logprobs) if seg else [],
        prompt_len=seg.prompt_len if seg else 0,
        turns=list(seg.turns) if seg else [],
        end_reason=end,
        group_id=group_id,
        sample_index=sample_index,
        policy_version=policy_version,
        error=error,
    )


async def run_agents(
    server: Server,
    agent: Agent,
    tasks: Sequence[Task],
    *,
    group_size: int,
    timeout_s: float,
    concurrency: int = 64,
    seed: int = 0,
    verify: Verify | None = None,
    reward_fn: Callable[[Trajectory], Any] | None = None,
    policy_version: int = 0,
    client_factory: Callable[[str], Any] | None = None,
) -> list[AgentRun]:
    """``len(tasks) * group_size`` agent episodes, concurrently (at most ``concurrency`` at
    once; keep it at most the engine's slots when agents ask for ``n > 1``); results ordered by
    (task, sample), ``group_id`` the task's index. Episodes are seeded as the built-in loop
    seeds them (``episode_seed(seed, task.id, sample)``, then the server's per-request rule), so
    an agent that sends what the built-in loop sends samples the same tokens.
    ``client_factory(key)`` builds each episode's client (default: :func:`openai_client`)."""
    if group_size < 1 or concurrency < 1 or timeout_s <= 0:
        raise ValueError(
            f"need group_size >= 1, concurrency >= 1, timeout_s > 0; got {group_size}, "
            f"{concurrency}, {timeout_s}"
        )
    limiter = asyncio.Semaphore(concurrency)
    http = None if client_factory is not None else openai.DefaultAsyncHttpxClient()
    if http is not None:  # one connection pool for every episode's client

        def client_factory(key: str) -> openai.AsyncOpenAI:
            return openai_client(server, key, timeout_s=timeout_s, http_client=http)

    async def one(i: int, task: Task, k: int) -> AgentRun:
        async with limiter:
            return await run_agent_episode(
                server,
                agent,
                task,
                timeout_s=timeout_s,
                group_id=i,
                sample_index=k,
                seed=episode_seed(seed, task.id, k),
                verify=verify,
                reward_fn=reward_fn,
                policy_version=policy_version,
                client_factory=client_factory,
                close_client=http is None,
            )

    jobs = [one(i, task, k) for i, task in enumerate(tasks) for k in range(group_size)]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        if http is not None:
            await http.aclose()
