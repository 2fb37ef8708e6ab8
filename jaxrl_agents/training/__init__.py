"""Training: the jitted train step, SFT/RL objectives, the RL update program, orbax checkpoints.

The trainer receives device batches; it never reaches into environments. The jobs that drive it
(SFT then RL, with evaluation and export) are in ``jaxrl_agents.jobs``. Submodules import JAX
lazily from here.
"""

from typing import Any

_LAZY = {
    "make_train_step": "jaxrl_agents.training.step",
    "TrainState": "jaxrl_agents.training.step",
    "OptimizerConfig": "jaxrl_agents.training.step",
    "LossInputs": "jaxrl_agents.training.step",
    "make_rl_update": "jaxrl_agents.training.update",
    "RLMetrics": "jaxrl_agents.training.update",
    "Checkpointer": "jaxrl_agents.training.checkpoint",
}
__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxrl_agents.training' has no attribute {name!r}")
