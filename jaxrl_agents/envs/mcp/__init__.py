"""``mcp``: the tools of MCP (Model Context Protocol) servers as an environment.

The package: server specs and connections through the MCP Python SDK (``servers``; the optional
``mcp`` extra), the task file and answer checks (``tasks``), the env (``env``), its scripted
policies (``scripted``, registered here) and a demo server with its tasks (``demo_server``,
``demo``).

    from jaxrl_agents.envs.mcp import McpEnv
    env = McpEnv(servers=[{"name": "demo", "command": "python",
                           "args": ["-m", "jaxrl_agents.envs.mcp.demo_server"]}])
"""

from __future__ import annotations

from jaxrl_agents.envs.mcp.env import PREFIX_SEP, SYSTEM_PROMPT, McpEnv, render_result
from jaxrl_agents.envs.mcp.scripted import oracle_policy, wrong_policy
from jaxrl_agents.envs.mcp.servers import McpConnection, McpServerError, ServerSpec
from jaxrl_agents.envs.mcp.tasks import CHECKS, load_rows, resolve_check
from jaxrl_agents.envs.registry import register_scripted

# The class's public path: EnvBinding.label and the reports name it.
McpEnv.__module__ = __name__
register_scripted(McpEnv, "oracle", oracle_policy)
register_scripted(McpEnv, "wrong", wrong_policy)

__all__ = [
    "CHECKS",
    "PREFIX_SEP",
    "SYSTEM_PROMPT",
    "McpConnection",
    "McpEnv",
    "McpServerError",
    "ServerSpec",
    "load_rows",
    "oracle_policy",
    "render_result",
    "resolve_check",
    "wrong_policy",
]
