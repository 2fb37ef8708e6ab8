"""``travel``: stateful trip booking under a budget and calendar constraints.

The package: the generated flight and hotel catalog (``catalog``), the env (``env``) and its
scripted policies (``scripted``), registered here.
"""

from __future__ import annotations

from jaxrl_agents.envs.registry import register_scripted
from jaxrl_agents.envs.travel.catalog import CITIES, LISTINGS, REQUIRED
from jaxrl_agents.envs.travel.env import TravelEnv
from jaxrl_agents.envs.travel.scripted import STYLES, oracle_policy, wrong_policy

# The class's public path, as before the package: EnvBinding.label and the reports name it.
TravelEnv.__module__ = __name__
register_scripted(TravelEnv, "oracle", oracle_policy)
register_scripted(TravelEnv, "wrong", wrong_policy)

__all__ = [
    "CITIES",
    "LISTINGS",
    "REQUIRED",
    "STYLES",
    "TravelEnv",
    "oracle_policy",
    "wrong_policy",
]
