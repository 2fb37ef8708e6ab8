"""``rollout.agent``: an agent function in place of the built-in episode loop, for training and
evaluation alike.

:class:`AgentCollector` is the :class:`~jaxrl_agents.rollout.Collector` the jobs build when
``rollout.agent`` names an async function ``(client, task) -> final answer``. Each
:meth:`~AgentCollector.episodes` call serves the engine through a :class:`Server` on a free loopback
port for the duration of the call and runs the agent episodes with :func:`run_agents`: the
trajectories hold the exact sampled ids (token capture), the env judges each final answer
(:func:`env_judge`), and scoring, packing and the update work on them unchanged. Sampling is the
collector's, not the agent's: training samples with the ``rollout.sampling`` settings the update's
log-probs assume, evaluation greedily, whatever ``temperature`` the agent sends, and each
episode is seeded as the built-in loop seeds it. The rollout limits bound each request
(``max_new_tokens``), each recorded segment (``max_total_tokens``) and each episode's requests
(``max_turns``: the request past it is refused, the episode ends ``max_turns``); a turn cut
off by ``max_new_tokens`` ends its episode ``max_tokens`` with no answer, as in the built-in
loop; ``episode_timeout_s`` ends an agent that hangs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.generation.config import Sampling
from jaxrl_agents.rollout.collector import Collector
from jaxrl_agents.serve.agent_rollout import env_judge, run_agents
from jaxrl_agents.serve.episodes import ServeLimits
from jaxrl_agents.serve.server import Server
from jaxrl_agents.types import Task, Trajectory

for _name in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise (Hydra's root)
    logging.getLogger(_name).setLevel(logging.WARNING)


def resolve_agent(path: str) -> Callable[..., Any]:
    """The async agent function ``pkg.module:function`` (or ``pkg.module.function``); a
    ``ValueError`` naming ``rollout.agent`` and what is wrong otherwise."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(
            f"rollout.agent={path!r}: cannot import it ({type(e).__name__}: {e}); expected "
            "'package.module:function', an async function (client, task) -> answer"
        ) from e
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(
            f"rollout.agent={path!r} is not an async function; expected async def "
            "agent(client, task) -> answer"
        )
    if len(inspect.signature(fn).parameters) < 2:
        raise ValueError(f"rollout.agent={path!r} must take (client, task)")
    return fn


@dataclasses.dataclass
class AgentCollector(Collector):
    """A :class:`Collector` whose episodes are ``agent``'s (see the module docstring)."""

    agent: Callable[..., Any] | None = None

    def limits(self) -> ServeLimits:
        r = self.rollout
        return ServeLimits(
            max_tokens=r.max_new_tokens,
            default_max_tokens=r.max_new_tokens,
            max_segment_tokens=r.max_total_tokens,
            max_requests=r.max_turns,
            continue_truncated=False,
        )

    async def episodes(
        self,
        engine: Any,
        tasks: Sequence[Task],
        *,
        group_size: int,
        seed: int,
        version: int,
        greedy: bool,
    ) -> list[Trajectory]:
        """``tasks`` x ``group_size`` agent episodes behind a server on a loopback port."""
        if self.agent is None:
            raise ValueError("AgentCollector needs an agent function")
        sampling = Sampling(temperature=0.0) if greedy else self.rollout.sampling
        async with Server(engine, self.chat, limits=self.limits(), sampling=sampling) as server:
            runs = await run_agents(
                server,
                self.agent,
                tasks,
                group_size=group_size,
                timeout_s=self.rollout.episode_timeout_s,
                concurrency=self.rollout.concurrency,
                seed=seed,
                verify=env_judge(self.env_factory),
                policy_version=version,
            )
        return [r.trajectory for r in runs]
