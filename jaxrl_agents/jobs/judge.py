"""The training job's model judge (config group ``judge``): checked with the run
(:func:`check_judge`), built with it (:func:`build_judge`: the judge model's chat format and, for
a checkpoint, its weights), and its engine started and stopped with the run
(:func:`start_judge`). The ``ModelJudge`` is registered with the reward composer under
``judge.name``, the name a ``judge`` reward term's ``params.name`` refers to."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_agents.chat import ChatFormat
from jaxrl_agents.generation import EngineConfig
from jaxrl_agents.jobs.build import build_chat, build_engine, build_model
from jaxrl_agents.jobs.config import ChatSpec, ConfigError, JudgeSpec, ModelSpec, RunConfig
from jaxrl_agents.models import Transformer
from jaxrl_agents.models.gguf import VALID, GGUFError, is_gguf, resolve_gguf
from jaxrl_agents.rewards import JUDGES
from jaxrl_agents.rollout.model_judge import ModelJudge

REFERENCE = "reference"


def judge_terms(cfg: RunConfig) -> list[str]:
    """The judge names the ``judge`` reward terms refer to (their ``params.name``)."""
    return [str(t.params.get("name", "")) for t in cfg.reward.terms if t.name == "judge"]


def check_judge(cfg: RunConfig) -> None:
    """The ``judge`` group against the reward terms and the sampler; one line naming the key."""
    spec, names = cfg.judge, judge_terms(cfg)
    if not spec.enabled:
        if spec.name in names and spec.name not in JUDGES:
            raise ConfigError(
                f"reward.terms: a judge term refers to judge {spec.name!r} (judge.name) but "
                "judge.enabled=false: set judge.enabled=true to build the model judge"
            )
        return
    if spec.name not in names:
        raise ConfigError(
            f"judge.enabled=true but no reward term uses it: add "
            f"{{name: judge, params: {{name: {spec.name}}}}} to reward.terms (e.g. reward=judged)"
        )
    if spec.model != REFERENCE and not Path(spec.model).is_dir():
        if not is_gguf(spec.model):
            raise ConfigError(
                f"judge.model={spec.model!r} is not a folder; expected {REFERENCE} (the policy at "
                f"RL start) or {VALID}"
            )
        try:
            resolve_gguf(spec.model)
        except GGUFError as e:
            raise ConfigError(f"judge.model={spec.model}: {e}") from e
    need = spec.max_prompt_tokens + spec.max_new_tokens
    if need > cfg.sampler.max_seq_len:
        raise ConfigError(
            f"judge.max_prompt_tokens={spec.max_prompt_tokens} + judge.max_new_tokens="
            f"{spec.max_new_tokens} exceeds sampler.max_seq_len={cfg.sampler.max_seq_len} (the "
            "judge engine's per-request context); lower judge.max_prompt_tokens"
        )


@dataclasses.dataclass
class JudgeRuntime:
    """The model judge of a run: the callable, and what its engine is made from."""

    spec: JudgeSpec
    judge: ModelJudge
    sampler: EngineConfig
    model: Transformer | None = None
    """The judge checkpoint's model; None for ``reference`` (made from the policy at RL start)."""

    @property
    def reference(self) -> bool:
        return self.spec.model == REFERENCE


def build_judge(cfg: RunConfig, policy_chat: ChatFormat) -> JudgeRuntime | None:
    """The run's model judge (None unless ``judge.enabled``): ``reference`` uses the policy's
    chat format; a checkpoint brings its own (its tokenizer's template) and its weights."""
    spec = cfg.judge
    if not spec.enabled:
        return None
    model, chat = None, policy_chat
    if spec.model != REFERENCE:
        try:
            chat = build_chat(ChatSpec(), spec.model)
            mspec = ModelSpec(path=spec.model, dtype=cfg.model.dtype, attention=cfg.model.attention)
            model = build_model(mspec, vocab_size=len(chat.tokenizer))
        except ConfigError as e:
            raise ConfigError(f"judge.model={spec.model}: {e}") from e
    judge = ModelJudge(
        chat,
        rubric=spec.rubric,
        on=spec.on,
        scale=tuple(spec.scale),
        max_new_tokens=spec.max_new_tokens,
        max_prompt_tokens=spec.max_prompt_tokens,
        cache=spec.cache,
    )
    return JudgeRuntime(spec, judge, cfg.sampler, model)


async def start_judge(
    rt: JudgeRuntime | None,
    stack: contextlib.AsyncExitStack,
    reference: Callable[[], Transformer],
    *,
    mesh: Any = None,
) -> None:
    """Start the run's judge engine (if any) on ``stack``, which stops it with the run: on the
    judge checkpoint, or for ``reference`` on ``reference()``, the policy at RL start (a frozen
    copy on the sampler's ``mesh``, never updated)."""
    if rt is None:
        return
    model, where = (reference(), mesh) if rt.reference else (rt.model, None)
    engine = await stack.enter_async_context(build_engine(model, rt.sampler, mesh=where))
    rt.judge.attach(engine)
    stack.callback(rt.judge.attach, None)


def frozen_copy(params: Any) -> Any:
    """Parameters the training step can never donate or overwrite (the reference judge's)."""
    return jax.tree.map(jnp.copy, params)
