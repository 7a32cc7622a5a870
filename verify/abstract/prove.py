"""The formal check: `prove_equivalent` proves, element by element, that two kernel graphs agree.

What is proved. For each output, symbolic index variables i_0.. range over its shape; both
graphs' element at (i_0, ..) is lowered to an `Expr` over input elements (`elements.py`: the
schedule of every custom op read literally: imap, fmap, omap, grid, loop, accumulators) and
put in canonical form (`reductions.py`); the two are then compared by the normaliser
(`normalize.py`) and, when both read the same input elements and reductions, by Z3
(`axioms.py`) with the index ranges as hypotheses, the tensors as uninterpreted functions of
integer indices and each canonical reduction an opaque value. "proved" means every output is proved for
every index in range; anything else is "not proved", with the reason.

Why each step is sound:
  * the lowering is the interpreter's definition (tested against it on every op's sample);
  * an index split v = k*q + r (when a tile division e // d needs it) is a bijection of ranges,
    so proving the element for every (q, r) proves it for every v;
  * every canonicalisation step of a reduction is an identity of real arithmetic over finite,
    non-empty ranges (listed in `reductions.py`, each tested numerically), and the normaliser's
    steps are identities of real arithmetic (its index-free sum laws are never used: element
    expressions hold no `Op.SUM`);
  * Z3 only uses the laws of `axioms.py` (each checked on random floats), congruence of the
    tensors and opaque functions, and the ranges of the output's index variables; a proof holds
    for every value of those and every value of the opaque reductions, so for the real ones.

What is modelled: real arithmetic, so "proved" says "proved in real arithmetic, where the
candidate rounds only where the program does". A CAST that is the program's own rounding (the
spec rounds a value of the same normal form to the same dtype, `casts.py`) is the identity, as
the spec's own casts are (a kernel may skip them); any other cast of the candidate is an
uninterpreted function. Not modelled: the rounding of ordinary ops and storage dtypes (an fp16
output equals its real value), IEEE special values (inf/NaN arithmetic, 0 * inf), and division by zero
or arguments outside a function's domain (x / x is not simplified anyway). Those are the float
test's job. An op without an index-level meaning makes the output "not proved"; an elementwise
op without an abstract-expression entry is an uninterpreted function (sound, never proved equal
to anything but itself). The lowering and canonicalisation are bounded by a wall-clock budget
and each Z3 query by a deterministic rlimit; running out of either is "not proved (timeout)".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from mugraph.ir.errors import InvalidInput
from mugraph.ir.graph import KernelGraph
from mugraph.ir.settings import settings
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.casts import new_roundings
from mugraph.verify.abstract.axioms import index_ranges, z3_equal
from mugraph.verify.abstract.elements import Elements, MAX_REFINES
from mugraph.verify.abstract.evaluate import at_random_point
from mugraph.verify.abstract.expr import Expr, Op
from mugraph.verify.abstract.indices import ZERO, Aff, IVar, Refine, Unproved, split
from mugraph.verify.abstract.reductions import free_vars

DEFAULT_SECONDS = 30.0     # wall-clock budget of one prove_equivalent call (lowering and Z3)


@dataclass(frozen=True)
class ProofResult:
    """The formal check of a candidate against its spec, output by output."""

    proved: bool
    method: str                  # "normaliser" (normal forms equal) or "z3" (Z3 was asked)
    outputs: tuple[bool, ...]
    seconds: float
    detail: str


@dataclass(frozen=True)
class Piece:
    """Both graphs' element at one symbolic index of an output (one case of its range)."""

    free: tuple              # the IVars the index ranges over
    index: tuple             # Affs, one per output dim
    spec: Expr
    candidate: Expr


def prove_equivalent(spec: KernelGraph, candidate: KernelGraph, *, rlimit: int | None = None,
                     seconds: float = DEFAULT_SECONDS) -> ProofResult:
    """Prove every candidate output equal to the spec's, element by element (see the module doc).

    rlimit: Z3's deterministic resource limit per query (default `settings.z3_rlimit`);
    seconds: the wall-clock budget of the whole call (running out is "not proved (timeout)").
    """
    _check_arguments(spec, candidate, rlimit, seconds)
    start = time.perf_counter()
    problem = _mismatch(spec, candidate)
    if problem:
        return ProofResult(False, "normaliser", (False,) * len(candidate.outputs),
                           time.perf_counter() - start, problem)
    lw = Elements(deadline=start + seconds, new_roundings=new_roundings(spec, candidate))
    results = [_prove_output(lw, s, c, rlimit or settings.z3_rlimit)
               for s, c in zip(spec.outputs, candidate.outputs)]
    proved = tuple(ok for ok, _, _ in results)
    method = "z3" if any(how == "z3" for _, how, _ in results) else "normaliser"
    detail = "; ".join(f"{name}: {'proved in real arithmetic' if ok else 'not proved'} ({why})"
                       for name, (ok, _, why) in zip(candidate.output_names, results))
    return ProofResult(all(proved), method, proved, time.perf_counter() - start, detail)


