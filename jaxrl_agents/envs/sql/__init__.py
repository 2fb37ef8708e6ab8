"""``sql``: data questions over a real SQLite shop database, answered with read-only SQL.

The package: the generated database (``database``), the read-only connections its tools query
(``sandbox``), the question bank (``tasks``), the env (``env``) and its scripted policies
(``scripted``), registered here.
"""

from __future__ import annotations

from jaxrl_agents.envs.registry import register_scripted
from jaxrl_agents.envs.sql.database import (
    CATEGORIES,
    CITIES,
    MONTHS,
    SCHEMA_VERSION,
    cache_dir,
    database_path,
    file_sha256,
    generate_rows,
)
from jaxrl_agents.envs.sql.env import SqlEnv
from jaxrl_agents.envs.sql.sandbox import (
    MAX_LIKE_PATTERN,
    MAX_STRING_BYTES,
    PROGRESS_OPS,
    ReadOnlyConnections,
    connect_readonly,
)
from jaxrl_agents.envs.sql.scripted import oracle_policy, wrong_policy
from jaxrl_agents.envs.sql.tasks import DEFAULT_KINDS, QUESTION_KINDS, RANGE_QUESTIONS

# The class's public path, as before the package: EnvBinding.label and the reports name it.
SqlEnv.__module__ = __name__
register_scripted(SqlEnv, "oracle", oracle_policy)
register_scripted(SqlEnv, "wrong", wrong_policy)

__all__ = [
    "CATEGORIES",
    "CITIES",
    "DEFAULT_KINDS",
    "MAX_LIKE_PATTERN",
    "MAX_STRING_BYTES",
    "MONTHS",
    "PROGRESS_OPS",
    "QUESTION_KINDS",
    "RANGE_QUESTIONS",
    "SCHEMA_VERSION",
    "ReadOnlyConnections",
    "SqlEnv",
    "cache_dir",
    "connect_readonly",
    "database_path",
    "file_sha256",
    "generate_rows",
    "oracle_policy",
    "wrong_policy",
]
