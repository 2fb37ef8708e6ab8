"""The jobs' user-facing errors: each is reported as one line, without a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing configuration error (names the dotted key and what is valid)."""


class JobAborted(RuntimeError):
    """A run stopped on purpose (e.g. too many episodes ending in errors): one line, no trace."""
