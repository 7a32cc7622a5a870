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
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import KERNEL_EVAL, bind_inputs, run_block_graph
from mugraph.ir.ops import PREDICATES, KOp, TOp

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


class Triple:
    """A value (float64) with its magnitude M and rounding budget R, each an array of the same
    shape; M = None stands for |value| (a leaf: no copy of a large weight), R = None for 0 (no
    cast upstream: a matmul then needs no budget products). NumPy's layout functions (reshape,
    transpose, broadcast_to, concatenate, ...) and indexing apply to all three, so the
    interpreter runs on triples unchanged."""

    __slots__ = ("v", "m", "r")

    def __init__(self, v, m=None, r=None):
        self.v, self.m, self.r = v, m, r

    @property
    def shape(self) -> tuple:
        return self.v.shape

    @property
    def ndim(self) -> int:
        return self.v.ndim

    def magnitude(self) -> np.ndarray:
        return _finite_abs(self.v) if self.m is None else self.m

    def __getitem__(self, index) -> "Triple":
        return self._each(lambda a: a[index])

    def _each(self, fn) -> "Triple":
        return Triple(fn(self.v), None if self.m is None else fn(self.m),
                      None if self.r is None else fn(self.r))

    def __array_function__(self, func, types, args, kwargs):
        if func in (np.shape, np.ndim):
            return func(self.v)
        if func is np.concatenate:
            return _concatenate(args[0], *args[1:], **kwargs)
        if func in _LAYOUT:
            return args[0]._each(lambda a: func(a, *args[1:], **kwargs))
        return NotImplemented


_LAYOUT = frozenset({np.reshape, np.transpose, np.broadcast_to, np.ascontiguousarray})


def _concatenate(parts, *args, **kwargs) -> Triple:
    parts = [p if isinstance(p, Triple) else Triple(np.asarray(p, np.float64)) for p in parts]
    v = np.concatenate([p.v for p in parts], *args, **kwargs)
    m = None if all(p.m is None for p in parts) else \
        np.concatenate([p.magnitude() for p in parts], *args, **kwargs)
    r = None if all(p.r is None for p in parts) else \
        np.concatenate([_budget(p) for p in parts], *args, **kwargs)
    return Triple(v, m, r)


def _budget(x: Triple):
    return np.zeros(x.shape) if x.r is None else np.broadcast_to(x.r, x.shape)


def make(v, m, r) -> Triple:
    """A triple from computed parts. A non-finite value is compared exactly, so its M and R are
    0: they must not turn a finite neighbour's into 0 · inf (a matmul row reading one inf)."""
    finite = np.isfinite(v)
    clean = finite.all()
    m = m if clean else np.where(finite, m, 0.0)
    if r is not None and not clean:
        r = np.where(finite, r, 0.0)
    return Triple(v, m, r)


def _finite_abs(v) -> np.ndarray:
    """A leaf's magnitude: |v|, and 0 for ±inf and NaN, which carry no rounding error (a masked
    -inf score must not make its row's max unbounded)."""
    a = np.abs(v)
    if a.size == 0 or np.isfinite(np.max(a)):   # the common case: one pass, no mask
        return a
    return np.nan_to_num(a, copy=False, nan=0.0, posinf=0.0)


def _times(a, b) -> np.ndarray:
    """a · b with 0 · inf = 0: a zero slope carries no error, whatever the operand's (a NaN
    product can only be that here: magnitudes and slopes of NaN values are not used)."""
    with np.errstate(invalid="ignore", over="ignore"):
        product = np.multiply(a, b)
    if np.ndim(product) == 0:
        return 0.0 if np.isnan(product) else product
    return np.nan_to_num(product, copy=False, nan=0.0, posinf=np.inf, neginf=-np.inf)


