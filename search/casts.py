"""Where the spec rounds: the enumerators offer a CAST only of a value the spec casts, to its dtype.

A cast's abstract expression is its operand's (real arithmetic has no rounding), so the expression
test cannot place casts; the spec's own casts say where the program rounds. The law this relies
on — rounding a value the program rounds, to the dtype it rounds it to, is the program's own
rounding — is the verifier's (`verify/abstract/casts.py`): the finite-field test keeps such a cast
exact and makes any other an uninterpreted function (by value), the formal check likewise (by
normal form), so a candidate whose cast is not the program's is rejected, not trusted. `spec_casts` lists them
as (normal form of the cast operand, target dtype) pairs: a kernel-level candidate may round the
same value the same way (an fp32 copy of fp16 values before a sum). Block values are fp32 registers
already, so a block cast matters where a 16-bit MMA reads it: `operand_casts` are the casts the
spec multiplies (a normalised Q rounded to fp16 before Q @ K: one fp16 MMA, as the program computes,
not three bf16 ones); other roundings inside a kernel only make it less precise than it may be.
"""
from __future__ import annotations

import weakref

from mugraph.ir import DType, KernelGraph
from mugraph.ir.ops import KERNEL_LAYOUT, KOp, TOp
from mugraph.verify import abstract
from mugraph.verify.abstract import normalize as N

_CASTS: "weakref.WeakKeyDictionary[KernelGraph, tuple]" = weakref.WeakKeyDictionary()


def spec_casts(spec: KernelGraph) -> frozenset:
    """{(normal form, dtype)}: the spec rounds a value of that form to that dtype."""
    return _casts(spec)[0]


def operand_casts(spec: KernelGraph) -> frozenset:
    """The `spec_casts` whose cast a matmul of the spec reads (through layout ops)."""
    return _casts(spec)[1]


def _casts(spec: KernelGraph) -> tuple:
    found = _CASTS.get(spec)
    if found is None:
        exprs = abstract.expressions(spec)
        every, operands = set(), set()
        multiplied = _matmul_operands(spec)
        for n in spec.nodes:
            form = N.normalize(exprs[n.srcs[0]]) if n.op is TOp.CAST else None
            if form is not None:
                every.add((form, n.arg))
                if n in multiplied:
                    operands.add((form, n.arg))
        found = _CASTS[spec] = (frozenset(every), frozenset(operands))
    return found


def _matmul_operands(spec: KernelGraph) -> set:
    """The nodes a matmul reads, and what layout ops it reads through."""
    found, stack = set(), [s for n in spec.nodes if n.op is KOp.MATMUL for s in n.srcs]
    while stack:
        n = stack.pop()
        if n not in found:
            found.add(n)
            stack.extend(n.srcs if n.op in KERNEL_LAYOUT else ())
    return found


def cast_targets(casts: frozenset, form, dtype: DType, *, narrow_only: bool = False) -> list:
    """The dtypes a value of `form` stored in `dtype` may be cast to (`narrow_only`: 16-bit
    ones, for block values: a cast to fp32 changes nothing in a block's fp32 registers)."""
    if form is None:
        return []
    return sorted((d for f, d in casts if f is form and d is not dtype
                   and (d.is_16bit or not narrow_only)), key=lambda d: d.value)
