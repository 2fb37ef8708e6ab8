"""``jaxrl-eval``'s job: evaluate policies on an environment's split and write a report.

Same tasks, same seeds: every policy runs on ``env.make_tasks(split, tasks, seed=seed)`` and each
episode's sampling seed is a function of ``(seed, task id, sample index)`` only
(``rollout.orchestrator.episode_seed``), so two policies are compared on identical inputs. One
sample per task is greedy; ``samples > 1`` samples with the ``rollout`` group's settings
(temperature, top-k, top-p, min-p), the same fields training samples with, for pass@k.

:func:`select_snapshot` evaluates every checkpoint a run still holds (``latest/`` keeps the last
few, ``best/`` the trainer's best) with one engine whose weights are swapped per checkpoint, and
marks the best by held-out success (ties: higher mean reward, then the earlier step). Policy specs
are parsed by ``evaluation.policies.PolicySpec``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxrl_agents.evaluation.policies import PolicySpec, mark_best, safe_name, unique_names
from jaxrl_agents.evaluation.summary import summarize
from jaxrl_agents.jobs.build import (
    EnvBinding,
    build_chat,
    build_collector,
    build_engine,
    build_reward,
    check_oracle_limits,
    resolve_env,
)
from jaxrl_agents.jobs.config import ChatSpec, EvalConfig
from jaxrl_agents.jobs.restore import kept_steps, load_policy, load_run_config
from jaxrl_agents.rewards import RewardConfig, TermConfig
from jaxrl_agents.rollout import Collector
from jaxrl_agents.rollout.scripted import ScriptedEngine, scripted_factory
from jaxrl_agents.types import Task, Trajectory


@dataclasses.dataclass
class Setup:
    """Resolved environment, tasks and reward shared by every policy of one evaluation."""

    env: EnvBinding
    tasks: list[Task]
    reward: Any

    @property
    def env_cls(self) -> type:
        return self.env.cls


def resolve_setup(cfg: EvalConfig, specs: Sequence[PolicySpec]) -> Setup:
    """Env, tasks and reward composer; env and reward fall back to the first run policy's."""
    run_cfg = None
    run = next((s for s in specs if s.kind == "run"), None)
    if run is not None and (cfg.env is None or cfg.reward is None):
        run_cfg = load_run_config(run.path)
    env_spec = cfg.env or (run_cfg.env if run_cfg else None)
    if env_spec is None:
        raise ValueError("no environment: pass env=<name> (e.g. env=calculator) or a run folder")
    env = resolve_env(env_spec, extra_task_kwargs=cfg.task_kwargs)
    reward_cfg = cfg.reward or (run_cfg.reward if run_cfg else None)
    reward_cfg = reward_cfg or RewardConfig(terms=[TermConfig("outcome")])
    tasks = env.tasks(cfg.split, cfg.tasks, seed=cfg.seed)
    return Setup(env, tasks, build_reward(reward_cfg))


# -- running -------------------------------------------------------------------------------------


def _collector(chat: Any, setup: Setup, cfg: EvalConfig) -> Collector:
    return build_collector(
        chat=chat, env_factory=setup.env.factory, rollout=cfg.rollout, reward=setup.reward
    )


async def _rollouts(engine: Any, chat: Any, setup: Setup, cfg: EvalConfig) -> list[Trajectory]:
    """Every task x ``samples`` scored episodes (greedy when ``samples == 1``)."""
    collector = _collector(chat, setup, cfg)
    roll = await collector.collect(
        engine,
        setup.tasks,
        group_size=cfg.samples,
        seed=cfg.seed,
        greedy=cfg.samples == 1,
        even=False,
    )
    await collector.score(roll.trajectories)
    return roll.trajectories


def load_run(spec: PolicySpec, step: int | None = None):
    """``(model, tokenizer, meta, global step)`` of a run checkpoint selected by ``spec``."""
    latest, best, sft = kept_steps(spec.path, ("latest", "best", "sft"))
    which, want = spec.which, step if step is not None else spec.step
    if spec.which == "sft":
        want = load_run_config(spec.path).trainer.sft.steps
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


def _decoding(cfg: EvalConfig) -> str:
    r = cfg.rollout.sampling
    return f"temperature {r.temperature}, top_p {r.top_p}, top_k {r.top_k}, min_p {r.min_p}"


async def _evaluate_model(model: Any, chat: Any, setup: Setup, cfg: EvalConfig):
    async with build_engine(model, cfg.sampler) as engine:
        return await _rollouts(engine, chat, setup, cfg)


def overlay(base: ChatSpec, top: ChatSpec) -> ChatSpec:
    """``base`` with every field ``top`` sets away from its default."""
    default = ChatSpec()
    changed = {
        f.name: getattr(top, f.name)
        for f in dataclasses.fields(ChatSpec)
        if getattr(top, f.name) != getattr(default, f.name)
    }
    return dataclasses.replace(base, **changed)