def _sum_budgets(*terms):
    present = [t for t in terms if t is not None]
    return sum(present[1:], present[0]) if present else None


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
    """The interpreter's semantics for (value, M, R) `Triple`s, float64, casts honoured."""

    name = "magnitude"
    float64 = True

    def input(self, array, dtype: DType) -> Triple:
        return Triple(np.asarray(array, np.float64))

    def constant(self, value: float, shape, dtype: DType) -> Triple:
        return Triple(np.full(shape, value, np.float64))

    def table(self, arg) -> Triple:
        """A TABLE's stored values: exact constants, as `constant` is."""
        values, shape, _ = arg
        return Triple(np.asarray(values.array(shape), np.float64))

    def cast(self, x, dtype: DType):
        return x        # storage in float64: the explicit CAST op rounds

    def zeros(self, shape) -> Triple:
        return Triple(np.zeros(shape))

    def empty(self, shape, dtype: DType) -> Triple:
        return self.zeros(shape)

    def max_identity(self, shape) -> Triple:
        return Triple(np.full(shape, -np.inf))

    def elementwise(self, op: TOp, args, arg, dtype: DType) -> Triple:
        args = [a if isinstance(a, Triple) else Triple(np.asarray(a, np.float64)) for a in args]
        with np.errstate(all="ignore"):
            rule = _RULES.get(op)
            if rule is not None:
                return rule(arg, *args)
            if op in SLOPES:
                return _smooth(op, args[0])
            if op in LIPSCHITZ_ONE:
                return _lipschitz(op, arg, args[0])
            if op in PREDICATES:
                return _predicate(op, args)
        raise NotImplementedError(f"no magnitude rule for {op}")   # tests walk every TOp

    def matmul(self, a: Triple, b: Triple, dtype: DType, operand_dtype=None) -> Triple:
        # plain |x| (no finite mask): a non-finite term makes the value non-finite too, and
        # `make` zeroes M and R there
        with np.errstate(all="ignore"):
            abs_a, abs_b = np.abs(a.v), np.abs(b.v)
            ma = abs_a if a.m is None else a.m
            mb = abs_b if b.m is None else b.m
            if a.r is not None and b.r is None and b.m is None:   # M and R both read |B|:
                rows = ma.shape[-2]                                  # one pass over it
                stacked = np.concatenate([ma, np.broadcast_to(a.r, ma.shape)], axis=-2)
                both = np.matmul(stacked, abs_b)
                return make(np.matmul(a.v, b.v), both[..., :rows, :], both[..., rows:, :])
            r = None
            if a.r is not None or b.r is not None:
                r = _sum_budgets(None if b.r is None else np.matmul(abs_a, b.r),
                                 None if a.r is None else np.matmul(a.r, abs_b),
                                 None if a.r is None or b.r is None else np.matmul(a.r, b.r))
            return make(np.matmul(a.v, b.v), np.matmul(ma, mb), r)

    def reduce_sum(self, x: Triple, dim: int, dtype: DType) -> Triple:
        with np.errstate(all="ignore"):
            total = lambda a: np.sum(a, axis=dim, keepdims=True)
            return make(total(x.v), total(x.magnitude()), None if x.r is None else total(x.r))

    def reduce_max(self, x: Triple, dim: int, dtype: DType) -> Triple:
        with np.errstate(all="ignore"):
            top = lambda a: np.max(a, axis=dim, keepdims=True)
            return make(top(x.v), top(x.magnitude()), None if x.r is None else top(x.r))


def _scaled(slope, r):
    return None if r is None else _times(slope, r)


def _smooth(op: TOp, x: Triple) -> Triple:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    value = NUMPY_ELEMENTWISE[op](x.v, None)
    slope = np.abs(SLOPES[op](x.v))
    return make(value, np.abs(value) + _times(slope, x.magnitude()), _scaled(slope, x.r))


def _lipschitz(op: TOp, arg, x: Triple) -> Triple:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    return make(NUMPY_ELEMENTWISE[op](x.v, arg), x.magnitude(), x.r)


def _predicate(op: TOp, args) -> Triple:
    from mugraph.ir.semantics import NUMPY_ELEMENTWISE
    return Triple(NUMPY_ELEMENTWISE[op](*(a.v for a in args), None))


def _add(arg, a, b):
    return make(a.v + b.v, a.magnitude() + b.magnitude(), _sum_budgets(a.r, b.r))


def _sub(arg, a, b):
    return make(a.v - b.v, a.magnitude() + b.magnitude(), _sum_budgets(a.r, b.r))


def _mul(arg, a, b):
    r = None
    if a.r is not None or b.r is not None:
        r = _sum_budgets(_scaled(_finite_abs(a.v), b.r), _scaled(_finite_abs(b.v), a.r),
                         None if a.r is None or b.r is None else a.r * b.r)
    return make(a.v * b.v, _times(a.magnitude(), b.magnitude()), r)


