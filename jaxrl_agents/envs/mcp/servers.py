"""MCP server connections of the ``mcp`` env: specs from the config, one client per server.

A server is a dict of ``env.options.servers``: ``{name, command, args, env, cwd}`` runs a stdio
server as a child process (``env``: environment variables set over the SDK's safe defaults;
``cwd``: its working folder); ``{name, url}`` connects to a streamable HTTP server that runs
elsewhere. The command ``python`` (or ``python3``) is this interpreter (``sys.executable``), so a
server written with the same environment's ``mcp`` package starts without a PATH lookup.

:class:`McpConnection` owns one server. Its client (the SDK's ``stdio_client`` or
``streamable_http_client`` and a ``ClientSession``) lives in a task of its own, started by
:meth:`McpConnection.start` and ended by :meth:`McpConnection.close`, so the SDK's task groups
are entered and left in one task whatever the episode's task does (cancelled, timed out). Calls
(:meth:`McpConnection.call`) are made from the episode's task. A stdio server runs in a process
group of its own: ``close`` (and, as a last resort, interpreter exit) kills that group when the
SDK's shutdown (close stdin, wait, terminate) has not ended it, so no server outlives its env.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import sys
import types
import uuid
from pathlib import Path
from typing import Any, TextIO

TOKEN_VAR = "JAXRL_MCP_SERVER_TOKEN"
"""Environment variable set, with a unique value, in each stdio server's environment: how the
client finds its server's process id among this process's children (Linux ``/proc``)."""
_KEYS = {"name", "command", "args", "env", "cwd", "url"}
_LIVE_GROUPS: set[int] = set()  # process groups of stdio servers not yet closed


class McpServerError(RuntimeError):
    """An MCP server failed to start, or died (its connection closed) during an episode."""


@functools.cache
def sdk() -> types.SimpleNamespace:
    """The MCP SDK's names this module uses, imported on first use: the optional ``mcp`` extra
    costs about 0.5 s to import (it loads starlette, uvicorn, pydantic models), which every user of
    ``jaxrl_agents.envs`` would otherwise pay. ``ImportError`` with the install command when the
    package is missing."""
    try:
        import mcp_types
        from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
    except ImportError as e:
        raise ImportError(
            "the mcp env needs the MCP Python SDK: pip install 'jaxrl-agents[mcp]' (mcp>=2)"
        ) from e
    return types.SimpleNamespace(
        types=mcp_types,
        ClientSession=ClientSession,
        MCPError=MCPError,
        StdioServerParameters=StdioServerParameters,
        stdio_client=stdio_client,
        streamable_http_client=streamable_http_client,
    )


def require_sdk() -> None:
    """``ImportError`` with the install command when the ``mcp`` package is missing."""
    sdk()


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One MCP server of ``env.options.servers`` (see the module docstring)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None

    @classmethod
    def parse(cls, raw: Any, where: str) -> ServerSpec:
        """Check one config entry (``where``: its dotted key, for the error messages)."""
        if not isinstance(raw, dict):
            raise ValueError(
                f"{where}: expected a mapping {{name, command, args, env, cwd}} "
                f"or {{name, url}}, got {raw!r}"
            )
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {sorted(_KEYS)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}.name: a non-empty string is required, got {name!r}")
        command, url = raw.get("command"), raw.get("url")
        if (command is None) == (url is None):
            raise ValueError(
                f"{where} ({name}): give exactly one of command (a stdio server) "
                "or url (a streamable HTTP server)"
            )
        args, env, cwd = raw.get("args") or [], raw.get("env") or {}, raw.get("cwd")
        if not isinstance(args, list | tuple) or not all(isinstance(a, str | int) for a in args):
            raise ValueError(f"{where}.args: a list of strings, got {args!r}")
        if not isinstance(env, dict):
            raise ValueError(f"{where}.env: a mapping of environment variables, got {env!r}")
        if url is not None:
            if not str(url).startswith(("http://", "https://")):
                raise ValueError(f"{where}.url={url!r}: an http:// or https:// address")
            if args or env or cwd:
                raise ValueError(f"{where}: args, env and cwd apply to a command, not a url")
            return cls(name=name, url=str(url))
        if cwd is not None and not Path(cwd).is_dir():
            raise ValueError(f"{where}.cwd={cwd!r}: no such folder")
        resolved = resolve_command(str(command), cwd)
        if resolved is None:
            raise ValueError(
                f"{where}.command={command!r}: not found (neither on PATH nor an executable file)"
            )
        return cls(
            name=name,
            command=resolved,
            args=tuple(str(a) for a in args),
            env=tuple((str(k), str(v)) for k, v in env.items()),
            cwd=None if cwd is None else str(cwd),
        )


def resolve_command(command: str, cwd: str | None = None) -> str | None:
    """The executable ``command`` names: ``python``/``python3`` -> ``sys.executable``, else
    ``shutil.which`` (a relative path is taken from ``cwd``); None when there is none."""
    if command in ("python", "python3"):
        return sys.executable
    if os.sep in command and cwd is not None and not os.path.isabs(command):
        command = os.path.join(cwd, command)
    return shutil.which(command)


class McpConnection:
    """One running MCP server: ``await start()`` -> its tools, ``await call(name, args)``,
    ``await close()`` (safe to call more than once, and after a failed start)."""

    def __init__(self, spec: ServerSpec, *, start_timeout_s: float, errlog: TextIO | None = None):
        self.spec, self.start_timeout_s, self.errlog = spec, start_timeout_s, errlog
        self.session: Any = None
        self.pid: int | None = None
        """The stdio server's process id (Linux; None for an HTTP server or elsewhere)."""
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._token = uuid.uuid4().hex

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> list[Any]:
        """Start the server (or connect to it) and list its tools (``mcp_types.Tool``)."""
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp-server-{self.spec.name}")
        try:
            async with asyncio.timeout(self.start_timeout_s):
                return await asyncio.shield(ready)
        except TimeoutError:
            await self.close()
            raise McpServerError(
                f"MCP server {self.spec.name!r} did not start within {self.start_timeout_s:g} s"
            ) from None
        except BaseException:
            await self.close()
            raise

    async def _serve(self, ready: asyncio.Future) -> None:
        """The client's own task: connect, list the tools, then hold the connection until
        ``close``; the SDK's shutdown runs when the ``async with`` blocks are left."""
        try:
            async with self._transport() as streams:
                if self.spec.command is not None:  # spawned: track it before anything can fail
                    self.pid = _child_with_token(self._token)
                    if self.pid is not None:
                        _LIVE_GROUPS.add(self.pid)
                async with sdk().ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    tools = await _list_tools(s)
                    self.session = s
                    ready.set_result(tools)
                    await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - reported to start(), or the close ends it
            if not ready.done():
                what = f"{type(e).__name__}: {_message(e)}"
                ready.set_exception(
                    McpServerError(f"MCP server {self.spec.name!r} failed to start: {what}")
                )
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    def _transport(self) -> Any:
        spec = self.spec
        if spec.url is not None:
            return sdk().streamable_http_client(spec.url)
        params = sdk().StdioServerParameters(
            command=spec.command,
            args=list(spec.args),
            env={**dict(spec.env), TOKEN_VAR: self._token},
            cwd=spec.cwd,
        )
        return sdk().stdio_client(params, errlog=self.errlog or sys.__stderr__)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop the client (the SDK closes the server's stdin, then terminates it) and make sure
        the server's process group is gone, also when this call is cancelled."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        if self.session is None and not task.done():  # still starting: nothing to wind down
            self.kill()
            task.cancel()
        try:  # wait() leaves the task alone when this call is cancelled, and never raises its error
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:
            self.kill()
            raise
        if done and not task.cancelled():  # the SDK's shutdown ended the process
            _LIVE_GROUPS.discard(self.pid)
        self.kill()  # shutdown overran, or the client was cancelled while starting

    def abort(self) -> None:
        """End the client's task and kill the server, without waiting (for a cancelled caller;
        ``close`` still waits for the task when it is called)."""
        self._stop.set()
        self.kill()

    def kill(self) -> None:
        """SIGKILL the server's process group if it still runs (it has one of its own: the SDK
        starts stdio servers in a new session)."""
        if self.pid is not None and self.pid in _LIVE_GROUPS:
            _LIVE_GROUPS.discard(self.pid)
            if _running(self.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)

    def alive(self) -> bool:
        """Whether the connection is up and (for a stdio server) its process runs."""
        if self._task is None or self._task.done() or self.session is None:
            return False
        return self.pid is None or _running(self.pid)

    # -- calls --------------------------------------------------------------------------------
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """``tools/call``: the ``CallToolResult``. A closed connection (the server died) raises
        :class:`McpServerError`; a JSON-RPC error from a live server re-raises ``MCPError``."""
        session = self.session
        if session is None or not self.alive():
            raise McpServerError(self._dead_message())
        try:
            return await session.call_tool(name, arguments)
        except sdk().MCPError as e:
            if e.code == sdk().types.CONNECTION_CLOSED or not self.alive():
                raise McpServerError(self._dead_message()) from e
            raise
        except Exception as e:
            if not self.alive():
                raise McpServerError(self._dead_message()) from e
            raise

    def _dead_message(self) -> str:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        return f"MCP server {self.spec.name!r}{pid} is gone: its connection closed"


async def _list_tools(session: Any) -> list[Any]:
    """Every tool of a server, following ``next_cursor`` pages."""
    result = await session.list_tools()
    tools = list(result.tools)
    while result.next_cursor:
        params = sdk().types.PaginatedRequestParams(cursor=result.next_cursor)
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
    return tools


def _message(e: BaseException) -> str:
    """One line of an exception (an ``ExceptionGroup``'s first leaf)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _child_with_token(token: str) -> int | None:
    """The child process of this one whose environment holds ``TOKEN_VAR=token`` (/proc)."""
    me, needle = os.getpid(), f"{TOKEN_VAR}={token}".encode()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    return int(entry)
        except (OSError, ValueError, IndexError):
            continue
    return None


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


@atexit.register
def _kill_leftovers() -> None:
    """Last resort at interpreter exit: kill the groups of servers whose env was never closed
    (an event loop torn down mid-episode)."""
    for pgid in list(_LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    _LIVE_GROUPS.clear()
