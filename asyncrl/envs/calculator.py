"""A calculator over model text that never evaluates it as Python: the expression is parsed with ``ast`` and
only numbers, parentheses and ``+ - * / // % **`` are walked; anything else is rejected by name.

Key decision: sizes are bounded before computing (expression length, exponent, magnitude), so a hostile
``9**9**9`` is an error message, not a frozen worker.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10.0**100

Number = int | float

BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or cannot be computed within the bounds."""


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression (module docstring for what is allowed)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise CalculatorError(f"not an expression: {err.msg}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            return _bounded(BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed (only numbers and + - * / // % **)")


def _bounded(value: Number) -> Number:
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result too large or not real")
    return value


def format_number(value: Number) -> str:
    """Integers (and integral floats) without a decimal point, other floats rounded to 6 places."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.6g}"
