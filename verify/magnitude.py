"""How large the terms behind each output element are: the float test's per-element yardstick.

The float test holds every element of a candidate to its own reference value, not to the largest
output (an error of 1 on an element of size 1 beside elements of size 1e5 is a wrong answer, not
a small one). Relative error alone cannot be the rule either: a sum that cancels (x @ w with
terms of both signs) is small while the rounding errors of its terms are not, and any correct
kernel carries them. So each element is measured against the magnitude M of the terms that
produced it, a first-order condition bound computed on the spec in float64, beside the value:

* an input or constant: M = |x| (0 for ±inf and NaN: they carry no rounding error);
* sums (add, sub, reductions, the matmul's inner sum) add magnitudes; products (mul, square,
  the matmul's terms) multiply them; a quotient a / b: M = M_a / |b| + |a| M_b / b²;
* a smooth function f(x): M = |f(x)| + |f'(x)| M_x (the function's own rounding, plus its
  operand's error carried through its slope); a piecewise-linear one with slope at most 1 (relu,
  abs, clamp, max, min, select) keeps its operand's M; a comparison or mask: M = |value|.
M >= |value| everywhere: an element whose terms do not cancel is held to plain relative error.

Beside M, the spec's explicit roundings (CAST ops: a cast to fp16 of an fp32 value) are carried
as a budget R: each cast adds its own worst rounding (half an ulp of the target dtype at the
value, or half its smallest subnormal), and R flows to the outputs through the same first-order
rules. A candidate may skip a rounding the program makes (a fused kernel keeps the fp32 row sum
the program stores in fp16); it is allowed R beyond its tolerance for that. The value itself is
computed with the casts honoured: the reference is the program at its explicit roundings.

Where a magnitude is not finite but the value is (0 · inf in a rule, an infinite slope at a
domain edge such as sqrt(0)), M falls back to |value|: those elements are held to relative error.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from mugraph.ir.dtypes import DType
from mugraph.ir.ops import PREDICATES, TOp

FIELDS = np.dtype([("v", np.float64), ("m", np.float64), ("r", np.float64)])
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def pack(v, m, r) -> np.ndarray:
    """One structured array of value, magnitude and rounding budget (broadcast together). A
    non-finite value is compared exactly, so its M and R are 0: they must not turn a finite
    neighbour's into 0 · inf (a matmul row reading one inf)."""
    v, m, r = np.broadcast_arrays(np.asarray(v, np.float64), np.asarray(m, np.float64),
                                  np.asarray(r, np.float64))
    finite = np.isfinite(v)
    out = np.empty(v.shape, FIELDS)
    out["v"], out["m"], out["r"] = v, np.where(finite, m, 0.0), np.where(finite, r, 0.0)
    return out


def parts(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(x)
    return x["v"], x["m"], x["r"]


def _finite_abs(v) -> np.ndarray:
    """A leaf's magnitude: |v|, and 0 for ±inf and NaN, which carry no rounding error (a masked
    -inf score must not make its row's max unbounded)."""
    return np.where(np.isfinite(v), np.abs(v), 0.0)


def _times(a, b) -> np.ndarray:
    """a · b with 0 · inf = 0: a zero slope carries no error, whatever the operand's."""
    with np.errstate(invalid="ignore"):
        return np.where((a == 0) | (b == 0), 0.0, a * b)


# ---- the slopes of the smooth functions ------------------------------------------------------------
def _sigmoid(x):
    return special.expit(x)


SLOPES = {
    TOp.EXP: np.exp,
    TOp.LOG: lambda x: 1.0 / x,
    TOp.SQRT: lambda x: 0.5 / np.sqrt(x),
    TOp.RSQRT: lambda x: 0.5 * np.abs(x) ** -1.5,
    TOp.SILU: lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))),
    TOp.GELU: lambda x: 0.5 * (1.0 + special.erf(x * _SQRT1_2)) + x * np.exp(-0.5 * x * x) * 0.5
    * _TWO_OVER_SQRT_PI * _SQRT1_2,
    TOp.SIGMOID: lambda x: _sigmoid(x) * (1.0 - _sigmoid(x)),
    TOp.TANH: lambda x: 1.0 - np.tanh(x) ** 2,
    TOp.ERF: lambda x: _TWO_OVER_SQRT_PI * np.exp(-x * x),
    TOp.LOG1P: lambda x: 1.0 / (1.0 + x),
    TOp.EXPM1: np.exp,
    TOp.SOFTPLUS: _sigmoid,
}
LIPSCHITZ_ONE = frozenset({TOp.NEG, TOp.ABS, TOp.RELU, TOp.CLAMP})   # slope at most 1


