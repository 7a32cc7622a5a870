"""Where the spec rounds: the enumerators offer a CAST only of a value the spec casts, to its dtype.

A cast's abstract expression is its operand's (real arithmetic has no rounding), so the expression
test cannot place casts; the spec's own casts say where the program rounds. `spec_casts` lists them
as (normal form of the cast operand, target dtype) pairs: a candidate may round the same value the
same way, e.g. a normalised tile to fp16 before a matmul (one fp16 MMA, as the program computes).
"""
from __future__ import annotations

import weakref

from mugraph.ir import DType, KernelGraph
from mugraph.ir.ops import TOp
from mugraph.verify import abstract
from mugraph.verify.abstract import normalize as N

_CASTS: "weakref.WeakKeyDictionary[KernelGraph, frozenset]" = weakref.WeakKeyDictionary()


def spec_casts(spec: KernelGraph) -> frozenset:
    """{(normal form, dtype)}: the spec rounds a value of that form to that dtype."""
    found = _CASTS.get(spec)
    if found is None:
        exprs = abstract.expressions(spec)
        forms = ((N.normalize(exprs[n.srcs[0]]), n.arg) for n in spec.nodes if n.op is TOp.CAST)
        found = _CASTS[spec] = frozenset(c for c in forms if c[0] is not None)
    return found


def cast_targets(casts: frozenset, form, dtype: DType, *, narrow_only: bool = False) -> list:
    """The dtypes a value of `form` stored in `dtype` may be cast to (`narrow_only`: 16-bit
    ones, for block values: a cast to fp32 changes nothing in a block's fp32 registers)."""
    if form is None:
        return []
    return sorted((d for f, d in casts if f is form and d is not dtype
                   and (d.is_16bit or not narrow_only)), key=lambda d: d.value)
