"""``calculator``: arithmetic word problems solved with one ``calculator(expression)`` tool.

Sized for the CPU demo's tiny model (2-4 layers, ~1k BPE vocab, 256-384 token context): a handful
of fixed templates ("Tom has 37 boxes with 12 pens each. How many pens does Tom have?"), operands
2-99, one or two operations, a short system prompt and a one-parameter tool. The final answer is an
assistant message without tool calls; its last number is the answer ("439" or "The answer is 439.").

* Tasks: ``make_tasks(split, n, seed=, two_step_frac=)``; ``two_step_frac`` of them need two
  operations (e.g. ``37*12`` then ``444-5``), which the oracle solves with two calls. The split is
  a hash of the arithmetic (not the wording), so train and held-out never share a problem.
* Steps: each operation of the reference solution is a required step (``"37*12=444"``); it counts
  as done when any successful calculator call produced that value, also as an intermediate
  (``37*12-5`` does both steps in one call). The final answer before the last step is "premature".
* Options (``env.options``): ``one_op_per_call`` makes a call with more than one operation a
  tool error that asks for one operation at a time, so a two-step problem needs two calls, the
  second built on the first's result (chaining). ``fault_rate`` makes a call fail transiently
  with that probability (at most ``max_faults`` times an episode), with a message that invites
  a retry; the draws are a function of (task, episode seed, call index), so an episode replays.
  ``Verdict.info[Ann.SLICES]`` names the episode's slices for the reports: ``one-step`` or
  ``two-step``, and ``fault-hit`` when a fault was injected. ``state_rules`` adds the tool's
  contract to the system prompt (one operation per call, chain on the result; a failed call
  may be called again), whatever the options: a prompt that SFT episodes without faults share
  with RL's episodes that have them.
* Safety: the expression is evaluated by walking its AST
  (:mod:`jaxrl_agents.envs.calculator.arithmetic`).
"""

from __future__ import annotations

import random
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, last_number, split_of
from jaxrl_agents.envs.calculator.arithmetic import evaluate, format_number
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.types import Ann, Task, Verdict

SYSTEM_PROMPT = "Use the calculator tool for arithmetic. Reply with only the final number."
RULES = (
    " The calculator does one operation per call: for more, call it again on the last result."
    " A call can fail for a moment: then call it again."
)
_NAMES = ("Tom", "Ana", "Sam", "Mia", "Leo", "Zoe")
_ITEMS = ("pens", "apples", "cards", "coins", "books")
# (question template, operation per step); "r" is the previous step's result.
_ONE_STEP = (
    ("{n} has {a} boxes with {b} {i} each. How many {i} does {n} have?", ("{a}*{b}",)),
    ("{n} has {a} {i} and gets {b} more. How many {i} does {n} have?", ("{a}+{b}",)),
    ("{n} has {a} {i} and gives away {b}. How many {i} are left?", ("{a}-{b}",)),
)
_TWO_STEP = (
    (
        "{n} has {a} boxes with {b} {i} each. {n} gives away {c} {i}. How many {i} are left?",
        ("{a}*{b}", "{r}-{c}"),
    ),
    (
        "{n} has {a} boxes with {b} {i} each and gets {c} more {i}. How many {i} does {n} have?",
        ("{a}*{b}", "{r}+{c}"),
    ),
    (
        "{n} has {a} red and {b} blue boxes with {c} {i} in each box. How many {i} does {n} have?",
        ("{a}+{b}", "{r}*{c}"),
    ),
)
FAULT_MESSAGE = "the calculator is temporarily unavailable (transient fault); call it again"


# -- environment ---------------------------------------------------------------------------------


