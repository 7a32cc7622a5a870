"""Abstract expressions: the algebraic skeleton of tensor programs, for pruning and formal checks.

`expressions(graph)` lowers every tensor of a kernel graph (custom ops through their tiling) to an
interned `Expr`; `is_subexpression` is the search's pruning question (fast normaliser, optional
Z3 fallback) and `prove_equivalent` the formal check of a winner (normaliser, then Z3).
"""
from mugraph.verify.abstract.expr import Expr, Fn, Op
from mugraph.verify.abstract.lower import block_expressions, expressions, node_expression
from mugraph.verify.abstract.query import (STATS, ProofResult, clear_caches, is_subexpression,
                                           prove_equivalent)

__all__ = ["Expr", "Fn", "Op", "ProofResult", "STATS", "block_expressions", "clear_caches",
           "expressions", "is_subexpression", "node_expression", "prove_equivalent"]
