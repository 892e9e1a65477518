"""Integer index formulas written once, evaluated in Python and emitted as CUDA C.

Sync policies and tile orders are defined as small formulas over named integers
(tile indices, tile sizes, tile counts). The model checker evaluates them in
Python; the kernel templates receive the same formulas translated to C. Only a
tiny, side-effect-free subset of Python is accepted, so the two readings cannot
disagree: non-negative integers, ``+ - * // %``, comparisons, ``and``/``or``/``not``,
``min``/``max`` and a conditional expression.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FUNCS = {"min", "max"}


class ExprError(ValueError):
    """A formula uses something outside the accepted subset."""


def _check(node: ast.AST, text: str) -> None:
    for sub in ast.walk(node):
        ok = isinstance(sub, (ast.Expression, ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp,
                              ast.Name, ast.Load, ast.Constant, ast.Call, ast.IfExp, ast.And, ast.Or,
                              ast.Not, ast.USub)) or type(sub) in _BINOPS or type(sub) in _CMPOPS
        if not ok:
            raise ExprError(f"{text!r}: {type(sub).__name__} is not allowed in an index formula")
        if isinstance(sub, ast.Constant) and not (isinstance(sub.value, int) and not isinstance(sub.value, bool)):
            raise ExprError(f"{text!r}: only integer constants are allowed")
        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name) and sub.func.id in _FUNCS
                                              and len(sub.args) == 2 and not sub.keywords):
            raise ExprError(f"{text!r}: only min(a, b) and max(a, b) may be called")


def _to_c(node: ast.AST) -> str:
    if isinstance(node, ast.Expression):
        return _to_c(node.body)
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        return f"({_to_c(node.left)} {_BINOPS[type(node.op)]} {_to_c(node.right)})"
    if isinstance(node, ast.UnaryOp):
        return f"(!{_to_c(node.operand)})" if isinstance(node.op, ast.Not) else f"(-{_to_c(node.operand)})"
    if isinstance(node, ast.BoolOp):
        op = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + op.join(_to_c(v) for v in node.values) + ")"
    if isinstance(node, ast.Compare):
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            parts.append(f"({_to_c(left)} {_CMPOPS[type(op)]} {_to_c(right)})")
            left = right
        return "(" + " && ".join(parts) + ")"
    if isinstance(node, ast.Call):
        a, b = (_to_c(x) for x in node.args)
        return f"{node.func.id}({a}, {b})"
    if isinstance(node, ast.IfExp):
        return f"({_to_c(node.test)} ? {_to_c(node.body)} : {_to_c(node.orelse)})"
    raise ExprError(f"cannot translate {ast.dump(node)}")  # unreachable after _check


@dataclass(frozen=True)
class Expr:
    """One integer formula; ``expr(env)`` evaluates it, ``expr.c`` is its C text."""

    text: str

    @cached_property
    def _tree(self) -> ast.Expression:
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"{self.text!r}: {exc.msg}") from None
        _check(tree, self.text)
        return tree

    @cached_property
    def _code(self):
        return compile(self._tree, f"<formula {self.text}>", "eval")

    @cached_property
    def names(self) -> frozenset[str]:
        """Variables the formula reads."""
        return frozenset(n.id for n in ast.walk(self._tree) if isinstance(n, ast.Name)) - _FUNCS

    @property
    def c(self) -> str:
        """The formula as a C expression (all operands are non-negative, so // is C's /)."""
        return _to_c(self._tree)

    def substitute(self, names: Mapping[str, "Expr"]) -> "Expr":
        """This formula with each variable of ``names`` replaced by its formula (as a whole)."""
        if not self.names & names.keys():
            return self

        class _Sub(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                return names[node.id]._tree.body if node.id in names else node

        tree = ast.fix_missing_locations(_Sub().visit(ast.parse(self.text, mode="eval")))
        return Expr(ast.unparse(tree))

    def values(self, env: Mapping[str, Any]) -> Any:
        """The formula over integers or integer arrays alike (``min`` and ``max`` take integers)."""
        missing = self.names - env.keys()
        if missing:
            raise ExprError(f"{self.text!r}: no value for {', '.join(sorted(missing))}")
        return eval(self._code, {"__builtins__": {}, "min": min, "max": max}, dict(env))

    def __call__(self, env: Mapping[str, int]) -> int:
        return int(self.values(env))
