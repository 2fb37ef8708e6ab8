"""The server: the app on uvicorn, in the engine's asyncio loop, plus the trainer's episode API.

    async with engine, Server(engine, chat) as server:
        key = server.open_episode(task)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key=server.api_key or "-",
                                    default_headers={"X-Episode-Id": key})
        ...  # the agent talks to the policy through client
        record = await server.close_episode(key)   # the exact token ids, segment by segment

Safe by default: it binds ``127.0.0.1``; binding any other host needs an ``api_key`` (then every
request must send ``Authorization: Bearer <api_key>``). ``port=0`` picks a free port
(:attr:`Server.port` tells which).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import uvicorn

from jaxrl_agents.generation.config import Sampling
from jaxrl_agents.serve.app import make_app
from jaxrl_agents.serve.episodes import EpisodeRecord, EpisodeStore, ServeLimits
from jaxrl_agents.types import Task


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to serve beyond this machine without a key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"refusing to serve on host={host!r} without an api_key: a non-loopback bind exposes "
            "the policy to the network; set api_key (clients then send Authorization: Bearer "
            "<api_key>) or bind host=127.0.0.1"
        )


class Server:
    """An OpenAI-compatible endpoint over ``engine`` with exact token capture per episode.

    Args:
      engine: a started sampler engine (``async with engine``), or any engine with its
        session interface (e.g. ``ScriptedEngine``).
      chat: the policy's ``ChatFormat`` (renders prompts, parses tool calls).
      host: where to listen.
      port: the port (``0``: any free port).
      api_key: required bearer key (needed for a non-loopback host).
      limits: request bounds (:class:`ServeLimits`).
      model_name: the one model ``/v1/models`` lists and responses name.
      auto_episodes: serve a request without an episode key as a one-request episode (plain
        inference, nothing recorded; see :func:`~jaxrl_agents.serve.app.make_app`).
      sampling: the distribution every request samples from (None: each request's own).
    """

    def __init__(
        self,
        engine: Any,
        chat: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        limits: ServeLimits | None = None,
        model_name: str = "policy",
        auto_episodes: bool = False,
        sampling: Sampling | None = None,
    ):
        check_bind(host, api_key)
        self.host, self.api_key, self.model_name = host, api_key, model_name
        self.store = EpisodeStore(engine, chat, limits)
        self.app = make_app(
            self.store,
            api_key=api_key,
            model_name=model_name,
            auto_episodes=auto_episodes,
            sampling=sampling,
        )
        self._port = port
        self._uvicorn: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI client's ``base_url`` (ends in ``/v1``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> Server:
        """Listen and serve in the running loop (returns once the socket accepts)."""
        if self._task is not None:
            raise RuntimeError("server already started")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(128)
        sock.setblocking(False)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=30
        )
        self._uvicorn = uvicorn.Server(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]), name="serve")
        while not self._uvicorn.started:
            if self._task.done():
                self._task.result()  # raises why it stopped
                raise RuntimeError("the server stopped before it started")
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        """Stop listening (open episodes stay readable: close them for their records)."""
        if self._task is None:
            return
        self._uvicorn.should_exit = True
        task, self._task = self._task, None
        await task

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- episodes ----------------------------------------------------------------------------
    def open_episode(self, task: Task | None = None, *, seed: int | None = None) -> str:
        """A new episode; its key goes in the agent's ``X-Episode-Id`` header (``seed``: see
        :meth:`EpisodeStore.open`)."""
        return self.store.open(task, seed=seed)

    async def close_episode(self, key: str, *, final_answer: str | None = None) -> EpisodeRecord:
        """End episode ``key``; returns its recorded segments (``final_answer`` picks which
        choice of an n > 1 last request is kept: the one whose content equals it)."""
        return await self.store.close(key, final_answer=final_answer)

    @property
    def stats(self) -> dict[str, int]:
        """Totals: requests, rewrites (histories that were not an extension), segments,
        episodes opened."""
        return dict(self.store.stats)
