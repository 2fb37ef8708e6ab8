"""``jaxrl-serve``'s job: an OpenAI-compatible endpoint over one policy (``jaxrl_agents.serve``).

The policy is a run folder's checkpoint or the ``model`` group's model; the engine and the server
share one asyncio loop. Requests without an episode key are plain inference (``auto_episodes``);
training opens its own episodes through :class:`~jaxrl_agents.serve.Server`'s Python API.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

from jaxrl_agents.chat import ChatFormat
from jaxrl_agents.evaluation.policies import PolicySpec
from jaxrl_agents.jobs.build import build_chat, build_engine, build_model
from jaxrl_agents.jobs.config import ConfigError, ServeConfig
from jaxrl_agents.jobs.evaluate import load_run, policy_chat
from jaxrl_agents.models import Transformer
from jaxrl_agents.serve.server import Server, check_bind


def served_policy(cfg: ServeConfig) -> tuple[Transformer, ChatFormat, str]:
    """``(model, chat format, name)`` of what ``cfg`` serves."""
    if cfg.run is not None:
        try:
            spec = PolicySpec.parse(cfg.run)
        except ValueError as e:
            raise ConfigError(f"run={cfg.run!r}: {e}") from e
        if spec.kind != "run":
            raise ConfigError(
                f"run={cfg.run!r} is not a jaxrl-train run folder; serve a checkpoint with "
                "model.path=<HF folder or GGUF file> (or model=smollm2)"
            )
        model, _, _, _ = load_run(spec)
        return model, policy_chat(spec, cfg.chat), spec.name
    chat = build_chat(cfg.chat, cfg.model.path)
    model = build_model(cfg.model, vocab_size=len(chat.tokenizer), seed=cfg.seed)
    name = Path(cfg.model.path).stem if cfg.model.path else "tiny"
    return model, chat, name


async def serve(cfg: ServeConfig, model: Any, chat: ChatFormat, name: str) -> None:
    """Serve until SIGINT / SIGTERM or ``cfg.max_seconds``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    async with build_engine(model, cfg.sampler) as engine:
        server = Server(
            engine,
            chat,
            host=cfg.host,
            port=cfg.port,
            api_key=cfg.api_key,
            limits=cfg.limits,
            model_name=cfg.model_name or name,
            auto_episodes=True,
        )
        async with server:
            print(f"serving {cfg.model_name or name} at {server.base_url}", flush=True)
            if cfg.ready_file:
                Path(cfg.ready_file).write_text(server.base_url + "\n")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.max_seconds)
        print(f"stopped; served {server.stats.get('requests', 0)} requests", file=sys.stderr)


def run_serve(cfg: ServeConfig) -> None:
    """Check the bind, load the policy, serve."""
    try:
        check_bind(cfg.host, cfg.api_key)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    model, chat, name = served_policy(cfg)
    asyncio.run(serve(cfg, model, chat, name))
