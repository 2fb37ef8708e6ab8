"""Command-line entry points (``jaxrl-train``, ``jaxrl-eval``, ``jaxrl-export``).

The only layer that imports Hydra. This ``__init__`` imports nothing heavy (standard library only;
``jaxrl_agents`` itself lazily) so that finding the configs costs nothing.
"""

from pathlib import Path

__all__ = ["config_dir"]


def config_dir() -> str:
    """The folder holding Hydra's ``config.yaml`` and its config groups.

    An installed wheel ships the YAML files as ``jaxrl_agents/conf/``; a checkout (or an editable
    install) reads them from the top-level ``configs/`` folder next to the package.
    """
    import jaxrl_agents

    package = Path(jaxrl_agents.__file__).resolve().parent
    candidates = (package / "conf", package.parent / "configs")
    for folder in candidates:
        if (folder / "config.yaml").is_file():
            return str(folder)
    tried = " or ".join(str(folder) for folder in candidates)
    raise FileNotFoundError(
        f"jaxrl_agents configs not found: no config.yaml in {tried}. Install the package from a "
        "wheel (which ships them as jaxrl_agents/conf/) or run from a checkout with configs/."
    )
