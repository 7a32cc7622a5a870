"""Kernel-level ops that run through an array library instead of a generated kernel: one entry per op.

Each entry ``LIBRARY_OPS[op](xp, node, srcs, out)`` computes ``node`` from its operand arrays and writes the
result into ``out``, with the reference interpreter's own-dtype meaning (``ir.interpret(..., dtype="own")``):
operands widened to fp32, fp32 arithmetic and fp32 matmul accumulation, one rounding to ``node.dtype``. ``xp``
is CuPy on a GPU (matmul goes to cuBLAS) and NumPy in tests, so the table is checked against the interpreter on
machines without a GPU.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from mugraph.ir.errors import UnsupportedOp
from mugraph.ir.ops import KOp, TOp

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def special_functions(xp):
    """``scipy.special`` for NumPy, ``cupyx.scipy.special`` for CuPy (erf, expit); an array module
    may bring its own as ``xp.scipy_special`` (JAX's, in ``mugraph.jax_integration``)."""
    if hasattr(xp, "scipy_special"):
        return xp.scipy_special
    if xp is np:
        from scipy import special
    else:
        from cupyx.scipy import special
    return special


# (xp, special, x, arg) / (xp, special, x, y, arg) -> fp32 result; mirrors ir.semantics.NUMPY_ELEMENTWISE.
ELEMENTWISE: Mapping[TOp, Callable] = {
    TOp.EXP: lambda xp, sp, x, arg: xp.exp(x),
    TOp.LOG: lambda xp, sp, x, arg: xp.log(x),
    TOp.SQUARE: lambda xp, sp, x, arg: x * x,
    TOp.SQRT: lambda xp, sp, x, arg: xp.sqrt(x),
    TOp.RSQRT: lambda xp, sp, x, arg: 1.0 / xp.sqrt(x),
    TOp.SILU: lambda xp, sp, x, arg: x * sp.expit(x),
    TOp.GELU: lambda xp, sp, x, arg: 0.5 * x * (1.0 + sp.erf(x * _SQRT1_2)),
    TOp.RELU: lambda xp, sp, x, arg: xp.maximum(x, 0.0),
    TOp.SIGMOID: lambda xp, sp, x, arg: sp.expit(x),
    TOp.TANH: lambda xp, sp, x, arg: xp.tanh(x),
    TOp.ERF: lambda xp, sp, x, arg: sp.erf(x),
    TOp.NEG: lambda xp, sp, x, arg: -x,
    TOp.CLAMP: lambda xp, sp, x, arg: xp.clip(x, arg[0], arg[1]),
    TOp.ADD: lambda xp, sp, x, y, arg: x + y,
    TOp.SUB: lambda xp, sp, x, y, arg: x - y,
    TOp.MUL: lambda xp, sp, x, y, arg: x * y,
    TOp.DIV: lambda xp, sp, x, y, arg: x / y,
    TOp.POW: lambda xp, sp, x, y, arg: xp.power(x, y),
    TOp.MAX: lambda xp, sp, x, y, arg: xp.maximum(x, y),
    TOp.MIN: lambda xp, sp, x, y, arg: xp.minimum(x, y),
    TOp.ABS: lambda xp, sp, x, arg: xp.abs(x),
    TOp.LOG1P: lambda xp, sp, x, arg: xp.log1p(x),
    TOp.EXPM1: lambda xp, sp, x, arg: xp.expm1(x),
    TOp.SOFTPLUS: lambda xp, sp, x, arg: xp.logaddexp(x, xp.float32(0)),
    TOp.LEAKY_RELU: lambda xp, sp, x, s, arg: xp.where(x >= 0, x, s * x),
    TOp.GT: lambda xp, sp, x, y, arg: (x > y).astype(xp.float32),
    TOp.GE: lambda xp, sp, x, y, arg: (x >= y).astype(xp.float32),
    TOp.LT: lambda xp, sp, x, y, arg: (x < y).astype(xp.float32),
    TOp.LE: lambda xp, sp, x, y, arg: (x <= y).astype(xp.float32),
    TOp.EQ: lambda xp, sp, x, y, arg: (x == y).astype(xp.float32),
    TOp.NE: lambda xp, sp, x, y, arg: (x != y).astype(xp.float32),
    TOp.IS_FINITE: lambda xp, sp, x, arg: xp.isfinite(x).astype(xp.float32),
    TOp.SELECT: lambda xp, sp, c, a, b, arg: xp.where(c != 0, a, b),
    TOp.CAST: lambda xp, sp, x, arg: x,   # the store rounds to node.dtype, the cast's target
}


def _f32(xp, x):
    return x.astype(xp.float32, copy=False)


def _store(out, value) -> None:
    """One rounding from fp32 to the output's dtype (CuPy and NumPy both cast on assignment)."""
    out[...] = value


def _elementwise(xp, node, srcs, out) -> None:
    with np.errstate(all="ignore"):
        _store(out, ELEMENTWISE[node.op](xp, special_functions(xp), *(_f32(xp, s) for s in srcs), node.arg))


def _matmul(xp, node, srcs, out) -> None:
    a, b = srcs
    if xp is not np and a.dtype == b.dtype == out.dtype and a.dtype.itemsize == 2:
        # cuBLAS straight on the 16-bit operands: CuPy's default compute type for them is fp32
        # (CUBLAS_COMPUTE_32F), so this is fp32 accumulation with one rounding, without fp32 copies.
        xp.matmul(a, b, out=out)
        return
    _store(out, xp.matmul(_f32(xp, a), _f32(xp, b)))


def _reduce(reduce_name: str):
    def run(xp, node, srcs, out) -> None:
        _store(out, getattr(xp, reduce_name)(_f32(xp, srcs[0]), axis=node.arg, keepdims=True))
    return run


def _rms_norm(xp, node, srcs, out) -> None:
    dim, eps = node.arg
    x = _f32(xp, srcs[0])
    mean = xp.sum(x * x, axis=dim, keepdims=True) / np.float32(x.shape[dim])
    _store(out, x * (1.0 / xp.sqrt(mean + np.float32(eps))))


def _constant(xp, node, srcs, out) -> None:
    out.fill(np.float32(node.arg[0]))  # through fp32, as the interpreter rounds it


def _iota(xp, node, srcs, out) -> None:
    shape, dim, _ = node.arg
    index = xp.arange(shape[dim], dtype=xp.float32).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    _store(out, xp.broadcast_to(index, shape))


def _table(xp, node, srcs, out) -> None:
    values, shape, _ = node.arg
    _store(out, xp.asarray(values.array(shape).astype(np.float32)))


def _concat(xp, node, srcs, out) -> None:
    _store(out, xp.concatenate([_f32(xp, s) for s in srcs], axis=node.arg))


LIBRARY_OPS: Mapping = {
    KOp.CONSTANT: _constant,
    KOp.IOTA: _iota,
    KOp.TABLE: _table,
    KOp.MATMUL: _matmul,
    KOp.REDUCE_SUM: _reduce("sum"),
    KOp.REDUCE_MAX: _reduce("max"),
    KOp.RMS_NORM: _rms_norm,
    KOp.CONCAT: _concat,
    KOp.TRANSPOSE: lambda xp, node, srcs, out: _store(out, xp.transpose(srcs[0], node.arg)),
    KOp.RESHAPE: lambda xp, node, srcs, out: _store(out, srcs[0].reshape(node.arg)),
    KOp.BROADCAST: lambda xp, node, srcs, out: _store(out, xp.broadcast_to(srcs[0], node.arg)),
    KOp.SLICE: lambda xp, node, srcs, out: _store(out, srcs[0][tuple(slice(a, b) for a, b in zip(*node.arg))]),
} | {op: _elementwise for op in TOp}

# Ops that are never a library launch: inputs are bound, not computed; custom ops are generated kernels.
NOT_LIBRARY = frozenset({KOp.INPUT, KOp.CUSTOM})


def library_op(op) -> Callable:
    """The table entry for ``op``; UnsupportedOp names the op when there is none."""
    rule = LIBRARY_OPS.get(op)
    if rule is None:
        raise UnsupportedOp(f"no library implementation for kernel op {getattr(op, 'value', op)!r}",
                            primitive=str(getattr(op, "value", op)),
                            hint="library launches cover every kernel op but input and custom")
    return rule
