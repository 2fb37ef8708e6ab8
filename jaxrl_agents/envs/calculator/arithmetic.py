"""Safe arithmetic for the ``calculator`` tool: an expression evaluated by walking its AST.

Numbers, + - * / // % ** and unary signs only; powers and magnitudes are bounded so no call can
hold the GIL for long. A non-finite number (``1e999``, ``1e999-1e999``) or an overflow is a tool
error, never a value.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from jaxrl_agents.envs.tools import ToolError

_MAX_ABS = 1e15
_MAX_LEN = 200

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
