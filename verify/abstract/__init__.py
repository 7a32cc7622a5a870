"""Abstract expressions: the algebraic skeleton of tensor programs, for pruning and formal checks.

`expressions(graph)` lowers every tensor of a kernel graph (custom ops through their tiling) to an
interned `Expr`; `is_subexpression` is the search's pruning question (fast normaliser, optional
Z3 fallback). `prove_equivalent` is the formal check of a winner: it is index-aware, lowering
each output element to an expression over input elements (`elements.py`, `reductions.py`) and
comparing them with the normaliser, then Z3 (`prove.py` states what is and is not modelled).
"""
from mugraph.verify.abstract.expr import Expr, Fn, Op
from mugraph.verify.abstract.lower import block_expressions, expressions, node_expression
from mugraph.verify.abstract.prove import ProofResult, prove_equivalent
from mugraph.verify.abstract.query import STATS, clear_caches, is_subexpression

__all__ = ["Expr", "Fn", "Op", "ProofResult", "STATS", "block_expressions", "clear_caches",
           "expressions", "is_subexpression", "node_expression", "prove_equivalent"]