def policy_chat(spec: PolicySpec, chat: ChatSpec) -> Any:
    """The chat format a policy runs with: a run folder's own, with the fields ``chat`` sets
    (see ``EvalConfig.chat``) over it; else ``chat`` for the checkpoint's tokenizer."""
    if spec.kind == "run":
        run_cfg = load_run_config(spec.path)
        return build_chat(overlay(run_cfg.chat, chat), run_cfg.model.path)
    if spec.kind == "hf":
        return build_chat(chat, spec.path)
    return build_chat(chat)


def check_chat(chat: Any, setup: Setup, cfg: EvalConfig) -> None:
    """Start-up check of a policy's chat format on the env's oracle (when it has one): a template
    / tool-parser mismatch, or ``rollout`` / ``sampler`` limits that cannot hold the oracle's
    episodes through this tokenizer, stop the evaluation in one line (instead of a report of
    cut-off episodes)."""
    try:
        setup.env.oracle({})
    except ValueError:
        return
    extra = [("sampler.max_seq_len", cfg.sampler.max_seq_len, "total_tokens", "tokens in all")]
    asyncio.run(check_oracle_limits(chat, setup.env, {}, cfg.rollout, extra, n=8))


def evaluate_policy(spec: PolicySpec, setup: Setup, cfg: EvalConfig) -> list[Trajectory]:
    """All ``tasks x samples`` trajectories of one policy (ordered by task, then sample)."""
    if spec.kind not in ("run", "hf", "scripted"):
        raise ValueError(f"policy kind {spec.kind!r}: expected run, hf or scripted")
    chat = policy_chat(spec, cfg.chat)
    check_chat(chat, setup, cfg)
    if spec.kind == "scripted":
        engine = ScriptedEngine(chat, policy_factory=scripted_factory(spec.path, setup.env.cls))
        return asyncio.run(_rollouts(engine, chat, setup, cfg))
    if spec.kind == "hf":
        from jaxrl_agents.models import load_pretrained

        model, _ = load_pretrained(spec.path, tokenizer=False)
    else:
        model, _, _, _ = load_run(spec)
    return asyncio.run(_evaluate_model(model, chat, setup, cfg))


def select_snapshot(
    run_dir: str | Path, setup: Setup, cfg: EvalConfig
) -> tuple[list[dict[str, Any]], dict[int, list[Trajectory]]]:
    """Evaluate every checkpoint a run holds; rows (by step) with the best one marked."""
    latest, best = kept_steps(run_dir)
    steps = sorted(set(latest) | set(best))
    if not steps:
        raise ValueError(f"{run_dir}: no complete checkpoint under checkpoints/latest or best")
    sft_step = load_run_config(run_dir).trainer.sft.steps
    spec = PolicySpec("run", str(run_dir), "step")

    chat = policy_chat(spec, cfg.chat)

    async def all_steps() -> dict[int, list[Trajectory]]:
        model, _, _, _ = load_run(spec, steps[0])
        out: dict[int, list[Trajectory]] = {}
        async with build_engine(model, cfg.sampler) as engine:
            for i, step in enumerate(steps):
                if i:  # same architecture: swap weights, no recompilation
                    engine.update_weights(load_run(spec, step)[0])
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


def run_evaluation(
    cfg: EvalConfig,
    policies: Sequence[str] | None = None,
    *,
    out: str | Path | None = None,
    snapshots: str | Path | None = None,
    progress: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Evaluate ``policies`` (spec strings, default ``cfg.policies``; the first is the baseline)
    and/or every checkpoint of the run ``snapshots`` (default ``cfg.snapshots``); write
    ``report.html``, ``report.json`` and one ``trajectories_<policy>.jsonl`` per policy into
    ``out`` (default ``cfg.out``). Returns the report's JSON data."""
    from jaxrl_agents.evaluation.report import build_report, write_report
    from jaxrl_agents.types import write_jsonl

    policies = list(cfg.policies if policies is None else policies)
    out = cfg.out if out is None else out
    snapshots = cfg.snapshots if snapshots is None else snapshots
    title, max_trajectories, max_pairs = cfg.title, cfg.max_trajectories, cfg.max_pairs
    if not policies and snapshots is None:
        raise ValueError("nothing to evaluate: give policies=[...] and/or snapshots=<run folder>")
    specs = unique_names([PolicySpec.parse(p) for p in policies])
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
        say(
            f"  success {s['success']:.3f} (95% CI {s['success_ci95'][0]:.3f}-"
            f"{s['success_ci95'][1]:.3f})"
        )
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
        write_jsonl(out / f"trajectories_{safe_name(name)}.jsonl", trajs)
    meta = {
        "env": setup.env.label,
        "split": cfg.split,
        "tasks": len(setup.tasks),
        "samples_per_task": cfg.samples,
        "seed": cfg.seed,
        "decoding": "greedy" if cfg.samples == 1 else _decoding(cfg),
        "policies": {s.name: f"{s.kind}:{s.path}@{s.which}" for s in specs},
        "snapshots": str(snapshots) if snapshots is not None else None,
    }
    html_text, data = build_report(
        results,
        title=title,
        meta=meta,
        ks=cfg.ks,
        snapshots=rows,
        max_trajectories=max_trajectories,
        max_pairs=max_pairs,
    )
    html_path, _ = write_report(out, html_text, data)
    say(f"report: {html_path.resolve()}")
    return data
