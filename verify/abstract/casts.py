"""Which roundings are the program's: the law that lets a candidate round where the spec does.

A CAST to a 16-bit dtype rounds. Real arithmetic (abstract expressions, the formal check) reads
the spec's casts as the identity: a kernel may skip a rounding the program makes (a fused kernel
keeps in fp32 the row sum the program stores in fp16) and is the more precise for it. A
candidate's cast is the identity too where it is *the program's rounding*:

    rounding-the-program-makes: cast(v, d) = v when the spec holds a value of v's normal form in
    the same 16-bit dtype d: it casts it to d, or stores it in a tensor of dtype d (an input, or
    any node: an fp16 node's value is rounded to fp16 by the program, cast or not).

Any other cast is a rounding the program does not make; the formal check reads it as an
uninterpreted function (so `cast(e·2^-18, f16)·2^18` is never proved equal to e), and the
finite-field test does the same by value (`field_semantics.Roundings`). A cast to fp32 never
rounds (fp32 is the widest dtype: its operand holds fp16, bf16 or fp32 values already). The
search offers casts only of this law's form (`search/casts.py`).
"""
from __future__ import annotations

import weakref

from mugraph.ir.graph import KernelGraph
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.ir.thread import evaluate
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.lower import block_expressions, expressions, node_expression

_FOUND: "weakref.WeakKeyDictionary[KernelGraph, tuple]" = weakref.WeakKeyDictionary()


def casts(graph: KernelGraph) -> tuple:
    """Every rounding CAST of `graph` (to a 16-bit dtype; kernel, block and thread level) with
    the normal form of its operand (None where it has none): ((node, form), ...)."""
    found = _FOUND.get(graph)
    if found is None:
        found = _FOUND[graph] = tuple(_walk(graph))
    return found


def _walk(graph: KernelGraph):
    exprs, seen = expressions(graph), set()
    for node in graph.nodes:
        if _rounds(node):
            yield node, N.normalize(exprs[node.srcs[0]])
        if node.op is KOp.CUSTOM and (node.arg[0], node.srcs) not in seen:
            seen.add((node.arg[0], node.srcs))
            yield from _block_casts(node.arg[0], [exprs[s] for s in node.srcs])


def _block_casts(block_graph, input_exprs):
    exprs = block_expressions(block_graph, input_exprs)
    for node in block_graph.nodes:
        if _rounds(node):
            yield node, N.normalize(exprs[node.srcs[0]])
        if node.op is BOp.THREAD:
            yield from _thread_casts(node, [exprs[s] for s in node.srcs], block_graph.forloop)


def _thread_casts(node, operand_exprs, forloop):
    found = []

    def apply(inner, values):
        if _rounds(inner):
            found.append((inner, N.normalize(values[0])))
        return node_expression(inner, values, forloop=forloop)

    evaluate(node, operand_exprs, apply)
    return found


def _rounds(node) -> bool:
    return node.op is TOp.CAST and node.arg.is_16bit


def program_roundings(spec: KernelGraph) -> frozenset:
    """{(normal form, dtype)}: the values the spec holds in a 16-bit dtype: its casts' operands,
    and every kernel tensor of that dtype (an input, or a value it stores rounded)."""
    made = {(form, node.arg) for node, form in casts(spec) if form is not None}
    exprs = expressions(spec)
    held = {(N.normalize(exprs[n]), n.dtype) for n in spec.nodes if n.dtype.is_16bit}
    return frozenset(made | held)


def new_roundings(spec: KernelGraph, candidate: KernelGraph) -> frozenset:
    """The candidate's casts that are not the program's roundings (see the module docstring)."""
    allowed = program_roundings(spec)
    return frozenset(node for node, form in casts(candidate)
                     if form is None or (form, node.arg) not in allowed)
