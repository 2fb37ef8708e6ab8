"""``jaxrl-export``: any checkpoint of a run -> a Hugging Face folder transformers loads.

jaxrl-export run_dir=runs/demo/seed0                 # newest checkpoint
jaxrl-export run_dir=runs/demo/seed0 which=best out=/tmp/best_hf
jaxrl-export run_dir=runs/demo/seed0 step=310
jaxrl-export run_dir=runs/qwen/seed0 dtype=float32   # default: the source checkpoint's dtype
"""

from __future__ import annotations

import logging

from jaxrl_agents.cli.app import reported, run_app


def _main(tree) -> None:
    from jaxrl_agents.jobs.config import ConfigError, ExportConfig, from_tree
    from jaxrl_agents.jobs.export import export_run

    for name in ("absl", "jax", "orbax"):  # library INFO chatter, not the user's business
        logging.getLogger(name).setLevel(logging.WARNING)
    with reported(extra=(ValueError,)):
        cfg = from_tree(ExportConfig, tree)
        if cfg.run_dir is None:
            raise ConfigError("run_dir is required (a jaxrl-train run folder)")
        out, meta = export_run(cfg)
    print(f"exported {meta.get('stage')} step {meta.get('stage_step')} -> {out.resolve()}")


def main() -> None:
    run_app("export", _main)


if __name__ == "__main__":
    main()
