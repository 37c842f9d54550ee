"""``CalculatorTool``: evaluates an arithmetic expression (the tool of the tool-use learning proof).

Only numbers, parentheses and ``+ - * / // % **`` are evaluated, by walking the parsed expression
(never ``eval``); exponents and results are bounded so a call cannot hang the worker. A malformed
expression raises ValueError, which the agent loop turns into an error message for the model and
counts as a failed tool call. Integers print without a decimal point (``347*82`` -> ``28454``).

The expression is the schema's first required parameter (``expression`` when the schema names none).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from hybridflow.tools.base_tool import BaseTool
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
                raise ValueError("result out of range")
            return value
        raise ValueError(f"unsupported element {type(node).__name__} in {expression!r}")

    return walk(tree.body)


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.10g}"


class CalculatorTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        required = self.tool_schema.function.parameters.required
        self.argument = required[0] if required else "expression"

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        if self.argument not in parameters:
            raise ValueError(f"missing argument {self.argument!r}")
        return ToolResponse(text=format_number(evaluate(str(parameters[self.argument])))), 0.0, {}
