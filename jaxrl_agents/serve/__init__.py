"""An OpenAI-compatible server in front of the sampler engine, with exact token capture per
episode, and agent functions (code that talks to an OpenAI client) as the rollout.

Needs the ``serve`` extra (starlette, uvicorn, openai). See :mod:`jaxrl_agents.serve.episodes`
for how token ids are recorded, :mod:`jaxrl_agents.serve.app` for the endpoints and
:mod:`jaxrl_agents.serve.agent_rollout` for turning agent episodes into trajectories.
"""

from jaxrl_agents.serve.agent_rollout import AgentRun, env_judge, openai_client, run_agents
from jaxrl_agents.serve.app import EPISODE_HEADER, make_app
from jaxrl_agents.serve.episodes import EpisodeRecord, EpisodeStore, Segment, ServeLimits
from jaxrl_agents.serve.server import Server, check_bind

__all__ = [
    "EPISODE_HEADER",
    "AgentRun",
    "EpisodeRecord",
    "EpisodeStore",
    "Segment",
    "ServeLimits",
    "Server",
    "check_bind",
    "env_judge",
    "make_app",
    "openai_client",
    "run_agents",
]