def rounding_error(v: np.ndarray, dtype: DType) -> np.ndarray:
    """The most a round-to-nearest to `dtype` moves v: half an ulp, or half the smallest
    subnormal below the normal range."""
    info = np.finfo(dtype.numpy)
    return np.abs(v) * float(info.eps) / 2 + float(info.smallest_subnormal) / 2


def rounded(v: np.ndarray, dtype: DType) -> np.ndarray:
    """v rounded to the precision of a 16-bit `dtype` (subnormals included), back in float64.

    Beyond the dtype's range the value is kept: range is what the own-precision run and
    jax.jit(fn) test (an fp16 row sum past 65504 is theirs to report, and a kernel that keeps it
    in fp32 is not wrong there), while an exact reference that overflowed at a cast would hold
    every candidate to the program's inf. A cast to fp32 is exact (see `_cast`)."""
    v = np.asarray(v, np.float64)
    if not dtype.is_16bit:
        return v
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = v.astype(dtype.numpy).astype(np.float64)
    return np.where(np.isinf(narrow) & np.isfinite(v), v, narrow)


# ---- the semantics ---------------------------------------------------------------------------------
class MagnitudeSemantics:
    """The interpreter's semantics for (value, M, R) triples, float64, casts honoured."""

    name = "magnitude"
    float64 = True

    def input(self, array, dtype: DType) -> np.ndarray:
        v = np.asarray(array, np.float64)
        return pack(v, _finite_abs(v), 0.0)

    def constant(self, value: float, shape, dtype: DType) -> np.ndarray:
        return pack(np.full(shape, value), _finite_abs(np.float64(value)), 0.0)

    def cast(self, x, dtype: DType) -> np.ndarray:
        return np.asarray(x)        # storage in float64: the explicit CAST op rounds

    def zeros(self, shape) -> np.ndarray:
        return pack(np.zeros(shape), 0.0, 0.0)

    def empty(self, shape, dtype: DType) -> np.ndarray:
        return self.zeros(shape)

    def max_identity(self, shape) -> np.ndarray:
        return pack(np.full(shape, -np.inf), 0.0, 0.0)

    def elementwise(self, op: TOp, args, arg, dtype: DType) -> np.ndarray:
        with np.errstate(all="ignore"):
            rule = _RULES.get(op)
            if rule is not None:
                return rule(arg, *map(parts, args))
            if op in SLOPES:
                return _smooth(op, *parts(args[0]))
            if op in LIPSCHITZ_ONE:
                return _lipschitz(op, arg, *parts(args[0]))
            if op in PREDICATES:
                return _predicate(op, args)
        raise NotImplementedError(f"no magnitude rule for {op}")   # tests walk every TOp

    def matmul(self, a, b, dtype: DType, operand_dtype=None) -> np.ndarray:
        (va, ma, ra), (vb, mb, rb) = parts(a), parts(b)
        with np.errstate(all="ignore"):
            budget = np.matmul(_finite_abs(va), rb) + np.matmul(ra, _finite_abs(vb)) \
                + np.matmul(ra, rb)
            return pack(np.matmul(va, vb), np.matmul(ma, mb), budget)

    def reduce_sum(self, x, dim: int, dtype: DType) -> np.ndarray:
        with np.errstate(all="ignore"):
            return pack(*(np.sum(p, axis=dim, keepdims=True) for p in parts(x)))

    def reduce_max(self, x, dim: int, dtype: DType) -> np.ndarray:
        v, m, r = parts(x)
        with np.errstate(all="ignore"):
            return pack(np.max(v, axis=dim, keepdims=True), np.max(m, axis=dim, keepdims=True),
                        np.max(r, axis=dim, keepdims=True))


