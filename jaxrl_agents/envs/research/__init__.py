"""``research``: multi-hop questions over a generated corpus with ``search`` and ``open`` tools.

The package: the BM25 index (``index``), the generated corpus and its questions (``corpus``), the
env (``env``) and its scripted policies (``scripted``), registered here.
"""

from __future__ import annotations

from jaxrl_agents.envs.registry import register_scripted
from jaxrl_agents.envs.research.corpus import NAMES, QUESTION_KINDS, build_corpus
from jaxrl_agents.envs.research.env import ResearchEnv
from jaxrl_agents.envs.research.index import BM25Index, tokenize
from jaxrl_agents.envs.research.scripted import oracle_policy, wrong_policy

# The class's public path, as before the package: EnvBinding.label and the reports name it.
ResearchEnv.__module__ = __name__
register_scripted(ResearchEnv, "oracle", oracle_policy)
register_scripted(ResearchEnv, "wrong", wrong_policy)

__all__ = [
    "NAMES",
    "QUESTION_KINDS",
    "BM25Index",
    "ResearchEnv",
    "build_corpus",
    "oracle_policy",
    "tokenize",
    "wrong_policy",
]
