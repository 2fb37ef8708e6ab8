"""Evaluate policies on an environment's held-out split: the engine behind ``jaxrl-eval``.

Policies are named by a spec string (:meth:`PolicySpec.parse`):

=================================  ==========================================================
``runs/demo/seed0``                a ``jaxrl-train`` run folder: its newest checkpoint
``runs/demo/seed0@best``           the trainer's keep-best checkpoint (by held-out success)
``runs/demo/seed0@sft``            the RL starting point = the SFT result (global step
                                   ``trainer.sft_steps``, from ``latest/`` or ``best/``)
``runs/demo/seed0@310``            global step 310
``/models/Qwen2.5-1.5B-Instruct``  a local Hugging Face folder (``models.load_pretrained``)
``scripted:oracle``                a model-free scripted policy: ``oracle`` / ``wrong`` (the
                                   env module's ``oracle_policy`` / ``wrong_policy``), ``loop``
                                   (repeats the oracle's first call), or ``pkg.mod.factory``
=================================  ==========================================================

Same tasks, same seeds: every policy runs on ``env.make_tasks(split, tasks, seed=seed)`` and each
episode's sampling seed is a function of ``(seed, task id, sample index)`` only
(``rollout.orchestrator.episode_seed``), so two policies are compared on identical inputs.
One sample per task is greedy; ``samples > 1`` samples at ``temperature`` (for pass@k).

:func:`select_snapshot` evaluates every checkpoint a run still holds (``latest/`` keeps the last
few, ``best/`` the trainer's best) with one engine whose weights are swapped per checkpoint, and
marks the best by held-out success (ties: higher mean reward, then the earlier step).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.rollout.orchestrator import Orchestrator, RolloutConfig
from jaxrl_agents.rollout.scripted import ScriptedEngine
from jaxrl_agents.types import Message, Task, Trajectory

SCRIPTED = ("oracle", "wrong", "loop")


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A policy to evaluate: ``kind`` in {run, hf, scripted}."""

    kind: str
    path: str
    which: str = "latest"
    """run: ``latest`` | ``best`` | ``sft`` | ``step``."""
    step: int | None = None
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parse a spec string (see module docstring); raises ``ValueError`` naming the problem."""
        if text.startswith("scripted:"):
            return cls("scripted", text.removeprefix("scripted:"), name=text)
        path, at, sel = text.rpartition("@") if "@" in text else (text, "", "")
        folder = Path(path)
        kind = _folder_kind(folder)
        if kind == "hf":
            if at:
                raise ValueError(
                    f"policy {text!r}: '@{sel}' only applies to jaxrl-train run folders"
                )
            return cls("hf", path, name=folder.name)
        name = f"{folder.name}@{sel}" if at else folder.name
        if not at or sel == "latest":
            return cls("run", path, "latest", name=name)
        if sel in ("best", "sft"):
            return cls("run", path, sel, name=name)
        if sel.isdigit():
            return cls("run", path, "step", step=int(sel), name=name)
        raise ValueError(f"policy {text!r}: '@{sel}' is not latest, best, sft or a step number")


def _folder_kind(folder: Path) -> str:
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ValueError(
            f"policy path {str(folder)!r} has no config.json: expected a jaxrl-train run folder, "
            "a Hugging Face model folder, or scripted:<oracle|wrong|loop|module.factory>"
        )
    data = json.loads(cfg.read_text())
    if "trainer" in data and (folder / "checkpoints").is_dir():
        return "run"
    if "model_type" in data:
        return "hf"
    raise ValueError(f"{cfg} is neither a jaxrl-train run config nor a Hugging Face config")


@dataclasses.dataclass
class EvalConfig:
    """What to evaluate on, and how (built from ``configs/eval.yaml`` by ``cli/eval.py``)."""

    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``_target_`` + constructor kwargs; empty: the first run policy's env."""
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``Env.make_tasks`` kwargs (e.g. ``two_step_frac``), over the env config's ``tasks:``."""
    split: str = "heldout"
    tasks: int = 100
    samples: int = 1
    """Samples per task (G). 1: greedy; more: sampled at ``temperature`` for pass@k."""
    ks: list[int] = dataclasses.field(default_factory=lambda: [1])
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    reward: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Reward composition (``{terms: [...]}``); empty: the first run policy's, else outcome."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    sampler: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``SamplerSpec`` fields for model policies (slots, context, buckets)."""

    def __post_init__(self) -> None:
        if self.split not in ("train", "heldout"):
            raise ValueError(f"split={self.split!r}: expected 'heldout' or 'train'")
        if self.tasks < 1 or self.samples < 1:
            raise ValueError(f"tasks={self.tasks}, samples={self.samples}: both must be >= 1")
        bad = [k for k in self.ks if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"ks={self.ks}: every k must be in [1, samples={self.samples}]")


