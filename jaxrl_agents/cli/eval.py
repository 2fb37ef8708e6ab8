"""``jaxrl-eval``: evaluate policies on an environment's held-out split and write a report.

    jaxrl-eval policies=[runs/demo/seed0@sft,runs/demo/seed0] env=calculator tasks=100
    jaxrl-eval snapshots=runs/demo/seed0                    # all checkpoints, best marked
    jaxrl-eval policies=[/models/Qwen2.5-1.5B-Instruct] env=sql samples=8 ks=[1,4,8]
    jaxrl-eval policies=[scripted:wrong,scripted:oracle] env=calculator tasks=20   # no model

Writes ``<out>/report.html`` (self-contained), ``report.json`` and one trajectories JSONL per
policy. The first policy is the baseline of the side-by-side sections.
Config: ``configs/eval.yaml`` (``env``/``reward`` default to the first run policy's).
"""

from __future__ import annotations

import logging
import os
import sys

from jaxrl_agents.cli.train import CONFIG_DIR

_RUN_KEYS = ("policies", "snapshots", "out", "title", "max_trajectories", "max_pairs")


def to_eval_config(dict_cfg):
    """OmegaConf tree -> (EvalConfig, the run options in ``_RUN_KEYS``), strictly."""
    from omegaconf import OmegaConf

    from jaxrl_agents.evaluation.runner import EvalConfig
    from jaxrl_agents.training.config import build

    data = OmegaConf.to_container(dict_cfg, resolve=True)
    data.pop("hydra", None)
    opts = {k: data.pop(k, None) for k in _RUN_KEYS}
    data["env"] = data.get("env") or {}
    data["reward"] = data.get("reward") or {}
    return build(EvalConfig, data), opts


def _main(dict_cfg) -> None:
    from jaxrl_agents.evaluation.runner import run_evaluation
    from jaxrl_agents.training.config import ConfigError

    try:
        cfg, opts = to_eval_config(dict_cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        run_evaluation(
            cfg,
            list(opts["policies"] or []),
            out=opts["out"],
            snapshots=opts["snapshots"],
            title=opts["title"],
            max_trajectories=opts["max_trajectories"],
            max_pairs=opts["max_pairs"],
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    import hydra

    logging.getLogger("absl").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    hydra.main(config_path=CONFIG_DIR, config_name="eval", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
