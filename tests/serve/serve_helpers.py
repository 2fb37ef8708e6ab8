"""Shared pieces of the server tests: a session recorder, a calculator agent
that runs its tools itself, and a way to run a coroutine against a started server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from flax import nnx

from jaxrl_agents.envs import ENVIRONMENTS
from jaxrl_agents.envs.calculator import evaluate, format_number
from jaxrl_agents.models import ModelConfig, Transformer
from jaxrl_agents.serve import Server

Calc = ENVIRONMENTS["calculator"]


class Recorder:
    """Wraps an engine: every ``generate`` of every session is logged as
    ``(session number, new ids fed, result)`` and ``(session number, sampling params)``, in call
    order."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[tuple[int, list[int], Any]] = []
        self.params: list[tuple[int, Any]] = []
        self.opened = self.closed = 0

    async def open_session(self) -> _RecordedSession:
        inner = await self.engine.open_session()
        self.opened += 1
        return _RecordedSession(self, inner, self.opened)


class _RecordedSession:
    def __init__(self, rec: Recorder, inner: Any, number: int):
        self._rec, self._inner, self.number = rec, inner, number

    def __getattr__(self, name: str) -> Any:  # bind (scripted sessions), length, ...
        return getattr(self._inner, name)

    async def generate(self, new_ids: list[int], params: Any) -> Any:
        self._rec.params.append((self.number, params))
        res = await self._inner.generate(new_ids, params)
        self._rec.calls.append((self.number, list(new_ids), res))
        return res

    async def close(self) -> None:
        self._rec.closed += 1
        await self._inner.close()


def calculator(expression: str) -> str:
    """The calculator env's tool, run by the agent itself."""
    try:
        value, _ = evaluate(expression)
    except Exception as e:  # noqa: BLE001 - a tool error is a message to the model
        return f"Error: {e}"
    return format_number(value)


async def calculator_agent(client: Any, task: Any, *, log: list | None = None, turns: int = 6):
    """A tool-using agent: asks the policy, runs each tool call it makes, sends the results back
    as tool messages, and returns the final text. The served message object goes back into the
    history as the openai SDK returned it (``log`` gets each request's messages)."""
    env = Calc()
    reset = await env.reset(task)
    messages: list[Any] = list(reset.messages)
    for _ in range(turns):
        if log is not None:
            log.append(list(messages))
        resp = await client.chat.completions.create(
            model="policy", messages=messages, tools=reset.tools, logprobs=True, max_tokens=64
        )
        msg = resp.choices[0].message
        messages.append(msg)
        if not msg.tool_calls:
            return msg.content
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.function.name,
                    "content": calculator(str(args.get("expression", ""))),
                }
            )
    return None


def serve(engine: Any, chat: Any, body, **server_kw) -> Any:
    """Run ``await body(server)`` with a started server (and a started engine when it is one
    that needs ``async with``)."""

    async def main():
        async with Server(engine, chat, **server_kw) as server:
            return await body(server)

    return asyncio.run(main())


def tiny_policy(chat: Any) -> Transformer:
    """A random tiny policy that ends its turns after a few tokens: every embedding shares a
    large component along one axis, so the final hidden state points along it, and the LM head
    reads the stop token's logit from that axis alone."""
    cfg = ModelConfig(
        model_type="qwen2",
        vocab_size=len(chat.tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    stop = chat.stop_token_ids[0]
    model.embed[...] = model.embed[...].at[:, 0].add(5.0)
    model.lm_head[...] = model.lm_head[...].at[0, :].set(0.0).at[0, stop].set(0.75)
    return model