@dataclasses.dataclass
class Setup:
    """Resolved environment, tasks and reward shared by every policy of one evaluation."""

    env_cls: type
    env_kwargs: dict[str, Any]
    tasks: list[Task]
    reward: Any

    def env_factory(self) -> Any:
        return self.env_cls(**self.env_kwargs)


def resolve_setup(cfg: EvalConfig, specs: Sequence[PolicySpec]) -> Setup:
    """Env, held-out tasks and reward composer; falls back to the first run policy's config."""
    from jaxrl_agents.rewards import RewardComposer, RewardConfig
    from jaxrl_agents.training import builders as B

    run_cfg = None
    run = next((s for s in specs if s.kind == "run"), None)
    if run is not None and (not cfg.env or not cfg.reward):
        from jaxrl_agents.training.restore import load_run_config

        run_cfg = load_run_config(run.path)
    env_cfg = cfg.env or (run_cfg.env if run_cfg else None)
    if not env_cfg:
        raise ValueError("no environment: pass env=<name> (e.g. env=calculator) or a run folder")
    env_cls, env_kwargs, task_kwargs = B.resolve_env(env_cfg)
    reward_cfg = (
        cfg.reward or (run_cfg.reward if run_cfg else {}) or {"terms": [{"name": "outcome"}]}
    )
    task_kwargs = {**task_kwargs, **cfg.task_kwargs}
    tasks = env_cls.make_tasks(cfg.split, cfg.tasks, seed=cfg.seed, **task_kwargs)
    return Setup(env_cls, env_kwargs, tasks, RewardComposer(RewardConfig.from_dict(reward_cfg)))


# -- scripted policies ---------------------------------------------------------------------------


def scripted_factory(
    name: str, env_cls: type
) -> Callable[[Task], Callable[[list[Message]], Message]]:
    """``task -> policy`` for a scripted policy name (see module docstring)."""
    from jaxrl_agents.training.builders import oracle_for

    if name == "oracle":
        return oracle_for(env_cls)
    if name == "wrong":
        fn = getattr(importlib.import_module(env_cls.__module__), "wrong_policy", None)
        if fn is None:
            raise ValueError(f"{env_cls.__name__}'s module has no wrong_policy")
        return fn
    if name == "loop":
        oracle = oracle_for(env_cls)

        def loop_factory(task: Task):
            first: dict[str, Message] = {}

            def policy(messages: list[Message]) -> Message:
                # The oracle's opening move, repeated forever (when it opens with a tool call).
                if "msg" not in first:
                    first["msg"] = oracle(task)(messages)
                return dict(first["msg"])

            return policy

        return loop_factory
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(
            f"scripted policy {name!r}: not one of {SCRIPTED} nor an importable factory ({e})"
        ) from e


# -- running -------------------------------------------------------------------------------------


def _orchestrator(engine: Any, chat: Any, setup: Setup, cfg: EvalConfig) -> Orchestrator:
    from jaxrl_agents.training.builders import sampling_factory

    greedy = cfg.samples == 1
    return Orchestrator(
        engine=engine,
        chat=chat,
        env_factory=setup.env_factory,
        cfg=dataclasses.replace(cfg.rollout, group_size=cfg.samples),
        sampling_params=sampling_factory(
            temperature=0.0 if greedy else cfg.temperature,
            top_p=1.0 if greedy else cfg.top_p,
            top_k=0,
            stop_ids=chat.stop_token_ids,
        ),
        reward_fn=setup.reward.acompute,
    )


async def _rollouts(engine: Any, chat: Any, setup: Setup, cfg: EvalConfig) -> list[Trajectory]:
    orch = _orchestrator(engine, chat, setup, cfg)
    return await orch.run(setup.tasks, group_size=cfg.samples, seed=cfg.seed)


