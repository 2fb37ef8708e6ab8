"""The ASGI app: OpenAI's ``/v1/chat/completions`` and ``/v1/models`` over an :class:`EpisodeStore`.

Request fields: ``messages``, ``tools``, ``tool_choice`` (``"auto"``, or ``"none"``: the tools are
still rendered, so the prompt stays the episode's, but nothing is parsed as a call),
``temperature``, ``top_p``, ``max_tokens`` (or ``max_completion_tokens``), ``n``, ``logprobs``,
``stop`` (strings, matched as their token ids), ``seed``; vLLM's ``top_k`` / ``min_p`` too. The
episode key comes from the ``X-Episode-Id`` header or a top-level ``episode_id`` field (what the
openai client's ``extra_body`` sends). ``model`` is accepted whatever it names. Streaming is not
supported. ``logprobs`` report each sampled token's behaviour logprob (under the distribution it
was sampled from: the policy's at temperature 1, unfiltered), the value the record keeps.

Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "param", "code"}}``): 400 for a
malformed request or one past a :class:`ServeLimits` bound (the message names the limit and the
value), 401 for a missing or wrong bearer key, 404 for an unknown episode, 409 for a second
request of an episode while one is in flight, 413 for a body over ``max_body_bytes``.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from jaxrl_agents.generation.config import Sampling, SamplingParams
from jaxrl_agents.rollout.orchestrator import episode_seed, turn_seed
from jaxrl_agents.serve.episodes import Choice, EpisodeStore, ServeLimits
from jaxrl_agents.serve.messages import BadRequest, openai_message
from jaxrl_agents.types import EndReason

EPISODE_HEADER = "X-Episode-Id"


def make_app(
    store: EpisodeStore,
    *,
    api_key: str | None = None,
    model_name: str = "policy",
    auto_episodes: bool = False,
    sampling: Sampling | None = None,
) -> Starlette:
    """The app serving ``store``'s episodes; with ``api_key`` every route requires
    ``Authorization: Bearer <api_key>``. ``auto_episodes``: a request without an episode key is
    served as a one-request episode of its own, opened and closed around it (plain inference,
    nothing kept: what ``jaxrl-serve`` does for clients outside training); a request naming an
    unknown key is still a 404. ``sampling``: the distribution every request samples from,
    whatever it asks (training: the rollout group's settings, which the update's log-probs
    assume; evaluation: greedy); None: the request's ``temperature`` / ``top_p`` / ``top_k`` /
    ``min_p``."""

    async def models(request: Request) -> JSONResponse:
        try:
            _check_auth(request, api_key)
        except BadRequest as e:
            return _error(e)
        model = {"id": model_name, "object": "model", "created": 0, "owned_by": "jaxrl_agents"}
        return JSONResponse({"object": "list", "data": [model]})

    async def chat_completions(request: Request) -> JSONResponse:
        try:
            _check_auth(request, api_key)
            body = await _read_json(request, store.limits.max_body_bytes)
            key = request.headers.get(EPISODE_HEADER) or body.get("episode_id")
            one_off = not key and auto_episodes  # plain inference: an episode for this request
            if one_off:
                key = store.open()
            try:
                ep = store.lookup(key if isinstance(key, str) else None)
                if ep.lock.locked():
                    raise BadRequest(f"episode {ep.key!r} has a request in flight", status=409)
                async with ep.lock:
                    return JSONResponse(await _complete(store, ep, body, model_name, sampling))
            finally:
                if one_off:
                    await store.close(key)
        except BadRequest as e:
            return _error(e)
        except Exception as e:  # noqa: BLE001 - the engine failed this request: say so as JSON
            return _error(BadRequest(f"{type(e).__name__}: {e}", status=500))

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.store = store
    return app


async def _complete(
    store: EpisodeStore, ep: Any, body: dict, model_name: str, sampling: Sampling | None = None
) -> dict:
    """One chat completion of episode ``ep``: validate, record the messages, sample, respond."""
    lim, chat = store.limits, store.chat
    messages, tools, choice, n, max_tokens = _check_request(body, lim)
    stops = _stop_sequences(body.get("stop"), chat, lim.max_stop)
    seeds = _choice_seeds(body, ep, n)

    new_ids = await store.prepare(ep, messages, tools)
    room = store.room(ep)
    if room < 1:
        ep.end_hint = EndReason.MAX_TOKENS
        raise BadRequest(
            f"the episode's segment holds {lim.max_segment_tokens - room} tokens: "
            f"limits.max_segment_tokens={lim.max_segment_tokens} reached",
            param="messages",
        )
    try:
        dist = sampling or Sampling(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=_int(body, "top_k", 0),
            min_p=float(body.get("min_p", 0.0)),
        )
        params = [
            SamplingParams(
                temperature=dist.temperature,
                top_p=dist.top_p,
                top_k=dist.top_k,
                min_p=dist.min_p,
                max_new_tokens=min(max_tokens, room),
                stop_token_ids=tuple(chat.stop_token_ids),
                stop_sequences=stops,
                seed=seeds[k],
            )
            for k in range(n)
        ]
    except (TypeError, ValueError) as e:
        raise BadRequest(f"bad sampling settings: {e}") from e
    choices = await store.sample(ep, new_ids, params, tools_on=bool(tools) and choice == "auto")
    context = len(ep.current.token_ids)
    completion = sum(len(c.ids) for c in choices)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            _choice(i, c, chat, logprobs=bool(body.get("logprobs"))) for i, c in enumerate(choices)
        ],
        "usage": {
            "prompt_tokens": context,
            "completion_tokens": completion,
            "total_tokens": context + completion,
        },
    }


def _check_request(body: dict, lim: ServeLimits) -> tuple[list, list, str, int, int]:
    """The request's ``(messages, tools, tool_choice, n, max_tokens)``; :class:`BadRequest` for a
    malformed one or one past a ``lim`` bound."""
    messages, tools = body.get("messages"), body.get("tools") or []
    if not isinstance(messages, list):
        raise BadRequest("messages must be a list", param="messages")
    if len(messages) > lim.max_messages:
        raise BadRequest(
            f"{len(messages)} messages > limits.max_messages={lim.max_messages}", param="messages"
        )
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequest("tools must be a list of objects", param="tools")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported", param="stream")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise BadRequest(
            f"tool_choice={choice!r} is not supported (auto, none)", param="tool_choice"
        )
    n = _int(body, "n", 1)
    if not 1 <= n <= lim.max_n:
        raise BadRequest(f"n={n} is outside [1, limits.max_n={lim.max_n}]", param="n")
    name = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    max_tokens = _int(body, name, min(lim.default_max_tokens, lim.max_tokens))
    if not 1 <= max_tokens <= lim.max_tokens:
        raise BadRequest(
            f"{name}={max_tokens} is outside [1, limits.max_tokens={lim.max_tokens}]",
            param=name,
        )
    if _int(body, "top_logprobs", 0):
        raise BadRequest("top_logprobs is not supported", param="top_logprobs")
    return messages, tools, choice, n, max_tokens


def _choice(index: int, c: Choice, chat: Any, *, logprobs: bool) -> dict[str, Any]:
    finish = "length" if c.finish_reason != "stop" else "stop"
    if finish == "stop" and c.message.get("tool_calls"):
        finish = "tool_calls"
    out: dict[str, Any] = {
        "index": index,
        "message": openai_message(c.message),
        "finish_reason": finish,
        "logprobs": None,
    }
    if logprobs:
        content = []
        for i, lp in zip(c.ids, c.logprobs, strict=True):
            token = chat.tokenizer.decode([i], skip_special_tokens=False)
            content.append(
                {"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
            )
        out["logprobs"] = {"content": content}
    return out


def _check_auth(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), api_key):
        raise BadRequest("missing or wrong API key (Authorization: Bearer <key>)", status=401)


async def _read_json(request: Request, limit: int) -> dict:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise BadRequest(
            f"request body of {size} bytes > limits.max_body_bytes={limit}", status=413
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(
                f"request body of more than {limit} bytes > limits.max_body_bytes={limit}",
                status=413,
            )
    try:
        out = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not JSON: {e}") from e
    if not isinstance(out, dict):
        raise BadRequest("request body must be a JSON object")
    return out


def _int(body: dict, name: str, default: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise BadRequest(f"{name}={value!r} must be an integer", param=name)
    return int(value)


def _stop_sequences(stop: Any, chat: Any, limit: int) -> tuple[tuple[int, ...], ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or a list of them", param="stop")
    if len(stops) > limit:
        raise BadRequest(f"{len(stops)} stop strings > limits.max_stop={limit}", param="stop")
    return tuple(tuple(chat.encode_plain(s)) for s in stops)


def _choice_seeds(body: dict, ep: Any, n: int) -> list[int]:
    """The sampling seed of each of the ``n`` choices. A request without ``seed`` takes the
    built-in loop's rule for its first choice (:func:`turn_seed` of the episode's seed and its
    request count), so an agent that sends what the built-in loop sends samples the same tokens;
    further choices get seeds of their own."""
    if body.get("seed") is not None:
        base = _int(body, "seed", 0)
        return [(base + k) & 0xFFFFFFFF for k in range(n)]
    first = turn_seed(ep.seed, ep.requests)
    return [first] + [episode_seed(ep.seed, f"serve/{ep.requests}", k) for k in range(1, n)]


def _error(e: BadRequest) -> JSONResponse:
    kind = {
        401: "authentication_error",
        404: "not_found_error",
        409: "conflict_error",
        500: "server_error",
    }
    body = {
        "error": {
            "message": str(e),
            "type": kind.get(e.status, "invalid_request_error"),
            "param": e.param,
            "code": e.status,
        }
    }
    return JSONResponse(body, status_code=e.status)
