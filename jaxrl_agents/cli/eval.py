"""``jaxrl-eval``: evaluate policies on an environment's held-out split and write a report.

    jaxrl-eval policies=[runs/demo/seed0@sft,runs/demo/seed0] env=calculator tasks=100
    jaxrl-eval snapshots=runs/demo/seed0                    # all checkpoints, best marked
    jaxrl-eval policies=[/models/Qwen2.5-1.5B-Instruct] env=sql samples=8 ks=[1,4,8] \
        rollout.sampling.temperature=0.7
    jaxrl-eval policies=[scripted:wrong,scripted:oracle] env=calculator tasks=20   # no model

Writes ``<out>/report.html`` (self-contained), ``report.json`` and one trajectories JSONL per
policy. The first policy is the baseline of the side-by-side sections. Config: ``configs/eval.yaml``
over :class:`~jaxrl_agents.jobs.config.EvalConfig` (``env``/``reward`` default to the first run
policy's).
"""

from __future__ import annotations

from jaxrl_agents.cli.app import reported, run_app


def to_eval_config(tree):
    """Composed OmegaConf tree -> EvalConfig (strict)."""
    from jaxrl_agents.jobs.config import EvalConfig, from_tree

    return from_tree(EvalConfig, tree)


def _main(tree) -> None:
    from jaxrl_agents.jobs.evaluate import run_evaluation

    with reported(extra=(ValueError,)):
        run_evaluation(to_eval_config(tree))


def main() -> None:
    run_app("eval", _main)


if __name__ == "__main__":
    main()
