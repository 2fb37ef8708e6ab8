"""``mcp``: the tools of one or more MCP servers as an environment.

* Options (``env.options``): ``servers``, a list of ``{name, command, args, env, cwd}`` (a stdio
  server, started as a child process) or ``{name, url}`` (a streamable HTTP server) entries
  (:mod:`jaxrl_agents.envs.mcp.servers`; None: the demo server of
  :mod:`jaxrl_agents.envs.mcp.demo`); ``start_timeout_s``, how long a server may take to start
  and list its tools; ``system_prompt``; ``server_log``, a file the stdio servers' stderr is
  appended to (default: this process's stderr).
* Tasks (``env.tasks``): ``tasks_file``, a JSONL file of ``{id, prompt, answer, split?, oracle?}``
  rows, ``check`` (``exact``, ``contains``, ``number`` or ``pkg.mod:fn``) and ``heldout_frac``
  (:mod:`jaxrl_agents.envs.mcp.tasks`). Without ``tasks_file``, the demo tasks of
  :mod:`jaxrl_agents.envs.mcp.demo` (the ``demo_server`` tools ``add`` and ``lookup``).
* Tools: every tool the servers list, with its MCP ``inputSchema`` as the JSON schema the model
  sees. A tool keeps its MCP name unless two servers list the same name: then each of those tools
  is named ``<server>__<tool>`` (the others keep theirs). Calls go through the env's usual
  argument check and per-call timeout (``tool_timeout_s``); an ``isError`` result, an MCP error or
  a timeout comes back to the model as an ``Error: ...`` tool message.
* Lifecycle: the servers start in ``reset`` (a second ``reset`` restarts them: episodes share no
  server state) and stop in ``close``. A server that dies mid-episode makes the step raise
  :class:`~jaxrl_agents.envs.mcp.servers.McpServerError`, so the orchestrator ends the episode
  with ``env_error``; its process is reaped and the others are stopped at ``close``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig
from jaxrl_agents.envs.mcp import demo
from jaxrl_agents.envs.mcp.servers import McpConnection, McpServerError, ServerSpec, require_sdk
from jaxrl_agents.envs.mcp.tasks import load_rows, make_tasks, resolve_check
from jaxrl_agents.envs.tools import Tool, ToolBox, ToolError
from jaxrl_agents.types import Ann, EnvReset, EnvStep, Message, Task, ToolCall, Verdict

SYSTEM_PROMPT = "Use the tools to find the answer. Reply with only the final answer."
PREFIX_SEP = "__"
"""Separator of ``<server>__<tool>``, the name of a tool that more than one server lists."""


class McpEnv(Env):
    """Tools of MCP servers; success iff the task's ``check`` accepts the final answer."""

    name = "mcp"

    def __init__(
        self,
        *,
        servers: list[dict[str, Any]] | None = None,
        start_timeout_s: float = 30.0,
        system_prompt: str = SYSTEM_PROMPT,
        server_log: str | None = None,
        config: EnvConfig | None = None,
        **env_kwargs: Any,
    ):
        super().__init__(config=config, **env_kwargs)
        require_sdk()
        servers = demo.SERVERS if servers is None else servers
        if not servers:
            raise ValueError(
                "servers: at least one MCP server is needed, e.g. [{name: demo, command: python, "
                "args: [-m, jaxrl_agents.envs.mcp.demo_server]}]"
            )
        specs = [ServerSpec.parse(s, f"servers[{i}]") for i, s in enumerate(servers)]
        names = [s.name for s in specs]
        if len(set(names)) < len(names):
            raise ValueError(f"servers: names must be unique, got {names}")
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        if server_log is not None and not Path(server_log).expanduser().parent.is_dir():
            raise ValueError(f"server_log={server_log!r}: its folder does not exist")
        self.specs, self.start_timeout_s = specs, float(start_timeout_s)
        self.system_prompt_text, self.server_log = system_prompt, server_log
        self.connections: dict[str, McpConnection] = {}
        self.routes: dict[str, tuple[str, str]] = {}
        """Each tool name the model sees -> (server name, the server's tool name)."""
        self._fatal: McpServerError | None = None
        self._log: Any = None

    @classmethod
    def make_tasks(
        cls,
        split: str,
        n: int,
        *,
        seed: int = 0,
        tasks_file: str | None = None,
        check: str = "exact",
        heldout_frac: float = 0.2,
    ) -> list[Task]:
        """``n`` tasks of ``split`` from ``tasks_file`` (JSONL rows ``{id, prompt, answer,
        split?, oracle?}``; None: the demo tasks), judged by ``check`` (``exact``, ``contains``,
        ``number`` or ``pkg.mod:fn(answer, task) -> bool``). Rows without a ``split`` are split
        by a hash of their id (``heldout_frac`` held out)."""
        if tasks_file is None:
            rows, origin = demo.rows(), "demo tasks"
        else:
            rows, origin = load_rows(tasks_file), f"tasks_file={tasks_file}"
        return make_tasks(
            cls.name,
            rows,
            split,
            n,
            seed=seed,
            check=check,
            heldout_frac=heldout_frac,
            origin=origin,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    async def reset(self, task: Task, *, seed: int = 0) -> EnvReset:
        await self.close()
        try:
            await self._start()
        except asyncio.CancelledError:
            self._abort()
            raise
        return await super().reset(task, seed=seed)

    async def _start(self) -> None:
        """Start every server (concurrently), list their tools and build the tool box; a server
        that fails to start stops the others and raises."""
        if self.server_log is not None:
            self._log = open(Path(self.server_log).expanduser(), "a", encoding="utf-8")
        conns = {
            s.name: McpConnection(s, start_timeout_s=self.start_timeout_s, errlog=self._log)
            for s in self.specs
        }
        self.connections, self._fatal = conns, None
        listed = await asyncio.gather(*(c.start() for c in conns.values()), return_exceptions=True)
        failed = [x for x in listed if isinstance(x, BaseException)]
        if failed:
            await self.close()
            raise failed[0]
        self.tools, self.routes = self._toolbox(dict(zip(conns, listed, strict=True)))

    def _toolbox(self, listed: dict[str, list[Any]]) -> tuple[ToolBox, dict[str, tuple[str, str]]]:
        counts: dict[str, int] = {}
        for tools in listed.values():
            for t in tools:
                counts[t.name] = counts.get(t.name, 0) + 1
        box, routes = [], {}
        for server, tools in listed.items():
            for t in tools:
                name = t.name if counts[t.name] == 1 else f"{server}{PREFIX_SEP}{t.name}"
                routes[name] = (server, t.name)
                box.append(
                    Tool(
                        name=name,
                        description=t.description or t.title or "",
                        parameters=dict(t.input_schema or {"type": "object", "properties": {}}),
                        fn=self._caller(server, t.name),
                        is_async=True,
                    )
                )
        return ToolBox(box), routes

    def _caller(self, server: str, tool_name: str) -> Any:
        async def call(**arguments: Any) -> str:
            try:
                result = await self.connections[server].call(tool_name, arguments)
            except McpServerError as e:
                self._fatal = e
                raise
            except Exception as e:  # noqa: BLE001 - an MCP error of a live server: a message
                raise ToolError(f"{tool_name} failed: {type(e).__name__}: {e}") from e
            text = render_result(result)
            if result.is_error:
                raise ToolError(text or f"{tool_name} failed")
            return text

        return call

    async def step(self, message: Message, tool_calls: list[ToolCall]) -> EnvStep:
        if self._fatal is not None:
            raise self._fatal
        try:
            out = await super().step(message, tool_calls)
        except asyncio.CancelledError:  # the episode's task was cancelled: its end
            self._abort()
            raise
        if self._fatal is not None:  # a server died during this turn's calls
            await self._stop_dead()
            raise self._fatal
        return out

    async def _stop_dead(self) -> None:
        """Close the connections whose server is gone (the SDK's shutdown reaps the process)."""
        for conn in self.connections.values():
            if not conn.alive():
                await conn.close()

    def _abort(self) -> None:
        """Kill the servers now, without awaiting anything (the episode's task is being
        cancelled, and may never call ``close``); their clients' tasks wind down by themselves."""
        for conn in self.connections.values():
            conn.abort()

    async def close(self) -> None:
        """Stop every server (also after a failed start or a dead server); safe to repeat."""
        conns, self.connections = list(self.connections.values()), {}
        try:
            if conns:
                await asyncio.gather(*(c.close() for c in conns))
        finally:
            for c in conns:  # a cancelled gather leaves none running
                c.kill()
            if self._log is not None:
                self._log.close()
                self._log = None

    def server_pids(self) -> dict[str, int | None]:
        """The running stdio servers' process ids by server name (None where unknown)."""
        return {name: c.pid for name, c in self.connections.items()}

    # -- episode ------------------------------------------------------------------------------
    def system_prompt(self, task: Task) -> str:
        return self.system_prompt_text

    def judge(self, answer: str | None) -> Verdict:
        task = self.task
        check = task.data.get("check", "exact")
        correct = answer is not None and bool(resolve_check(check)(answer, task))
        return Verdict(
            success=correct,
            score=float(correct),
            info={
                Ann.SLICES: [f"check:{check}"],
                Ann.EXPECTED: task.data["answer"],
                Ann.ANSWER: answer,
                "servers": [s.name for s in self.specs],
            },
        )


def render_result(result: Any) -> str:
    """A ``CallToolResult`` as the text the model reads: its text blocks joined by newlines;
    other blocks as JSON; the structured content when there are no blocks."""
    parts = []
    for block in result.content or []:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            dumped = block.model_dump(mode="json", exclude_none=True)
            if "data" in dumped:  # images / audio: the kind, not the bytes
                dumped["data"] = f"<{len(dumped['data'])} base64 chars>"
            parts.append(json.dumps(dumped))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)