def _smooth(op: TOp, v, m, r) -> np.ndarray:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    value = NUMPY_ELEMENTWISE[op](v, None)
    slope = np.abs(SLOPES[op](v))
    return pack(value, np.abs(value) + _times(slope, m), _times(slope, r))


def _lipschitz(op: TOp, arg, v, m, r) -> np.ndarray:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    return pack(NUMPY_ELEMENTWISE[op](v, arg), m, r)


def _predicate(op: TOp, args) -> np.ndarray:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    value = NUMPY_ELEMENTWISE[op](*(parts(a)[0] for a in args), None)
    return pack(value, np.abs(value), 0.0)


def _add(arg, a, b):
    return pack(a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _sub(arg, a, b):
    return pack(a[0] - b[0], a[1] + b[1], a[2] + b[2])


def _mul(arg, a, b):
    (va, ma, ra), (vb, mb, rb) = a, b
    budget = _times(np.abs(va), rb) + _times(ra, np.abs(vb)) + _times(ra, rb)
    return pack(va * vb, _times(ma, mb), budget)


def _div(arg, a, b):
    (va, ma, ra), (vb, mb, rb) = a, b
    inv = 1.0 / np.abs(vb)
    over = _times(np.abs(va), inv * inv)
    return pack(va / vb, _times(ma, inv) + _times(over, mb), _times(ra, inv) + _times(over, rb))


def _square(arg, x):
    return _mul(arg, x, x)


def _pow(arg, x, y):
    (vx, mx, rx), (vy, my, ry) = x, y
    value = np.power(vx, vy)
    dx = np.abs(vy * np.power(vx, vy - 1.0))
    dy = np.abs(value * np.log(np.abs(vx)))
    return pack(value, np.abs(value) + _times(dx, mx) + _times(dy, my),
                _times(dx, rx) + _times(dy, ry))


def _extreme(pick):
    def rule(arg, a, b):
        return pack(pick(a[0], b[0]), np.maximum(a[1], b[1]), np.maximum(a[2], b[2]))
    return rule


def _leaky_relu(arg, x, slope):
    (vx, mx, rx), (vs, ms, rs) = x, slope
    gain = np.maximum(1.0, np.abs(vs))
    value = np.where(vx >= 0, vx, vs * vx)
    return pack(value, _times(gain, mx) + _times(np.abs(vx), ms),
                _times(gain, rx) + _times(np.abs(vx), rs))


def _select(arg, c, a, b):
    take = c[0] != 0
    return pack(*(np.where(take, pa, pb) for pa, pb in zip(a, b)))


def _cast(dtype: DType, x):
    """The program's explicit rounding to a 16-bit dtype: the value rounded, its worst error
    added to R (none where the value is representable). A cast to fp32 moves nothing: fp32 is
    the widest dtype, so its operand holds fp16, bf16 or fp32 values already (here they are
    float64 values of 16-bit nodes, never rounded to their range: rounding them to fp32 would
    invent an overflow the program cannot have)."""
    v, m, r = x
    if not dtype.is_16bit:
        return pack(v, m, r)
    value = rounded(v, dtype)
    return pack(value, m, r + np.where(value == v, 0.0, rounding_error(v, dtype)))


_RULES = {
    TOp.ADD: _add, TOp.SUB: _sub, TOp.MUL: _mul, TOp.DIV: _div, TOp.SQUARE: _square,
    TOp.POW: _pow, TOp.MAX: _extreme(np.maximum), TOp.MIN: _extreme(np.minimum),
    TOp.LEAKY_RELU: _leaky_relu, TOp.SELECT: _select, TOp.CAST: _cast,
}
MAGNITUDE = MagnitudeSemantics()


def magnitude_floor(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """M where it is finite; |value| where the rules gave no finite magnitude."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(m), np.maximum(m, np.abs(v)), np.abs(v))
