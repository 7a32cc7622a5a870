"""Thread units: the spec's elementwise cones, offered to the block enumerator as one op each.

For every elementwise node of the spec, its cone through elementwise ops (stopping at anything
else; scalar constants inlined) is a thread graph over the values it reads. The block
enumerator applies a unit to block values whose abstract expressions equal those values' (so
the unit's expression is the spec node's own, built by composing the ops' expressions), which
lets a 30-op chain or an activation polynomial be one step of the search instead of thirty.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from mugraph.ir import DType, KernelGraph, KNode
from mugraph.ir.ops import KOp, TOp
from mugraph.ir.thread import TNode, const, ops_of, param
from mugraph.verify import abstract
from mugraph.verify.abstract import normalize as N


@dataclass(frozen=True)
class Unit:
    """A thread graph over `len(leaves)` operands; `leaves[i]` is the expression param(i) stands for."""

    root: TNode
    leaves: tuple
    size: int          # elementwise ops in the graph
    inner: tuple = ()  # normal forms of the values it computes on the way to its root


def _scalar_constant(n: KNode) -> bool:
    return n.op is KOp.CONSTANT and all(d == 1 for d in n.shape)


def _widening(n: KNode) -> bool:
    """A cast to fp32: exact in a block, whose values are fp32 registers or 16-bit tiles read
    exactly (casts to 16-bit dtypes round, and stay in the unit)."""
    return n.op is TOp.CAST and n.dtype is DType.FLOAT32


def cone(node: KNode) -> tuple[TNode, tuple[KNode, ...]]:
    """The elementwise cone of `node` as a thread graph, and the spec values its params read
    (casts to fp32 left out: see `_widening`)."""
    leaves: list[KNode] = []
    made: dict = {}

    def build(n: KNode) -> TNode:
        if n not in made:
            if _widening(n):
                made[n] = build(n.srcs[0])
            elif isinstance(n.op, TOp):
                made[n] = TNode(n.op, tuple(build(s) for s in n.srcs), n.arg)
            elif _scalar_constant(n):
                made[n] = const(n.arg[0])
            else:
                leaves.append(n)
                made[n] = param(len(leaves) - 1)
        return made[n]

    return build(node), tuple(leaves)


def cone_nodes(node: KNode) -> list[KNode]:
    """The spec's elementwise nodes that `cone(node)` is made of."""
    out, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if n in seen or not isinstance(n.op, TOp):
            continue
        seen.add(n)
        out.append(n)
        stack.extend(n.srcs)
    return out


_UNITS: "weakref.WeakKeyDictionary[KernelGraph, tuple]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Regions:
    """The spec's elementwise nodes by role: `roots` end a region (read by a non-elementwise op,
    by more than one op, or an output); `operands` are inside a region and read by its root
    (a fused epilogue may combine them with other values, e.g. rsqrt(mean + eps) with x @ W);
    `internal` are the rest, values the program builds only to build a larger elementwise one."""

    roots: tuple
    operands: tuple
    internal: tuple


def regions(spec: KernelGraph) -> Regions:
    readers: dict = {}
    for n in spec.nodes:
        for s in set(n.srcs):
            readers.setdefault(s, []).append(n)
    outputs = set(spec.outputs)
    roots = [n for n in spec.nodes if isinstance(n.op, TOp) and (
        n in outputs or len(readers.get(n, ())) != 1 or not isinstance(readers[n][0].op, TOp))]
    root_set = set(roots)
    inside = [n for n in spec.nodes if isinstance(n.op, TOp) and n not in root_set]
    operands = [n for n in inside if readers[n][0] in root_set]
    return Regions(tuple(roots), tuple(operands), tuple(n for n in inside if n not in operands))


def units(spec: KernelGraph) -> tuple[Unit, ...]:
    """The distinct cones of two or more elementwise ops of `spec` that end at a region root or
    at an operand of one (values read twice are recomputed in registers rather than cut),
    largest first."""
    found = _UNITS.get(spec)
    if found is None:
        exprs = abstract.expressions(spec)
        seen, out = set(), []
        parts = regions(spec)
        for n in parts.roots + parts.operands:
            root, leaves = cone(n)
            inner = {N.normalize(exprs[m]) for m in cone_nodes(n) if m is not n} \
                - {N.normalize(exprs[leaf]) for leaf in leaves}     # x * 1 is x
            unit = Unit(root, tuple(exprs[leaf] for leaf in leaves), len(ops_of(root)),
                        tuple(inner))
            if unit.size >= 2 and (root, unit.leaves) not in seen:
                seen.add((root, unit.leaves))
                out.append(unit)
        found = _UNITS[spec] = tuple(sorted(out, key=lambda u: -u.size))
    return found