class CalculatorEnv(Env):
    """Arithmetic word problems; success iff the final answer equals the expected number."""

    name = "calculator"

    def __init__(
        self,
        *,
        one_op_per_call: bool = False,
        fault_rate: float = 0.0,
        max_faults: int = 1,
        state_rules: bool = False,
        config: EnvConfig | None = None,
        **env_kwargs: Any,
    ):
        super().__init__(config=config, **env_kwargs)
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be in [0, 1], got {fault_rate}")
        if max_faults < 0:
            raise ValueError(f"max_faults must be >= 0, got {max_faults}")
        self.one_op_per_call = bool(one_op_per_call)
        self.fault_rate, self.max_faults = float(fault_rate), int(max_faults)
        self.state_rules = bool(state_rules)
        self._values: list[int | float] = []  # every value any successful call produced
        self._results: list[int | float] = []  # final values of successful calls
        self._faults = 0  # transient faults injected this episode
        self._fault_rng = random.Random(0)

    @classmethod
    def make_tasks(
        cls,
        split: str,
        n: int,
        *,
        seed: int = 0,
        two_step_frac: float = 0.0,
        heldout_frac: float = 0.2,
    ) -> list[Task]:
        """``n`` problems of ``split``; deterministic in (split, n, seed, two_step_frac).

        ``two_step_frac``: fraction of two-operation problems (in [0, 1]).
        """
        check_split(split)
        if not 0.0 <= two_step_frac <= 1.0:
            raise ValueError(f"two_step_frac must be in [0, 1], got {two_step_frac}")
        rng = random.Random(f"calculator/{seed}/{split}")
        tasks: list[Task] = []
        seen: set[str] = set()
        attempts = 0
        while len(tasks) < n:
            attempts += 1
            two = rng.random() < two_step_frac
            question, ops = rng.choice(_TWO_STEP if two else _ONE_STEP)
            a, b, c = (rng.randint(2, 99) for _ in range(3))
            steps, r = [], None
            for op in ops:
                expr = op.format(a=a, b=b, c=c, r=r)
                r = evaluate(expr)[0]
                steps.append({"expression": expr, "value": r})
            if r <= 0 or any(s["value"] <= 0 for s in steps):
                continue  # "gives away" more than there is
            combined = ops[0].format(a=a, b=b) if not two else _combine(ops, a, b, c)
            if split_of(combined, heldout_frac=heldout_frac) != split:
                continue
            if combined in seen and attempts < 100 * n + 1000:
                continue  # repeats only once the split's problem space is exhausted
            seen.add(combined)
            text = question.format(n=rng.choice(_NAMES), i=rng.choice(_ITEMS), a=a, b=b, c=c)
            tasks.append(
                Task(
                    id=f"calculator-{split}-{seed}-{len(tasks):05d}",
                    env=cls.name,
                    split=split,
                    data={
                        "question": text,
                        "expression": combined,
                        "steps": steps,
                        "answer": r,
                        "required_steps": [f"{s['expression']}={s['value']}" for s in steps],
                    },
                )
            )
        return tasks

    def system_prompt(self, task: Task) -> str:
        return SYSTEM_PROMPT + RULES if self.state_rules else SYSTEM_PROMPT

    def setup(self, task: Task, seed: int) -> None:
        self._values, self._results = [], []
        self._faults = 0
        self._fault_rng = random.Random(f"calculator-faults/{task.id}/{seed}")

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: e.g. 37*12-5
        """
        if (
            self.fault_rate > 0
            and self._faults < self.max_faults
            and self._fault_rng.random() < self.fault_rate
        ):
            self._faults += 1
            raise ToolError(FAULT_MESSAGE)
        value, values = evaluate(expression)
        if self.one_op_per_call and len(values) > 1:
            raise ToolError(
                f"{expression!r} has {len(values)} operations; this calculator does one "
                "operation per call: call it with the first one, then use its result"
            )
        self._values.extend(values or [value])
        self._results.append(value)
        return format_number(value)

    def completed_steps(self) -> set[str]:
        steps = self.task.data["steps"] if self.task else []
        return {
            f"{s['expression']}={s['value']}"
            for s in steps
            if any(_close(v, s["value"]) for v in self._values)
        }

    def judge(self, answer: str | None) -> Verdict:
        expected = self.task.data["answer"]
        got = last_number(answer)
        correct = got is not None and _close(got, expected)
        slices = ["two-step" if len(self.task.data["steps"]) > 1 else "one-step"]
        if self._faults:
            slices.append("fault-hit")
        return Verdict(
            success=correct,
            score=float(correct),
            info={
                Ann.SLICES: slices,
                "faults": self._faults,
                Ann.EXPECTED: expected,
                Ann.ANSWER: got,
                Ann.EVIDENCE_IN_ANSWER: got is not None
                and any(_close(got, v) for v in self._results),
                "answer_text": answer,
            },
        )


def _combine(ops: tuple[str, ...], a: int, b: int, c: int) -> str:
    first = ops[0].format(a=a, b=b)
    second = ops[1].format(r="R", c=c)
    # "+" binds looser than "*": parenthesise the first step when the second multiplies.
    return second.replace("R", f"({first})" if "*" in ops[1] and "+" in first else first)


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-6 * max(1.0, abs(y))
