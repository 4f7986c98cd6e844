"""`calc`, the calculator tool of the tiny tool task (`--tools paddle_alignment.agents.calculator:calc`), and a
ready tool for any arithmetic task.

The expression is parsed, never handed to `eval`: a policy writes whatever it samples.
"""

import ast
import operator

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_EXPRESSION_CHARS = 200


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of integers.

    Args:
        expression: integers joined by + - * with parentheses, e.g. "12*(3+4)".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {expression!r}: use integers, + - * and parentheses") from None
    return str(evaluate(tree.body))


def evaluate(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    raise ValueError(f"{ast.unparse(node)!r} is not allowed: use integers, + - * and parentheses")