def _sampler_spec(cfg: EvalConfig):
    from jaxrl_agents.training.config import SamplerSpec, build

    return build(SamplerSpec, dict(cfg.sampler), "sampler")


def _run_steps(run_dir: str | Path, which: Sequence[str] = ("latest", "best")) -> tuple:
    """Sorted kept steps of each checkpoint set in ``which`` (latest / best / sft)."""
    from jaxrl_agents.training.checkpoint import Checkpointer

    ckpt = Checkpointer(Path(run_dir) / "checkpoints", best_metric="heldout_success")
    try:
        return tuple(sorted(ckpt.all_steps(w)) for w in which)
    finally:
        ckpt.close()


def _load_run(spec: PolicySpec, step: int | None = None):
    """``(model, tokenizer, meta, global step)`` of a run checkpoint selected by ``spec``."""
    from jaxrl_agents.training.restore import load_policy, load_run_config

    latest, best, sft = _run_steps(spec.path, ("latest", "best", "sft"))
    which, want = spec.which, step if step is not None else spec.step
    if spec.which == "sft":
        want = load_run_config(spec.path).trainer.sft_steps
        if want in sft:  # the trainer keeps the SFT result in sft/
            model, tokenizer, meta = load_policy(spec.path, which="sft", step=want)
            return model, tokenizer, meta, want
    if want is not None:
        if want in latest:
            which = "latest"
        elif want in best:
            which = "best"
        else:
            raise ValueError(
                f"{spec.path}: no checkpoint at step {want} ({spec.which}); kept steps: "
                f"latest {latest}, best {best}"
            )
    model, tokenizer, meta = load_policy(spec.path, which=which, step=want)
    found = want if want is not None else (latest or best)[-1] if which == "latest" else best[-1]
    return model, tokenizer, meta, found


async def _evaluate_model(model: Any, tokenizer: Any, setup: Setup, cfg: EvalConfig):
    from jaxrl_agents.chat import ChatFormat
    from jaxrl_agents.training.builders import build_engine

    chat = ChatFormat(tokenizer)
    async with build_engine(model, _sampler_spec(cfg)) as engine:
        return await _rollouts(engine, chat, setup, cfg)


def evaluate_policy(spec: PolicySpec, setup: Setup, cfg: EvalConfig) -> list[Trajectory]:
    """All ``tasks x samples`` trajectories of one policy (ordered by task, then sample)."""
    if spec.kind == "scripted":
        from jaxrl_agents.chat import ChatFormat, load_tiny_tokenizer

        chat = ChatFormat(load_tiny_tokenizer())
        engine = ScriptedEngine(chat, policy_factory=scripted_factory(spec.path, setup.env_cls))
        return asyncio.run(_rollouts(engine, chat, setup, cfg))
    if spec.kind == "hf":
        from jaxrl_agents.models import load_pretrained

        model, tokenizer = load_pretrained(spec.path, tokenizer=True)
        if tokenizer is None:
            raise ValueError(f"{spec.path} has no tokenizer files: cannot render the chat")
    elif spec.kind == "run":
        model, tokenizer, _, _ = _load_run(spec)
    else:
        raise ValueError(f"policy kind {spec.kind!r}: expected run, hf or scripted")
    return asyncio.run(_evaluate_model(model, tokenizer, setup, cfg))


def select_snapshot(
    run_dir: str | Path, setup: Setup, cfg: EvalConfig
) -> tuple[list[dict[str, Any]], dict[int, list[Trajectory]]]:
    """Evaluate every checkpoint a run holds; rows (by step) with the best one marked."""
    from jaxrl_agents.training.restore import load_run_config

    latest, best = _run_steps(run_dir)
    steps = sorted(set(latest) | set(best))
    if not steps:
        raise ValueError(f"{run_dir}: no complete checkpoint under checkpoints/latest or best")
    sft_step = load_run_config(run_dir).trainer.sft_steps
    spec = PolicySpec("run", str(run_dir), "step")

    async def all_steps() -> dict[int, list[Trajectory]]:
        from jaxrl_agents.chat import ChatFormat
        from jaxrl_agents.training.builders import build_engine

        model, tokenizer, _, _ = _load_run(spec, steps[0])
        chat, out = ChatFormat(tokenizer), {}
        async with build_engine(model, _sampler_spec(cfg)) as engine:
            for i, step in enumerate(steps):
                if i:  # same architecture: swap weights, no recompilation
                    engine.update_weights(_load_run(spec, step)[0])
                out[step] = await _rollouts(engine, chat, setup, cfg)
        return out

    results = asyncio.run(all_steps())
    rows = []
    for step, trajs in results.items():
        s = summarize(trajs)
        rows.append(
            {
                "step": step,
                "label": "sft" if step == sft_step else "rl",
                "success": s["success"],
                "success_ci95": s["success_ci95"],
                "mean_reward": s["mean_reward"],
                "trainer_best": step in best,
                "best": False,
            }
        )
    mark_best(rows)
    return rows, results


