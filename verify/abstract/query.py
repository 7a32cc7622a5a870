"""The search's pruning question: is e a subexpression of the spec (index-free abstract expressions).

`is_subexpression(e, spec)` means: some term equal to e is a subexpression (Mirage's predicate,
decided under the non-erasing laws, see `axioms.axioms`) of a term equal to a subterm of a spec
output. (The formal check, `prove_equivalent`, is index-aware and lives in `prove.py`.) The fast
path decides it on normal forms: a per-spec index of every polynomial inside the
normal forms of the spec's subterms, so "is part of" is a few dictionary lookups and a "no" costs
about as much as a "yes" (~0.1 ms). Z3 (`axioms.py`) is the judge behind it: `is_subexpression(..., z3_fallback=True)` asks it,
within a deterministic `rlimit`, about the fast path's "no" answers. A Z3 "no" spends its whole
budget (0.05-0.4 s at the default 2e5, fresh context included, against ~0.1 ms for the fast
path), so the fallback is off by default: on 3000 random questions it turned 6 of 706 "no"
answers into "yes" (MUGRAPH_ABSTRACT_REPORT in the tests). Answers are memoised on interned
expressions.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

from mugraph.ir.graph import KernelGraph
from mugraph.ir.settings import settings
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.axioms import z3_subexpression
from mugraph.verify.abstract.expr import Expr, Op, subterms
from mugraph.verify.abstract.lower import expressions

STATS: Counter = Counter()     # memo hits, fast-path answers, Z3 calls: read by tests and benches
_MEMO: dict = {}
_INDEXES: dict = {}
_CACHE_SIZE = 1 << 18


def default_rlimit() -> int:
    return settings.z3_rlimit


def clear_caches() -> None:
    """Forget every memoised answer (pruning and the formal check's element expressions)."""
    from mugraph.verify.abstract import elements, reductions
    _MEMO.clear()
    _INDEXES.clear()
    STATS.clear()
    elements.clear_memo()
    reductions.clear_memo()


# ---- the per-spec index ----------------------------------------------------------------------------
class SpecIndex:
    """Every polynomial inside the spec (normal forms of all its raw subterms, and their insides),
    with their terms bucketed by factor, so a candidate is compared with few terms."""

    def __init__(self, roots):
        self.polys = {q for p in roots for q in N.nested_polys(p)}
        self.buckets: dict[tuple, list] = {}
        for q in self.polys:
            for t in q.terms:
                for key in _term_keys(t):
                    self.buckets.setdefault(key, []).append((t, q))

    def contains(self, c: N.Poly) -> bool:
        """`c` is part of some polynomial of the spec: equal to one, a factor of one of its terms
        (`normalize.term_part`), or a sub-sum up to a factor (`normalize.multiple_in`)."""
        return self.witness(c) is not None

    def witness(self, c: N.Poly) -> N.Poly | None:
        """The spec polynomial `c` is part of, or None."""
        if c in self.polys:
            return c
        t0 = c.terms[0]
        if len(c.terms) > 1:
            return next((q for t, q in self._bucket(_lookup_key(t0, False))
                         if N.multiple_in(c, t, q)), None)
        found = next((q for t, q in self._bucket(_lookup_key(t0, True)) if N.term_part(t0, t)), None)
        bare = N.bare_atom(c)
        if found is None and bare is not None and bare.kind is Op.MAXR:
            found = next((q for t, q in self._bucket(("maxr", bare.args)) if N.atom_part(bare, t)),
                         None)
        return found

    def _bucket(self, key) -> list:
        return self.buckets.get(key, ())


def _term_keys(t: N.Term) -> set:
    keys = {("all",)}
    keys.update(("n", a) for a in t.num)
    keys.update(("d", a) for a in t.den)
    keys.update(("maxr", a.args) for a in t.num if a.kind is Op.MAXR)
    if t.exp is not None:
        keys.add(("exp",))
    if t.den_exp is not None:
        keys.add(("dexp",))
    return keys


def _lookup_key(c: N.Term, whole_exp: bool) -> tuple:
    """The bucket a term containing `c` must be in (exps must be contained only when `whole_exp`)."""
    if c.num:
        return ("n", c.num[0])
    if c.den:
        return ("d", c.den[0])
    if whole_exp and c.exp is not None:
        return ("exp",)
    if whole_exp and c.den_exp is not None:
        return ("dexp",)
    return ("all",)


def spec_index(spec_outputs: Sequence[Expr], *, split_max: bool = False) -> SpecIndex:
    """The index of the spec's polynomials (with max sizes forgotten when `split_max`)."""
    key = (tuple(spec_outputs), split_max)
    found = _INDEXES.get(key)
    if found is None:
        if len(_INDEXES) > 64:
            _INDEXES.clear()
        roots = [p for p in (N.normalize(t) for t in subterms(key[0])) if p is not None]
        if split_max:
            roots = [N.forget_max_sizes(p) for p in roots]
        found = _INDEXES[key] = SpecIndex(roots)
    return found


# ---- is_subexpression -------------------------------------------------------------------------------
def is_subexpression(e: Expr, spec_outputs: Sequence[Expr], *, rlimit: int | None = None,
                     z3_fallback: bool = False, split_max: bool = True) -> bool:
    """Whether `e` is a subexpression of some spec output under the axioms (the search's pruning test).

    Constants always are (a constant leaf cannot lead the search astray). The normaliser answers
    first; with `split_max` a partial max may stand for the full one (`forget_max_sizes`: not a
    law, so split-KV online softmax stays reachable); with `z3_fallback` a "no" goes on to Z3
    with `rlimit` (default `settings.z3_rlimit`), which costs that whole budget.
    """
    key = (e, tuple(spec_outputs), z3_fallback, rlimit, split_max)
    found = _MEMO.get(key)
    if found is not None:
        STATS["memo_hits"] += 1
        return found
    STATS["queries"] += 1
    answer = _fast_subexpression(e, key[1], split_max)
    if not answer and z3_fallback:
        STATS["z3_calls"] += 1
        answer = z3_subexpression(e, _z3_targets(key[1]), rlimit or default_rlimit())
        STATS["z3_yes"] += answer
    if len(_MEMO) > _CACHE_SIZE:
        _MEMO.clear()
    _MEMO[key] = answer
    return answer


def _z3_targets(spec_outputs: tuple) -> list[Expr]:
    """The spec's outputs and their normal forms (equal, but cancellations are already done)."""
    forms = [N.normalize(o) for o in spec_outputs]
    return list(spec_outputs) + [N.render(p) for p in forms if p is not None]


def _part_of(c: N.Poly, index: SpecIndex) -> bool:
    return N.is_constant(c) or index.contains(c)


def _fast_subexpression(e: Expr, spec_outputs: tuple, split_max: bool) -> bool:
    c = N.normalize(e)
    if c is None:
        return False
    answer = _part_of(c, spec_index(spec_outputs))
    if not answer and split_max:
        answer = _part_of(N.forget_max_sizes(c), spec_index(spec_outputs, split_max=True))
        STATS["split_max_yes"] += answer
    STATS["fast_yes" if answer else "fast_no"] += 1
    return answer


# ---- the formal check ---------------------------------------------------------------------------------
def output_expressions(graph: KernelGraph) -> list[Expr]:
    exprs = expressions(graph)
    return [exprs[o] for o in graph.outputs]
