"""The ``mcp`` env's demo: a lookup table and task rows for the tools of
:mod:`jaxrl_agents.envs.mcp.demo_server` (``add(a, b)`` and ``lookup(key)``).

``configs/env/mcp.yaml`` (and ``McpEnv()`` without ``servers``) runs that server and, without
``env.tasks.tasks_file``, these tasks, so ``jaxrl-eval env=mcp policies=[scripted:oracle]`` works
out of the box. Kept free of the ``mcp`` package so the env can read the rows without the SDK.
"""

from __future__ import annotations

from typing import Any

TABLE = {
    "red": "7",
    "green": "12",
    "blue": "19",
    "black": "23",
    "white": "31",
    "amber": "42",
    "coral": "5",
    "ivory": "58",
    "olive": "64",
    "slate": "77",
    "teal": "81",
    "plum": "96",
}
"""``lookup``'s table: colour name -> code."""
SERVERS = [
    {"name": "demo", "command": "python", "args": ["-m", "jaxrl_agents.envs.mcp.demo_server"]}
]
"""``McpEnv``'s servers when none are given: the demo server, run by this interpreter."""


def rows() -> tuple[dict[str, Any], ...]:
    """Task rows (the ``tasks_file`` format): sums with ``add``, codes with ``lookup``."""
    out = []
    for a in range(11, 51, 3):
        for b in (4, 9, 17):
            out.append(
                {
                    "id": f"add-{a}-{b}",
                    "prompt": f"What is {a} plus {b}?",
                    "answer": str(a + b),
                    "oracle": [{"name": "add", "arguments": {"a": a, "b": b}}],
                }
            )
    for key, code in TABLE.items():
        out.append(
            {
                "id": f"lookup-{key}",
                "prompt": f"What is the code of {key}?",
                "answer": code,
                "oracle": [{"name": "lookup", "arguments": {"key": key}}],
            }
        )
    return tuple(out)
