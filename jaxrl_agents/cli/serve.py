"""``jaxrl-serve``: an OpenAI-compatible endpoint over a policy, for agents written against the
OpenAI chat API (``base_url`` pointed at it).

jaxrl-serve                                      # the demo's tiny model on 127.0.0.1:8000
jaxrl-serve model=smollm2 port=8001              # SmolLM2-135M-Instruct from its GGUF file
jaxrl-serve run=runs/demo/seed0@best             # a trained run's best checkpoint
jaxrl-serve host=0.0.0.0 api_key=$KEY            # beyond this machine: a key is required
"""

from __future__ import annotations

import logging

from jaxrl_agents.cli.app import reported, run_app


def _main(tree) -> None:
    from jaxrl_agents.jobs.config import ConfigError, ServeConfig, from_tree

    for name in ("absl", "jax", "orbax"):  # library INFO chatter, not the user's business
        logging.getLogger(name).setLevel(logging.WARNING)
    with reported(extra=(ValueError,)):
        cfg = from_tree(ServeConfig, tree)
        try:
            from jaxrl_agents.jobs.serve import run_serve
        except ImportError as e:  # the optional extra, named in one line
            raise ConfigError(
                f"jaxrl-serve needs the serve extra: pip install 'jaxrl-agents[serve]' ({e})"
            ) from e
        run_serve(cfg)


def main() -> None:
    run_app("serve", _main)


if __name__ == "__main__":
    main()
