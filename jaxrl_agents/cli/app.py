"""The Hydra glue shared by the three entry points.

* :func:`register_schemas` stores each job's typed config (``jobs.config.JOB_CONFIGS``) as the
  structured config ``<job>_schema``; the primary YAML files list it first in their defaults, so
  every default lives in its dataclass and a typo'd key or a wrong-typed value fails while Hydra
  composes.
* :func:`run_app` runs a Hydra app and turns every user error into one line on stderr (exit 2):
  Hydra's composition errors (unknown key, wrong type, unknown group option, bad override syntax)
  and the jobs' :class:`~jaxrl_agents.jobs.config.ConfigError` alike. Set ``HYDRA_FULL_ERROR=1``
  for Hydra's own report with a traceback.
* :func:`compose` composes a config in-process (tests, scripts, notebooks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jaxrl_agents.cli import config_dir


def folder_name(text: str) -> str:
    """``text`` as a run folder's name: ``[`` / ``]`` become ``(`` / ``)`` (orbax's checkpoint
    store cannot restore from a path with brackets, and a sweep folder named after a list
    override, ``trainer.batching.seq_buckets=[256,512]``, would have them)."""
    return text.replace("[", "(").replace("]", ")")


def register_schemas() -> None:
    """The jobs' structured configs, and the ``folder_name`` resolver the sweep folder uses."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from jaxrl_agents.jobs.config import JOB_CONFIGS, schema

    if not OmegaConf.has_resolver("folder_name"):
        OmegaConf.register_new_resolver("folder_name", folder_name)
    store = ConfigStore.instance()
    for name, cls in JOB_CONFIGS.items():
        store.store(name=f"{name}_schema", node=schema(cls))


def compose(config_name: str = "config", overrides: Sequence[str] = ()) -> Any:
    """The composed OmegaConf tree of ``config_name`` with ``overrides`` (no Hydra run dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_schemas()
    with initialize_config_dir(config_dir(), version_base="1.3"):
        return hydra_compose(config_name, list(overrides))


def user_errors() -> tuple[type[Exception], ...]:
    """Errors a user causes with config or paths: reported in one line, no traceback."""
    from jaxrl_agents.jobs.config import ConfigError
    from jaxrl_agents.models import CheckpointError, ModelConfigError
    from jaxrl_agents.sharding import MeshError
    from jaxrl_agents.training.wandb_sink import WandbUnavailable

    return (
        ConfigError,
        MeshError,
        ModelConfigError,
        CheckpointError,
        FileNotFoundError,
        WandbUnavailable,
    )


@contextlib.contextmanager
def reported(extra: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Report user errors raised inside the block as ``config error: ...`` and exit 2."""
    from jaxrl_agents.jobs.config import JobAborted

    try:
        yield
    except JobAborted as e:
        print(f"error: {_first_line(str(e))}", file=sys.stderr)
        sys.exit(1)
    except user_errors() + extra as e:
        print(f"config error: {_first_line(str(e))}", file=sys.stderr)
        sys.exit(2)


def _first_line(text: str) -> str:
    return " ".join(text.strip().splitlines()[0].split()) if text.strip() else text


def describe(exc: BaseException) -> str | None:
    """One line for a Hydra / OmegaConf composition error (None: not a user error)."""
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    if isinstance(exc, MissingConfigException):
        opts = f"; available: {', '.join(exc.options)}" if exc.options else ""
        return f"{_first_line(str(exc))}{opts}"
    if isinstance(exc, OverrideParseException):
        return _first_line(str(exc)) + (f" ({_first_line(exc.message)})" if exc.message else "")
    cause = exc.__cause__ if isinstance(exc, HydraException) else exc
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        override = re.search(r"override '?([\w.\[\]]+)", str(exc))
        if override and not key.startswith(override.group(1)):
            key = f"{override.group(1)}: {key}"  # a key inside an overridden list or mapping
        msg = _first_line(getattr(cause, "msg", None) or str(cause))
        obj = getattr(cause, "object_type", None)
        hint = ""
        if "To append to your config use" in str(exc):
            hint = f"; to add a key to a mapping use +{key}=..."
        if isinstance(cause, ConfigKeyError | ConfigAttributeError):
            if dataclasses.is_dataclass(obj):
                valid = ", ".join(sorted(f.name for f in dataclasses.fields(obj)))
                return f"unknown config key '{key}'; valid keys: {valid}"
            return f"unknown config key '{key}' ({msg}){hint}"
        return f"config key '{key}': {msg}{'' if isinstance(cause, ValidationError) else hint}"
    if isinstance(exc, HydraException):
        return _first_line(str(exc))
    return None


def _absl_to_process_stderr() -> None:
    """absl creates its log handler on the ``sys.stderr`` of import time and, when Hydra resets
    logging at the start of a run (``dictConfig`` closes every handler), closes that stream if it
    is no longer ``sys.stderr``: a caller that swapped ``sys.stderr`` since (a notebook, a test's
    capture) would lose it. Point the handler at the process's own stderr, which absl never
    closes."""
    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


def run_app(config_name: str, job: Callable[[Any], None]) -> None:
    """Run ``job(composed_config)`` as a Hydra app with one-line user errors (see module)."""
    import hydra

    _absl_to_process_stderr()
    logging.getLogger("absl").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    register_schemas()
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises; we report (or re-raise if asked)
    try:
        hydra.main(config_path=config_dir(), config_name=config_name, version_base="1.3")(job)()
    except Exception as e:
        line = None if before == "1" else describe(e)
        if line is None:
            raise
        print(f"config error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:  # callers in the same process (and their subprocesses) see the variable as it was
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before