def mark_best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Set ``best`` on the row with the highest success (ties: reward, then earlier step)."""
    top = max(rows, key=lambda r: (r["success"], r.get("mean_reward", 0.0), -r["step"]))
    for r in rows:
        r["best"] = r is top
    return top


def run_evaluation(
    cfg: EvalConfig,
    policies: Sequence[str],
    *,
    out: str | Path,
    snapshots: str | Path | None = None,
    title: str = "jaxrl_agents evaluation",
    max_trajectories: int = 20,
    max_pairs: int = 6,
    progress: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Evaluate ``policies`` (spec strings; the first is the baseline) and/or every checkpoint of
    the run ``snapshots``; write ``report.html``, ``report.json`` and one
    ``trajectories_<policy>.jsonl`` per policy into ``out``. Returns the report's JSON data."""
    from jaxrl_agents.evaluation.report import build_report, write_report
    from jaxrl_agents.types import write_jsonl

    if not policies and snapshots is None:
        raise ValueError("nothing to evaluate: give policies=[...] and/or snapshots=<run folder>")
    specs = _unique_names([PolicySpec.parse(p) for p in policies])
    snap_spec = [PolicySpec("run", str(snapshots))] if snapshots is not None else []
    setup = resolve_setup(cfg, [*specs, *snap_spec])
    say = progress or (lambda _: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Trajectory]] = {}
    for spec in specs:
        say(f"evaluating {spec.name} ({spec.kind}) on {len(setup.tasks)} {cfg.split} tasks")
        results[spec.name] = evaluate_policy(spec, setup, cfg)
        s = summarize(results[spec.name])
        say(f"  success {s['success']:.3f} (95% CI {s['success_ci95'][0]:.3f}-"
            f"{s['success_ci95'][1]:.3f})")  # fmt: skip
    rows = None
    if snapshots is not None:
        say(f"snapshot selection over {snapshots}")
        rows, by_step = select_snapshot(snapshots, setup, cfg)
        best = next(r for r in rows if r["best"])
        say(f"  best: step {best['step']} success {best['success']:.3f}")
        if not results:  # no explicit policies: report the best snapshot against the last one
            last = max(by_step)
            results[f"step{best['step']}(best)"] = by_step[best["step"]]
            if last != best["step"]:
                results[f"step{last}(last)"] = by_step[last]
    for name, trajs in results.items():
        write_jsonl(out / f"trajectories_{_safe(name)}.jsonl", trajs)
    meta = {
        "env": f"{setup.env_cls.__module__}.{setup.env_cls.__name__}",
        "split": cfg.split,
        "tasks": len(setup.tasks),
        "samples_per_task": cfg.samples,
        "seed": cfg.seed,
        "decoding": "greedy" if cfg.samples == 1 else f"temperature {cfg.temperature}",
        "policies": {s.name: f"{s.kind}:{s.path}@{s.which}" for s in specs},
        "snapshots": str(snapshots) if snapshots is not None else None,
    }
    html_text, data = build_report(
        results, title=title, meta=meta, ks=cfg.ks, snapshots=rows,
        max_trajectories=max_trajectories, max_pairs=max_pairs,
    )  # fmt: skip
    html_path, _ = write_report(out, html_text, data)
    say(f"report: {html_path.resolve()}")
    return data


def _unique_names(specs: list[PolicySpec]) -> list[PolicySpec]:
    seen: dict[str, int] = {}
    out = []
    for s in specs:
        n = seen.get(s.name, 0)
        seen[s.name] = n + 1
        out.append(dataclasses.replace(s, name=f"{s.name}#{n + 1}") if n else s)
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