def _div(arg, a, b):
    inv = 1.0 / np.abs(b.v)
    over = _times(_finite_abs(a.v), inv * inv)
    m = _times(a.magnitude(), inv) + _times(over, b.magnitude())
    return make(a.v / b.v, m, _sum_budgets(_scaled(inv, a.r), _scaled(over, b.r)))


def _square(arg, x):
    return _mul(arg, x, x)


def _pow(arg, x, y):
    value = np.power(x.v, y.v)
    dx = np.abs(y.v * np.power(x.v, y.v - 1.0))
    dy = np.abs(value * np.log(np.abs(x.v)))
    m = np.abs(value) + _times(dx, x.magnitude()) + _times(dy, y.magnitude())
    return make(value, m, _sum_budgets(_scaled(dx, x.r), _scaled(dy, y.r)))


def _extreme(pick):
    def rule(arg, a, b):
        r = None if a.r is None and b.r is None else np.maximum(_budget(a), _budget(b))
        return make(pick(a.v, b.v), np.maximum(a.magnitude(), b.magnitude()), r)
    return rule


def _leaky_relu(arg, x, slope):
    gain = np.maximum(1.0, np.abs(slope.v))
    value = np.where(x.v >= 0, x.v, slope.v * x.v)
    m = _times(gain, x.magnitude()) + _times(np.abs(x.v), slope.magnitude())
    return make(value, m, _sum_budgets(_scaled(gain, x.r), _scaled(np.abs(x.v), slope.r)))


def _select(arg, c, a, b):
    take = c.v != 0
    r = None if a.r is None and b.r is None else np.where(take, _budget(a), _budget(b))
    return make(np.where(take, a.v, b.v), np.where(take, a.magnitude(), b.magnitude()), r)


def _cast(dtype: DType, x):
    """The program's explicit rounding to a 16-bit dtype: the value rounded, its worst error
    added to R (none where the value is representable). A cast to fp32 moves nothing: fp32 is
    the widest dtype, so its operand holds fp16, bf16 or fp32 values already (here they are
    float64 values of 16-bit nodes, never rounded to their range: rounding them to fp32 would
    invent an overflow the program cannot have)."""
    if not dtype.is_16bit:
        return x
    value = rounded(x.v, dtype)
    error = np.where(value == x.v, 0.0, rounding_error(x.v, dtype))
    return make(value, np.maximum(x.magnitude(), _finite_abs(value)), _sum_budgets(x.r, error))


_RULES = {
    TOp.ADD: _add, TOp.SUB: _sub, TOp.MUL: _mul, TOp.DIV: _div, TOp.SQUARE: _square,
    TOp.POW: _pow, TOp.MAX: _extreme(np.maximum), TOp.MIN: _extreme(np.minimum),
    TOp.LEAKY_RELU: _leaky_relu, TOp.SELECT: _select, TOp.CAST: _cast,
}
MAGNITUDE = MagnitudeSemantics()


def run(graph: KernelGraph, arrays) -> list[Triple]:
    """`graph`'s outputs as triples: the interpreter's kernel loop on MAGNITUDE. Its layout rules
    end in np.ascontiguousarray, which NumPy does not dispatch to `__array_function__` (it wraps
    the triple in a one-element object array): each value is unwrapped here."""
    values = {n: MAGNITUDE.input(a, n.dtype) for n, a in zip(graph.inputs, bind_inputs(graph, arrays))}
    blocks: dict = {}
    for node in graph.nodes:
        if node in values:
            continue
        srcs = [values[s] for s in node.srcs]
        if node.op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if key not in blocks:
                blocks[key] = [_unwrap(o) for o in run_block_graph(MAGNITUDE, node.arg[0], srcs)]
            values[node] = blocks[key][node.arg[1]]
        else:
            values[node] = _unwrap(KERNEL_EVAL[node.op](MAGNITUDE, node, srcs))
    return [values[o] for o in graph.outputs]


def _unwrap(value) -> Triple:
    if isinstance(value, np.ndarray) and value.dtype == object and value.size == 1:
        value = value.reshape(-1)[0]
    return value if isinstance(value, Triple) else Triple(np.asarray(value, np.float64))


def magnitude_floor(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """M where it is finite; |value| where the rules gave no finite magnitude."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(m), np.maximum(m, np.abs(v)), np.abs(v))
