"""An OpenAI-compatible server in front of the sampler engine, with exact token capture per
episode, and agent functions (code that talks to an OpenAI client) as the rollout.

Needs the ``serve`` extra (starlette, uvicorn, openai). See :mod:`jaxrl_agents.serve.episodes`
for how token ids are recorded, :mod:`jaxrl_agents.serve.app` for the endpoints and
:mod:`jaxrl_agents.serve.agent_rollout` for turning agent episodes into trajectories.

The names below load on first use, so the records (``ServeLimits``: the ``jaxrl-serve`` config
embeds it) import without the extra.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "EPISODE_HEADER": "jaxrl_agents.serve.app",
    "make_app": "jaxrl_agents.serve.app",
    "AgentRun": "jaxrl_agents.serve.agent_rollout",
    "env_judge": "jaxrl_agents.serve.agent_rollout",
    "openai_client": "jaxrl_agents.serve.agent_rollout",
    "run_agents": "jaxrl_agents.serve.agent_rollout",
    "EpisodeRecord": "jaxrl_agents.serve.episodes",
    "EpisodeStore": "jaxrl_agents.serve.episodes",
    "Segment": "jaxrl_agents.serve.episodes",
    "ServeLimits": "jaxrl_agents.serve.episodes",
    "Server": "jaxrl_agents.serve.server",
    "check_bind": "jaxrl_agents.serve.server",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxrl_agents.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
