"""The ``mcp`` env's demo MCP server (stdio): ``add(a, b)`` and ``lookup(key)``. Run as
``python -m jaxrl_agents.envs.mcp.demo_server``, it speaks MCP on stdin / stdout."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from jaxrl_agents.envs.mcp.demo import TABLE

app = MCPServer("jaxrl-demo", log_level="WARNING")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def lookup(key: str) -> str:
    """The code of a colour name."""
    if key not in TABLE:
        raise ToolError(f"no code for {key!r}; known: {', '.join(sorted(TABLE))}")
    return TABLE[key]


if __name__ == "__main__":
    app.run()
