"""jaxrl_agents: JAX-native multi-turn RL for tool-using LLM agents.

The model API is re-exported lazily so that ``import jaxrl_agents`` (e.g. for the host-side
``types``) does not pull in JAX and Flax.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": "jaxrl_agents.models.config",
    "Transformer": "jaxrl_agents.models.decoder",
    "load_pretrained": "jaxrl_agents.models.hf_io",
    "export_pretrained": "jaxrl_agents.models.hf_io",
}
__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from jaxrl_agents.models.config import ModelConfig as ModelConfig
    from jaxrl_agents.models.decoder import Transformer as Transformer
    from jaxrl_agents.models.hf_io import export_pretrained as export_pretrained
    from jaxrl_agents.models.hf_io import load_pretrained as load_pretrained


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxrl_agents' has no attribute {name!r}")
