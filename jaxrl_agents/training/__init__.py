"""Training: the jitted train step, SFT/RL objectives, orbax checkpoints and the whole job.

``run(cfg)`` runs (or resumes) SFT then RL for a typed :class:`RunConfig`; the Hydra entry point
``jaxrl-train`` only builds that config. Submodules import JAX lazily from here.
"""

from typing import Any

_LAZY = {
    "RunConfig": "jaxrl_agents.training.config",
    "run": "jaxrl_agents.training.run",
    "make_train_step": "jaxrl_agents.training.step",
    "TrainState": "jaxrl_agents.training.step",
    "OptimizerConfig": "jaxrl_agents.training.step",
    "Checkpointer": "jaxrl_agents.training.checkpoint",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxrl_agents.training' has no attribute {name!r}")
