"""``jaxrl-export``: any checkpoint of a run -> a Hugging Face folder transformers loads.

jaxrl-export run_dir=runs/demo/seed0                 # newest checkpoint
jaxrl-export run_dir=runs/demo/seed0 which=best out=/tmp/best_hf
jaxrl-export run_dir=runs/demo/seed0 step=310
"""

from __future__ import annotations

import sys
from pathlib import Path

from jaxrl_agents.cli.train import CONFIG_DIR


def _main(cfg) -> None:
    import logging

    from jaxrl_agents.models import export_pretrained

    for name in ("absl", "jax", "orbax"):  # library INFO chatter, not the user's business
        logging.getLogger(name).setLevel(logging.WARNING)
    from jaxrl_agents.training.restore import load_policy

    if cfg.run_dir is None:
        print("config error: run_dir is required (a jaxrl-train run folder)", file=sys.stderr)
        sys.exit(2)
    model, tokenizer, meta = load_policy(cfg.run_dir, which=cfg.which, step=cfg.step)
    out = Path(cfg.out or Path(cfg.run_dir) / f"hf_export_{cfg.which}")
    export_pretrained(model, out, tokenizer=tokenizer, max_shard_size=cfg.max_shard_size)
    print(f"exported {meta.get('stage')} step {meta.get('stage_step')} -> {out.resolve()}")


def main() -> None:
    import hydra

    hydra.main(config_path=CONFIG_DIR, config_name="export", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
