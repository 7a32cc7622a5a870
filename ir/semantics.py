"""What ops compute: the NumPy reference table, and the small interface other semantics implement.

The interpreter is generic: it asks a *semantics* object for leaves, elementwise ops, matmul and
reductions, and builds everything else (rms_norm, accumulators, tiling) from those. The NumPy
reference semantics below computes in float64, or in each tensor's own dtype with fp32
arithmetic and fp32 matmul accumulation (as the generated kernels do). Verification plugs a
finite-field semantics into the same interpreter.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from mugraph.ir.dtypes import DType
from mugraph.ir.ops import TOp

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _mask(truth: np.ndarray, *operands) -> np.ndarray:
    """A predicate as the 0/1 float mask the IR computes with (in the operands' float type)."""
    return truth.astype(np.result_type(*operands, np.float32))

NUMPY_ELEMENTWISE = {
    TOp.EXP: lambda x, arg: np.exp(x),
    TOp.LOG: lambda x, arg: np.log(x),
    TOp.SQUARE: lambda x, arg: x * x,
    TOp.SQRT: lambda x, arg: np.sqrt(x),
    TOp.RSQRT: lambda x, arg: 1.0 / np.sqrt(x),
    TOp.SILU: lambda x, arg: x * special.expit(x),
    TOp.GELU: lambda x, arg: 0.5 * x * (1.0 + special.erf(x * _SQRT1_2)),
    TOp.RELU: lambda x, arg: np.maximum(x, 0.0),
    TOp.SIGMOID: lambda x, arg: special.expit(x),
    TOp.TANH: lambda x, arg: np.tanh(x),
    TOp.ERF: lambda x, arg: special.erf(x),
    TOp.NEG: lambda x, arg: -x,
    TOp.CLAMP: lambda x, arg: np.clip(x, arg[0], arg[1]),
    TOp.ADD: lambda x, y, arg: x + y,
    TOp.SUB: lambda x, y, arg: x - y,
    TOp.MUL: lambda x, y, arg: x * y,
    TOp.DIV: lambda x, y, arg: x / y,
    TOp.POW: lambda x, y, arg: np.power(x, y),
    TOp.MAX: lambda x, y, arg: np.maximum(x, y),
    TOp.MIN: lambda x, y, arg: np.minimum(x, y),
    TOp.ABS: lambda x, arg: np.abs(x),
    TOp.LOG1P: lambda x, arg: np.log1p(x),
    TOp.EXPM1: lambda x, arg: np.expm1(x),
    TOp.SOFTPLUS: lambda x, arg: np.logaddexp(x, 0.0),
    TOp.LEAKY_RELU: lambda x, slope, arg: np.where(x >= 0, x, slope * x),
    TOp.GT: lambda x, y, arg: _mask(np.greater(x, y), x, y),
    TOp.GE: lambda x, y, arg: _mask(np.greater_equal(x, y), x, y),
    TOp.LT: lambda x, y, arg: _mask(np.less(x, y), x, y),
    TOp.LE: lambda x, y, arg: _mask(np.less_equal(x, y), x, y),
    TOp.EQ: lambda x, y, arg: _mask(np.equal(x, y), x, y),
    TOp.NE: lambda x, y, arg: _mask(np.not_equal(x, y), x, y),
    TOp.IS_FINITE: lambda x, arg: _mask(np.isfinite(x), x),
    TOp.SELECT: lambda c, a, b, arg: np.where(c != 0, a, b),
    TOp.CAST: lambda x, arg: x,   # the rounding to `arg` is the store to the node's dtype
}


class NumpySemantics:
    """Real arithmetic on NumPy arrays: exact float64, or each tensor's dtype (`compute=None`)."""

    def __init__(self, float64: bool = True):
        self.float64 = float64
        self.name = "numpy-float64" if float64 else "numpy-own-dtype"

    # values are stored in float64, or in the node's storage dtype
    def _up(self, x: np.ndarray) -> np.ndarray:
        return x if self.float64 else np.asarray(x, np.float32)

    def cast(self, x, dtype: DType) -> np.ndarray:
        if self.float64:
            return np.asarray(x, np.float64)
        return np.asarray(x, np.float32).astype(dtype.numpy)

    def input(self, array, dtype: DType) -> np.ndarray:
        return self.cast(np.asarray(array, dtype.numpy), dtype)

    def constant(self, value: float, shape, dtype: DType) -> np.ndarray:
        return self.cast(np.full(shape, value, np.float64), dtype)

    def elementwise(self, op: TOp, args, arg, dtype: DType) -> np.ndarray:
        with np.errstate(all="ignore"):
            return self.cast(NUMPY_ELEMENTWISE[op](*map(self._up, args), arg), dtype)

    def matmul(self, a, b, dtype: DType, operand_dtype: DType | None = None) -> np.ndarray:
        if operand_dtype is not None and not self.float64:
            a, b = a.astype(operand_dtype.numpy), b.astype(operand_dtype.numpy)
        with np.errstate(all="ignore"):
            return self.cast(np.matmul(self._up(a), self._up(b)), dtype)

    def reduce_sum(self, x, dim: int, dtype: DType) -> np.ndarray:
        with np.errstate(all="ignore"):
            return self.cast(np.sum(self._up(x), axis=dim, keepdims=True), dtype)

    def reduce_max(self, x, dim: int, dtype: DType) -> np.ndarray:
        return self.cast(np.max(self._up(x), axis=dim, keepdims=True), dtype)

    def table(self, arg) -> np.ndarray:
        values, shape, dtype = arg
        return self.cast(values.array(shape), dtype)

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, np.float64 if self.float64 else np.float32)

    def max_identity(self, shape) -> np.ndarray:
        return np.full(shape, -np.inf, np.float64 if self.float64 else np.float32)

    def empty(self, shape, dtype: DType) -> np.ndarray:
        return np.zeros(shape, np.float64 if self.float64 else dtype.numpy)


FLOAT64 = NumpySemantics(float64=True)
OWN_DTYPE = NumpySemantics(float64=False)
