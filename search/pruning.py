"""The search's view of abstract expressions: build them node by node and ask the pruning question.

Wraps `mugraph.verify.abstract`: every new tensor's expression must be a sub-expression of some
spec output (answers memoised per interned expression), and a candidate output must equal a
spec output's expression.
"""
from __future__ import annotations

from mugraph.verify import abstract
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract import normalize as N


class Pruner:
    def __init__(self, spec):
        exprs = abstract.expressions(spec)
        self.inputs = {n: exprs[n] for n in spec.inputs}
        self.outputs = [exprs[o] for o in spec.outputs]
        self._useful: dict = {}
        self._same: dict = {}
        self._vars: dict = {}
        self._sizes: dict = {}
        self._constant: dict = {}
        self.queries = 0

    def constant(self, value: float):
        return E.const(value)

    def kernel_expr(self, node, src_exprs):
        return abstract.node_expression(node, src_exprs)

    def block_expr(self, node, src_exprs, forloop: int):
        return abstract.node_expression(node, src_exprs, forloop=forloop)

    def variables(self, expr) -> frozenset:
        found = self._vars.get(expr)
        if found is None:
            found = self._vars[expr] = frozenset(E.variables(expr))
        return found

    def size(self, expr) -> int:
        """How much of a program an expression describes (its distinct subterms)."""
        found = self._sizes.get(expr)
        if found is None:
            found = self._sizes[expr] = len(E.subterms([expr]))
        return found

    def is_constant(self, expr) -> bool:
        """Whether an expression is a constant whatever the inputs (x - x, x / x): an op that
        builds one is wasted work, the constant is available as it is."""
        found = self._constant.get(expr)
        if found is None:
            form = N.normalize(expr)
            found = self._constant[expr] = form is not None and N.is_constant(form)
        return found

    def reject(self, expr):
        """Why a new tensor with this expression is cut (`Reject`), or None to keep it."""
        from mugraph.search.context import Reject
        if expr is None or not self.useful(expr):
            return Reject.EXPRESSION
        if self.is_constant(expr):
            return Reject.CONSTANT
        return None

    def useful(self, expr) -> bool:
        found = self._useful.get(expr)
        if found is None:
            self.queries += 1
            found = self._useful[expr] = abstract.is_subexpression(expr, self.outputs)
        return found

    def same(self, a, b) -> bool:
        if a is b:
            return True
        key = (a, b)
        found = self._same.get(key)
        if found is None:
            na, nb = N.normalize(a), N.normalize(b)
            found = self._same[key] = na is not None and na is nb
        return found