def _prove_output(lw: Elements, spec_node, cand_node, rlimit: int) -> tuple[bool, str, str]:
    """(proved, method, reason) for one output over its whole index range."""
    try:
        pieces = element_pieces(lw, spec_node, cand_node)
    except Unproved as e:
        return False, "normaliser", e.reason
    except RecursionError:
        return False, "normaliser", "the element expressions nest too deeply"
    how = "normaliser"
    for piece in pieces:
        ok, method, why = compare(piece, rlimit, lw.deadline)
        how = "z3" if method == "z3" else how
        if not ok:
            return False, how, why
    return True, how, f"{how}, {len(pieces)} case{'s' if len(pieces) > 1 else ''}"


def element_pieces(lw: Elements, spec_node, cand_node) -> list[Piece]:
    """Both elements at a symbolic index, the index refined (split, or case by case) wherever a
    tile division of either graph asks for it; the pieces together cover the whole range."""
    free = [IVar(f"i{d}", n) if n > 1 else None for d, n in enumerate(spec_node.shape)]
    work = [(tuple(v for v in free if v), tuple(Aff.of(v) if v else ZERO for v in free))]
    out: list[Piece] = []
    for _ in range(MAX_REFINES * 16):
        if not work:
            return out
        variables, index = work.pop()
        try:
            out.append(Piece(variables, index, lw.kernel(spec_node, index),
                             lw.kernel(cand_node, index)))
        except Refine as r:
            work.extend(_refined(variables, index, r))
    raise Unproved("too many index refinements")


def _refined(variables: tuple, index: tuple, r: Refine) -> list[tuple]:
    if r.var not in variables:
        raise Unproved(f"an index refinement of {r.var!r} that no binder owns")
    rest = tuple(v for v in variables if v != r.var)
    if r.factor is None:
        return [(rest, tuple(a.substitute({r.var: Aff.constant(c)}) for a in index))
                for c in range(r.var.size)]
    q, rr, aff = split(r.var, r.factor, names=(f"{r.var.name}.q", f"{r.var.name}.r"))
    return [(rest + (q, rr), tuple(a.substitute({r.var: aff}) for a in index))]


def compare(piece: Piece, rlimit: int, deadline: float = math.inf) -> tuple[bool, str, str]:
    """(equal, method, reason): normal forms first; Z3 when both sides read the same elements."""
    ns, nc = N.normalize(piece.spec), N.normalize(piece.candidate)
    if ns is not None and ns is nc:
        return True, "normaliser", "normaliser"
    if ns is not None and nc is not None and leaves(ns) != leaves(nc):
        return False, "normaliser", "the two sides read different elements or reductions"
    if ns is not None and nc is not None and _apart(N.render(ns), N.render(nc)):
        return False, "normaliser", "the normal forms differ as functions of their leaves"
    if time.perf_counter() > deadline:
        return False, "normaliser", "timeout"
    variables = free_vars(piece.spec) | free_vars(piece.candidate)
    if z3_equal(piece.spec, piece.candidate, rlimit, index_ranges(sorted(variables,
                                                                        key=lambda v: v.key))):
        return True, "z3", "z3"
    return False, "z3", f"normal forms differ; z3: no proof within rlimit {rlimit}"


def _apart(a: Expr, b: Expr) -> bool:
    """The two sides differ at a random point of their leaves, so no law can equate them
    (skipping Z3 there only saves time: "not proved" is always a sound answer)."""
    for seed in (1, 2):
        x, y = at_random_point(a, seed), at_random_point(b, seed)
        if math.isfinite(x) and math.isfinite(y) and abs(x - y) > 1e-9 * max(abs(x), abs(y), 1.0):
            return True
    return False


def leaves(p: N.Poly) -> frozenset:
    """The input elements and reductions inside a normal form."""
    return frozenset(a for q in N.nested_polys(p) for t in q.terms for a in t.num + t.den
                     if a.kind in (Op.ACCESS, Op.REDUCE))


def _check_arguments(spec, candidate, rlimit, seconds) -> None:
    for what, g in (("spec", spec), ("candidate", candidate)):
        if not isinstance(g, KernelGraph):
            raise InvalidInput(f"prove_equivalent: the {what} is a {type(g).__name__}, not a "
                               "KernelGraph", hint="pass kernel graphs (ir.KernelGraph, "
                                                   "Workload.spec(), Workload.reference())")
    if rlimit is not None and (not isinstance(rlimit, int) or isinstance(rlimit, bool) or rlimit < 1):
        raise InvalidInput(f"prove_equivalent: rlimit={rlimit!r} is not a positive int",
                           hint="Z3's deterministic resource limit, e.g. 200000 (the default)")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise InvalidInput(f"prove_equivalent: seconds={seconds!r} is not a non-negative number",
                           hint="the wall-clock budget of the call, e.g. 30")


def _mismatch(spec: KernelGraph, candidate: KernelGraph) -> str:
    if len(spec.outputs) != len(candidate.outputs):
        return f"the spec has {len(spec.outputs)} outputs, the candidate {len(candidate.outputs)}"
    for i, (s, c) in enumerate(zip(spec.outputs, candidate.outputs)):
        if s.shape != c.shape:
            return f"output {i}: the spec's shape is {s.shape}, the candidate's {c.shape}"
    shapes = {n.arg[0]: n.shape for n in spec.inputs}
    for n in candidate.inputs:
        if n.arg[0] in shapes and shapes[n.arg[0]] != n.shape:
            return (f"input {n.arg[0]!r} is {list(shapes[n.arg[0]])} in the spec, "
                    f"{list(n.shape)} in the candidate")
    return ""
