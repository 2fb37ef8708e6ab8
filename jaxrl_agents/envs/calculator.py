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
  ``two-step``, and ``fault-hit`` when a fault was injected.
* Safety: the expression is evaluated by walking its AST (numbers, + - * / // % ** and unary
  signs only); powers and magnitudes are bounded so no call can hold the GIL for long. A
  non-finite number (``1e999``, ``1e999-1e999``) or an overflow is a tool error, never a value.

    from jaxrl_agents.envs.calculator import CalculatorEnv, oracle_policy
    task = CalculatorEnv.make_tasks("train", 1)[0];  policy = oracle_policy(task)
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_agents.envs.base import Env, EnvConfig, check_split, last_number, split_of
from jaxrl_agents.envs.tools import ToolError, tool
from jaxrl_agents.types import Ann, Message, Task, Verdict

Policy = Callable[[list[Message]], Message]

SYSTEM_PROMPT = "Use the calculator tool for arithmetic. Reply with only the final number."
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
_MAX_ABS = 1e15
_MAX_LEN = 200


# -- safe evaluation -----------------------------------------------------------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate(expression: str) -> tuple[int | float, list[int | float]]:
    """Evaluate arithmetic without ``eval``: returns (value, every intermediate value).

    Accepts ``×``/``x`` between numbers for ``*``, ``÷`` for ``/`` and ``^`` for ``**``.
    Raises :class:`ToolError` (shown to the model) for anything else.
    """
    if len(expression) > _MAX_LEN:
        raise ToolError(f"expression too long ({len(expression)} > {_MAX_LEN} chars)")
    text = re.sub(r"(?<=[\d)\s])[xX×](?=[\s\d(])", "*", expression.strip().rstrip("="))
    text = text.replace("÷", "/").replace("^", "**")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"invalid expression {expression!r}; use numbers and + - * / ( )") from None
    values: list[int | float] = []
    value = _finite(_eval(tree.body, values))  # every value is checked; this guards the contract
    return value, values


def _finite(v: int | float) -> int | float:
    """``v``, or a :class:`ToolError` when it is ``inf``/``nan``: never a successful result."""
    if isinstance(v, float) and not math.isfinite(v):
        what = "undefined (nan)" if math.isnan(v) else f"infinite ({v})"
        raise ToolError(f"result out of range: {what}; use finite numbers")
    return v


def _eval(node: ast.AST, values: list) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolError("number out of range (overflows to inf); use finite numbers")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand, values)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, values), _eval(node.right, values)
        if isinstance(node.op, ast.Pow):
            if abs(right) > 64 or (left and abs(right) * math.log10(abs(left)) > 15):
                raise ToolError("power too large")
        try:
            v = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result out of range (overflow)") from None
        if isinstance(v, complex):
            raise ToolError("result out of range")
        v = _finite(v)
        if abs(v) > _MAX_ABS:
            raise ToolError("result out of range")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        values.append(v)
        return v
    raise ToolError(f"unsupported expression element {type(node).__name__}; use + - * / ( )")


def format_number(v: int | float) -> str:
    return str(v) if isinstance(v, int) else format(round(v, 6), ".12g")


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
        config: EnvConfig | None = None,
        **env_kwargs: Any,
    ):
        super().__init__(config=config, **env_kwargs)
        if not 0.0 <= fault_rate < 1.0:
            raise ValueError(f"fault_rate must be in [0, 1), got {fault_rate}")
        if max_faults < 0:
            raise ValueError(f"max_faults must be >= 0, got {max_faults}")
        self.one_op_per_call = bool(one_op_per_call)
        self.fault_rate, self.max_faults = float(fault_rate), int(max_faults)
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
        return SYSTEM_PROMPT

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


# -- scripted policies ---------------------------------------------------------------------------


def _rand(rng: Any) -> float:
    return rng.random() if rng is not None else random.random()


def premature_guess(task: Task, u: float) -> int:
    """A plausible but wrong answer, as a model that skips the tool would give (``u`` in [0, 1))."""
    steps, answer = task.data["steps"], task.data["answer"]
    first = steps[0]["value"]
    a, b = (int(x) for x in re.findall(r"\d+", steps[0]["expression"])[:2])
    options = [answer + 10, answer - 10, a + b if first != a + b else a * b]
    if answer >= 100:
        options.append(int(str(answer)[:2]))  # the product's leading digits only
    if len(steps) > 1:
        options.append(first)  # forgot the second step
    options = [o for o in options if o != answer and o > 0] or [answer + 1]
    return options[int(u * len(options)) % len(options)]


def oracle_policy(
    task: Task,
    *,
    premature_prob: float = 0.0,
    premature_ops: str | None = None,
    premature_below: int | None = None,
    premature_words: Sequence[str] | None = None,
    rng: Any = None,
    combined: bool = False,
) -> Callable[[list[Message]], Message]:
    """Scripted solver: one calculator call per step, then the number alone.

    With probability ``premature_prob`` (drawn once per episode from ``rng``, a ``random.Random``
    or ``numpy.random.Generator``) it answers at once with :func:`premature_guess`; with
    ``premature_ops`` (e.g. ``"+"``), ``premature_below`` (e.g. 50: the first number is below it)
    and/or ``premature_words`` (e.g. ``["coins"]``: the question mentions one) only the matching
    problems are answered early — golden data whose author did those in their head, a habit a
    policy can learn (the demo's premature-completion failure). ``combined`` does all steps in
    one call (``37*12-5``). A call answered with an error (a transient fault) is made again.
    """
    first_expr = task.data["steps"][0]["expression"]
    first_number = int(re.match(r"\d+", first_expr).group())
    question = task.data["question"]
    applies = (
        (premature_ops is None or any(op in first_expr for op in premature_ops))
        and (premature_below is None or first_number < premature_below)
        and (premature_words is None or any(w in question.split() for w in premature_words))
    )
    premature = applies and premature_prob > 0 and _rand(rng) < premature_prob
    guess = premature_guess(task, _rand(rng)) if premature else None
    steps = task.data["steps"]
    plan = [task.data["expression"]] if combined else [s["expression"] for s in steps]

    def policy(messages: list[Message]) -> Message:
        if guess is not None:
            return {"role": "assistant", "content": str(guess)}
        # Successful results only: after an error (a transient fault) the same call is retried.
        results = [
            m["content"]
            for m in messages
            if m["role"] == "tool" and not str(m["content"]).startswith("Error")
        ]
        k = len(results)
        if k < len(plan):
            expr = plan[k]
            if k > 0 and not combined:
                # Chain the previous result as read from the tool, as a model would.
                prev = last_number(results[-1])
                if prev is not None:
                    prev_s = format_number(int(prev) if prev.is_integer() else prev)
                    expr = expr.replace(str(steps[k - 1]["value"]), prev_s, 1)
            call = {"name": "calculator", "arguments": {"expression": expr}}
            n = sum(m["role"] == "tool" for m in messages)
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"call_{n}", "type": "function", "function": call}],
            }
        return {"role": "assistant", "content": format_number(task.data["answer"])}

    return policy


def wrong_policy(task: Task) -> Callable[[list[Message]], Message]:
    """Always answers immediately with a plausible wrong number (fails every task)."""
    return oracle_policy(task, premature_prob=1.0, rng=random.Random(task.id))
