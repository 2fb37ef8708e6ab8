"""``calculator``: arithmetic word problems solved with one ``calculator(expression)`` tool.

The package: the safe expression evaluator (``arithmetic``), the env and its task generator
(``env``) and its scripted policies (``scripted``), registered here.

    from jaxrl_agents.envs.calculator import CalculatorEnv, oracle_policy
    task = CalculatorEnv.make_tasks("train", 1)[0];  policy = oracle_policy(task)
"""

from __future__ import annotations

from jaxrl_agents.envs.calculator.arithmetic import evaluate, format_number
from jaxrl_agents.envs.calculator.env import FAULT_MESSAGE, SYSTEM_PROMPT, CalculatorEnv
from jaxrl_agents.envs.calculator.scripted import (
    Policy,
    oracle_policy,
    premature_guess,
    wrong_policy,
)
from jaxrl_agents.envs.registry import register_scripted

# The class's public path, as before the package: EnvBinding.label and the reports name it.
CalculatorEnv.__module__ = __name__
register_scripted(CalculatorEnv, "oracle", oracle_policy)
register_scripted(CalculatorEnv, "wrong", wrong_policy)

__all__ = [
    "FAULT_MESSAGE",
    "SYSTEM_PROMPT",
    "CalculatorEnv",
    "Policy",
    "evaluate",
    "format_number",
    "oracle_policy",
    "premature_guess",
    "wrong_policy",
]
