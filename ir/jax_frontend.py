"""The JAX front end: trace a function with `jax.make_jaxpr` and lift its jaxpr into a KernelGraph.

Each primitive is lifted by one small rule in `RULES` (primitive name -> function), in the style
of JAX's per-primitive rule tables. Primitives without a rule raise `UnsupportedOp` naming the
equation, the user's source line and a hint (`UNSUPPORTED_HINTS`).

Values. A jaxpr variable is lifted to either a `Const` (a uniform value: a literal, a closed-over
scalar or a uniform array) or a lazy `View`: an IR node plus, per IR dim, the jaxpr dim it holds.
Only non-unit IR dims carry a label; a jaxpr dim that no IR dim carries is unit or broadcast.
So JAX's dropped reduction dims, its `broadcast_in_dim`s, unit reshapes, squeezes and transposes
are relabelings that build no nodes: IR reductions keep their dim and IR binary ops broadcast
NumPy-style. Layout nodes (TRANSPOSE, RESHAPE, BROADCAST, SLICE) appear only where a concrete
layout is needed: graph outputs, matmul operands, concatenation, operands of elementwise ops whose
dims do not line up, and model code's layout work: reshapes that split or merge dims (head split
and merge), static slices (strides 1) and `jnp.split`, `jnp.repeat` (a broadcast merged into a
dim). Custom kernels read these as views (`ir.layout`) wherever the strides allow.

Model code. A dot_general with several contracting dims, or free dims on both sides next to
batch dims (Flax's LinearGeneral, einsums over heads), is one matmul of operands grouped to
[batch..., M, K] @ [batch..., K, N]; the operand order that transposes no computed tensor is
taken (probs @ V). A value of rank 5 with unit dims (a batch of 1 next to a repeated head dim)
fits by dropping them. 0-d inputs (a learned scalar) and outputs (a mean loss) are [1] tensors;
`ir.origin.traced_outputs` gives outputs their traced shapes back.

Constants. Work on values that depend on no input is computed by JAX as the front end goes
(`View.known`): index expressions stay IR (a causal mask is computed in the kernel), anything
else the IR has no op for or would compute from constants (cos and sin of RoPE angles, a
concatenation of constants, integer index arithmetic, a closed-over array where it meets a
tensor) is folded into a TABLE, as XLA folds it into a literal.

Dtypes. Every lifted tensor has the dtype jax.jit gives it: `convert_element_type` between
float types is a CAST (so `x.astype(f32) * x.astype(f32)` squares in fp32 as JAX does, and a
mean of fp16 values reduced in fp32 stays finite), kernel dtypes follow the operands (constants
take their partner's dtype, which JAX gives them too), a matmul whose `preferred_element_type`
is wider than its operands multiplies their casts, and `reduce_precision` to fp16's or bf16's
format is a round trip through that dtype.

Predicates and indices. A boolean jaxpr value is lifted to a 0/1 float mask (comparisons,
`is_finite`; `and` is a MUL, `or` a MAX, `not` 1 - c) and `select_n` to SELECT, so
`jnp.where(mask, s, -jnp.inf)` is one op with an inf constant. `iota` becomes a float32 IOTA
leaf, and integer index arithmetic on it (+, -, *, max, min, comparisons) is computed in float32,
which is exact while every value stays below 2^24 (checked per equation); other integer
arithmetic is refused. A mask cast to a float keeps the program's dtype where the values allow
(0/1, small indices in fp16). JAX's compositions are kept op for op, except a few that lift to
one IR op with the same values, NaN and inf included: `jax.nn.leaky_relu` and `where(x > 0, x,
a*x)` style selects (LEAKY_RELU), `logaddexp(x, 0)` (SOFTPLUS, e.g. `jax.nn.softplus`), x *
sigmoid(x) (SILU), and abs of a never-negative value (itself). `x * mask.astype(float)` is
SELECT(mask, x, 0), because XLA rewrites it so and jax.jit returns 0, not NaN, where x is NaN
or inf and the mask is false.
"""
from __future__ import annotations

import inspect
import math
import os
import re
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput, MugraphError, UnsupportedOp
from mugraph.ir.graph import KernelGraph
from mugraph.ir.layout import strided_view
from mugraph.ir.node import (KNode, concat, kernel_constant, kernel_input, kernel_iota,
                             kernel_table, toposort)
from mugraph.ir.ops import KERNEL_LAYOUT, KOp, PREDICATES, TOp, is_mask
from mugraph.ir.origin import record_jax_origin
from mugraph.ir.semantics import NUMPY_ELEMENTWISE
from mugraph.ir.shapes import EXACT_INTEGERS, MAX_RANK
from mugraph.ir.table_values import MAX_ELEMENTS as MAX_TABLE_ELEMENTS

_INPUT_DTYPES = ("float16", "bfloat16", "float32")


# ---- lifted values -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Const:
    """A jaxpr value that is one number everywhere (shape and dtype are the jaxpr's)."""

    value: float
    dtype: np.dtype
    shape: tuple


@dataclass(frozen=True)
class View:
    """A jaxpr value of `shape` held by `node`: IR dim i is jaxpr dim `labels[i]` (None: unit).
    `from_mask`: the value is a boolean converted to a float by the equation that made it.
    `known`: the value itself where it depends on no input (an index array, a mask, a RoPE
    angle), as jax computes it: what a fold into a TABLE takes."""

    node: KNode
    labels: tuple
    shape: tuple
    from_mask: bool = False
    known: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Opaque:
    """A constant array that is not uniform (closed over, or computed from constants by work
    with no IR op, like integer index arithmetic). `array` holds it where it is known: it then
    becomes a TABLE where it meets a tensor; without one it is an error there."""

    shape: tuple
    dtype: np.dtype
    array: np.ndarray | None = field(default=None, compare=False, repr=False)


class _Unsupported(Exception):
    """Raised by a rule; the driver turns it into UnsupportedOp with the equation and source."""

    def __init__(self, detail: str, hint: str | None = None):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


def _view(node: KNode, labels, shape) -> View:
    """A canonical view: IR dims of size 1 carry no label."""
    labels = tuple(None if size == 1 else label for size, label in zip(node.shape, labels))
    return View(node, labels, tuple(shape))


def _rounded(value, dtype) -> float:
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return float(np.asarray(value, np.float64).astype(dtype))
    return float(np.asarray(value).astype(dtype))


def _const_node(value: float, like: KNode) -> KNode:
    """A scalar CONSTANT in `like`'s frame and dtype (rank-matched shape of ones): a jaxpr
    binary op's operands share one dtype, and lifted values keep JAX's."""
    _check_constant(value)
    return kernel_constant(value, (1,) * like.rank, like.dtype)


def _check_constant(value: float) -> None:
    if math.isnan(value):
        raise _Unsupported("the constant nan is not a value mugraph computes with",
                           hint="IR constants are floats or +-inf; select a finite value or "
                                "-inf instead of nan")


def _full_constant(c: Const) -> View:
    """A Const as a concrete tensor (for matmul operands and outputs)."""
    if not c.shape or len(c.shape) > MAX_RANK:
        raise _Unsupported(f"a constant of shape {list(c.shape)} cannot be a kernel tensor",
                           hint=f"kernel tensors have 1 to {MAX_RANK} dims")
    _check_constant(c.value)
    node = kernel_constant(c.value, c.shape, _ir_dtype(c.dtype))
    return _view(node, range(len(c.shape)), c.shape)


def _ir_dtype(dtype) -> DType:
    name = np.dtype(dtype).name
    if name not in _INPUT_DTYPES:
        return DType.FLOAT32  # float64 intermediates (x64 mode) compute in fp32 or wider anyway
    return DType.parse(name)


def _as_view(value) -> View:
    return _full_constant(value) if isinstance(value, Const) else value


# ---- layouts: only where a concrete one is needed ------------------------------------------------
def _arrange(v: View, slots) -> KNode:
    """v's node with its dims in `slots` order (jaxpr dims; None = unit): a TRANSPOSE if non-unit
    dims must move, then a RESHAPE if unit dims must come or go."""
    slots = tuple(slots)
    if not 1 <= len(slots) <= MAX_RANK:
        raise _Unsupported(f"a rank-{len(slots)} tensor is needed here",
                           hint=f"kernel tensors have 1 to {MAX_RANK} dims; fold extra dims "
                                "outside the traced function")
    mapped = [i for i, label in enumerate(v.labels) if label is not None]
    if any(v.labels[i] not in slots for i in mapped):
        raise MugraphError(f"internal: view labels {v.labels} do not fit slots {slots}")
    if _index_leaves(v.node):
        return _relaid_index(v, slots)
    wanted = sorted(mapped, key=lambda i: slots.index(v.labels[i]))
    node = v.node
    if wanted != mapped:
        perm = list(range(node.rank))
        for pos, i in zip(mapped, wanted):
            perm[pos] = i
        node = node.transpose(tuple(perm))
    shape = tuple(v.shape[s] if s is not None and s in v.labels else 1 for s in slots)
    return _reshaped(node, shape)


def _index_leaves(node: KNode) -> bool:
    """Whether `node` is built from iotas and scalar constants by elementwise ops only."""
    if node.op is KOp.IOTA:
        return True
    if node.op is KOp.CONSTANT:
        return False  # a lone constant is no index expression (its leaves must hold an iota)
    return isinstance(node.op, TOp) and all(
        _index_leaves(s) or (s.op is KOp.CONSTANT and all(d == 1 for d in s.shape))
        for s in node.srcs) and any(_index_leaves(s) for s in node.srcs)


def _relaid_index(v: View, slots) -> KNode:
    """An index expression arranged in `slots` is the same expression over iotas laid out so,
    never a layout node: the IOTA leaves stay leaves the search and codegen can tile."""
    def rebuild(node: KNode) -> KNode:
        if node.op is KOp.CONSTANT:
            return kernel_constant(node.arg[0], (1,) * len(slots), node.arg[2])
        if node.op is KOp.IOTA:
            _, dim, dtype = node.arg
            label = v.labels[v.node.rank - node.rank + dim]
            shape = tuple(v.shape[s] if s is not None and s == label else 1 for s in slots)
            return kernel_iota(shape, slots.index(label) if label is not None else 0, dtype)
        return KNode(node.op, tuple(rebuild(s) for s in node.srcs), node.arg)
    return rebuild(v.node)


def _filled_index(node: KNode, shape) -> KNode:
    """An index expression broadcast to `shape`: its iotas take the shape."""
    if node.op is KOp.IOTA:
        return kernel_iota(shape, node.arg[1], node.arg[2])
    if node.op is KOp.CONSTANT:
        return node
    return KNode(node.op, tuple(_filled_index(s, shape) for s in node.srcs), node.arg)


def _fill(node: KNode, slots, full_shape, keep_unit=()) -> KNode:
    """Broadcast unit dims standing for larger jaxpr dims, except the dims in `keep_unit`."""
    shape = tuple(full_shape[s] if s is not None and s not in keep_unit and size == 1 else size
                  for s, size in zip(slots, node.shape))
    if shape == node.shape:
        return node
    return _filled_index(node, shape) if _index_leaves(node) else node.broadcast_to(shape)


def _materialize(v: View) -> KNode:
    """v as a tensor of exactly its jaxpr shape."""
    slots = range(len(v.shape))
    return _fill(_arrange(v, slots), slots, v.shape)


def _merge(a: tuple, b: tuple):
    """Labels of a NumPy broadcast of two frames (right-aligned), or None if they clash."""
    rank = max(len(a), len(b))
    a, b = (None,) * (rank - len(a)) + a, (None,) * (rank - len(b)) + b
    merged = tuple(x if x is not None else y for x, y in zip(a, b))
    if any(x is not None and y is not None and x != y for x, y in zip(a, b)):
        return None
    labels = [m for m in merged if m is not None]
    return merged if len(labels) == len(set(labels)) else None


def _align(*views: View):
    """IR nodes for `views` that broadcast against each other, and the labels of the result."""
    merged = ()
    for v in views:
        merged = _merge(merged, v.labels) if merged is not None else None
    if merged is not None:
        return [v.node for v in views], merged
    have = [{x for x in v.labels if x is not None} for v in views]
    union = set().union(*have)
    frame = next((v.labels for v, h in zip(views, have) if h == union), tuple(sorted(union)))
    return [_arrange(v, frame) for v in views], frame


# ---- elementwise rules ---------------------------------------------------------------------------
def _out(eqn, i: int = 0):
    aval = eqn.outvars[i].aval
    return tuple(aval.shape), np.dtype(aval.dtype)


def _fold(eqn, op: TOp, consts, arg=None) -> Const:
    shape, dtype = _out(eqn)
    with np.errstate(all="ignore"):
        value = NUMPY_ELEMENTWISE[op](*(np.float64(c.value) for c in consts), arg)
    return Const(_rounded(value, dtype), dtype, shape)


def _apply_unary(eqn, op: TOp, x, arg=None):
    if isinstance(x, Const):
        return _fold(eqn, op, [x], arg)
    return View(KNode(op, (x.node,), arg), x.labels, _out(eqn)[0])


def _apply_binary(eqn, op: TOp, a, b):
    shape = _out(eqn)[0]
    if isinstance(a, Const) and isinstance(b, Const):
        return _fold(eqn, op, [a, b])
    if isinstance(a, Const):
        return _view(KNode(op, (_const_node(a.value, b.node), b.node)), b.labels, shape)
    if isinstance(b, Const):
        return _view(KNode(op, (a.node, _const_node(b.value, a.node))), a.labels, shape)
    (na, nb), labels = _align(a, b)
    node = KNode(op, (na, nb))
    return _view(node, (None,) * (node.rank - len(labels)) + tuple(labels), shape)


def _apply_select(eqn, c, a, b):
    """SELECT(c, a, b): constants take the dtype of a tensor branch (else of the mask).
    A 0/1 mask c gives where(c, 1, 0) = c and where(c, 0, 1) = 1 - c (jnp.tril of ones)."""
    if isinstance(a, Const) and isinstance(b, Const) and is_mask(c.node) and \
            {a.value, b.value} == {0.0, 1.0}:
        if a.value == 1.0:
            return View(c.node, c.labels, _out(eqn)[0])
        return _apply_binary(eqn, TOp.SUB, Const(1.0, b.dtype, ()), c)
    views = [v for v in (a, b, c) if isinstance(v, View)]
    like = views[0].node
    nodes = [v if isinstance(v, View) else None for v in (c, a, b)]
    present = [v for v in nodes if v is not None]
    aligned, labels = _align(*present)
    found = iter(aligned)
    srcs = [next(found) if v is not None else _const_node(x.value, like)
            for v, x in zip(nodes, (c, a, b))]
    node = KNode(TOp.SELECT, tuple(srcs))
    return _view(node, (None,) * (node.rank - len(labels)) + tuple(labels), _out(eqn)[0])


def _unary(op: TOp):
    def rule(eqn, x):
        return _apply_unary(eqn, op, x)
    rule.__name__ = f"lift_{op.value}"
    return rule


_INDEX_IDENTITY = {TOp.ADD: (0.0, 0.0), TOp.SUB: (None, 0.0), TOp.MUL: (1.0, 1.0)}


def _binary(op: TOp):
    def rule(eqn, a, b):
        return _index_identity(eqn, op, a, b) or _apply_binary(eqn, op, a, b)
    rule.__name__ = f"lift_{op.value}"
    return rule


def _index_identity(eqn, op: TOp, a, b):
    """i + 0, i - 0 and i * 1 are i for integers (jnp.tril adds its offset k = 0 to an iota);
    floats keep them (-0.0 + 0.0 is +0.0)."""
    left, right = _INDEX_IDENTITY.get(op, (None, None))
    if not _is_index(_out(eqn)[1]):
        return None
    for c, x, unit in ((b, a, right), (a, b, left)):
        if isinstance(c, Const) and isinstance(x, View) and unit is not None and c.value == unit:
            return View(x.node, x.labels, _out(eqn)[0])
    return None


def lift_mul(eqn, a, b):
    """x * sigmoid(x) is silu; x * mask.astype(float) is where(mask, x, 0), as XLA rewrites it
    (so a NaN or inf of x where the mask is false gives 0, as under jax.jit)."""
    found = _index_identity(eqn, TOp.MUL, a, b)
    if found is not None:
        return found
    for x, m in ((a, b), (b, a)):
        if isinstance(m, View) and m.from_mask:
            return _apply_select(eqn, m, x, Const(0.0, _out(eqn)[1], ()))
    for x, s in ((a, b), (b, a)):
        if isinstance(x, View) and isinstance(s, View) and s.node.op is TOp.SIGMOID \
                and s.node.srcs[0] is x.node and s.labels == x.labels:
            return _apply_unary(eqn, TOp.SILU, x)
    return _apply_binary(eqn, TOp.MUL, a, b)


def _scalar_src(node: KNode):
    """(value, other operand) when `node` is a binary op with a scalar CONSTANT operand."""
    if len(node.srcs) != 2:
        return None
    for c, x in (node.srcs, node.srcs[::-1]):
        if c.op is KOp.CONSTANT and all(d == 1 for d in c.shape) and x.shape == node.shape:
            return c.arg[0], x
    return None


def _clamp(eqn, x: View, lo: float, hi: float):
    """clamp(x, lo, hi); an infinite bound leaves a one-sided max or min."""
    if lo == -math.inf and hi == math.inf:
        return View(x.node, x.labels, _out(eqn)[0])
    if lo == -math.inf:
        return _apply_binary(eqn, TOp.MIN, x, Const(hi, x.node.dtype.numpy, ()))
    if hi == math.inf:
        return _apply_binary(eqn, TOp.MAX, x, Const(lo, x.node.dtype.numpy, ()))
    return _apply_unary(eqn, TOp.CLAMP, x, (float(lo), float(hi)))


def _inner_bound(v: View, op: TOp):
    """(bound, x) when v is max(x, lo) / relu(x) (op MAX) or min(x, hi) (op MIN)."""
    if op is TOp.MAX and v.node.op is TOp.RELU:
        return 0.0, v.node.srcs[0]
    return _scalar_src(v.node) if v.node.op is op else None


def _bounded(eqn, a, b, op: TOp, identity: float, inner: TOp):
    """max/min against constants: identity bounds vanish, max(x, 0) is relu, pairs are clamps."""
    x, c = (a, b) if isinstance(b, Const) else (b, a)
    if not (isinstance(x, View) and isinstance(c, Const)):
        return _apply_binary(eqn, op, a, b)
    if c.value == identity:
        return View(x.node, x.labels, _out(eqn)[0])
    if op is TOp.MAX and c.value == 0.0:
        return _apply_unary(eqn, TOp.RELU, x)
    found = _inner_bound(x, inner)
    if found is not None:
        lo, hi = (c.value, found[0]) if op is TOp.MAX else (found[0], c.value)
        if lo <= hi:
            return _clamp(eqn, View(found[1], x.labels, x.shape), lo, hi)
    return _apply_binary(eqn, op, a, b)


def lift_max(eqn, a, b):
    return _bounded(eqn, a, b, TOp.MAX, -math.inf, TOp.MIN)


def lift_min(eqn, a, b):
    return _bounded(eqn, a, b, TOp.MIN, math.inf, TOp.MAX)


def lift_clamp(eqn, lo, x, hi):
    """lax.clamp(lo, x, hi) = min(max(x, lo), hi)."""
    if isinstance(x, View) and isinstance(lo, Const) and isinstance(hi, Const) \
            and lo.value <= hi.value:
        return _clamp(eqn, x, lo.value, hi.value)
    return _apply_binary(eqn, TOp.MIN, _apply_binary(eqn, TOp.MAX, x, lo), hi)


def lift_integer_pow(eqn, x):
    """x**2 is square, x**-1 a reciprocal, x**1 x itself; other powers keep a constant exponent."""
    y = eqn.params["y"]
    if y == 1:
        return x
    if y == 2:
        return _apply_unary(eqn, TOp.SQUARE, x)
    if y == -1:
        return _apply_binary(eqn, TOp.DIV, Const(1.0, _out(eqn)[1], ()), x)
    return _apply_binary(eqn, TOp.POW, x, Const(float(y), _out(eqn)[1], ()))


def lift_erfc(eqn, x):
    return _apply_binary(eqn, TOp.SUB, Const(1.0, _out(eqn)[1], ()), _apply_unary(eqn, TOp.ERF, x))


def lift_exp2(eqn, x):
    return _apply_unary(eqn, TOp.EXP, _apply_binary(eqn, TOp.MUL, x,
                                                    Const(math.log(2.0), _out(eqn)[1], ())))


def lift_identity(eqn, *xs):
    return list(xs) if len(eqn.outvars) > 1 else xs[0]


def lift_convert_element_type(eqn, x):
    """A float cast is a CAST to the new dtype (none where the IR dtype is already it);
    constants take the new type. A mask or an index becomes a float as it is (0/1, exact
    integers); a float becomes a mask by x != 0; a float never becomes an integer (that
    truncates)."""
    shape, dtype = _out(eqn)
    if isinstance(x, Const):
        return Const(_rounded(x.value, dtype), dtype, shape)
    source = np.dtype(eqn.invars[0].aval.dtype)
    if dtype == np.bool_ and source != np.bool_:
        return _apply_binary(eqn, TOp.NE, x, Const(0.0, source, ()))
    if _is_index(dtype) and not _is_index(source) and source != np.bool_:
        raise _Unsupported(f"a {source.name} tensor converted to {dtype.name} (truncation)",
                           hint="mugraph computes on float tensors; keep the values float")
    if (source == np.bool_ or _is_index(source)) and dtype.name in _INPUT_DTYPES:
        return View(_in_dtype(x.node, DType.parse(dtype.name)), x.labels, shape,
                    from_mask=source == np.bool_)
    if _is_index(dtype) or dtype == np.bool_:
        return x  # an index or mask kept as the exact float it already is
    return View(_cast(x.node, _ir_dtype(dtype)), x.labels, shape)


def _cast(node: KNode, dtype: DType) -> KNode:
    return node if node.dtype is dtype else node.cast(dtype)


_REDUCED_FORMATS = {(5, 10): DType.FLOAT16, (8, 7): DType.BFLOAT16}


def lift_reduce_precision(eqn, x):
    """reduce_precision to fp32's own format is x; to fp16's or bf16's it is a round trip
    through that dtype (a cast there and back); other formats have no IR op."""
    bits = (eqn.params["exponent_bits"], eqn.params["mantissa_bits"])
    if isinstance(x, Const) or bits[0] >= 8 and bits[1] >= 23:
        return x
    narrow = _REDUCED_FORMATS.get(bits)
    if narrow is None:
        raise _Unsupported(f"rounding to {bits[0]} exponent and {bits[1]} mantissa bits",
                           hint="mugraph rounds to float16 (5, 10) or bfloat16 (8, 7) only")
    return View(_cast(_cast(x.node, narrow), x.node.dtype), x.labels, x.shape)


def _in_dtype(node: KNode, dtype: DType) -> KNode:
    """A mask or an index expression computed in a narrower float dtype where its values stay
    exact (0/1 always; integers below the dtype's exact limit), so that e.g. an fp16 tensor times
    `mask.astype(fp16)` stays fp16 as in JAX; else the node cast to it (rounded, as in JAX)."""
    if node.dtype is dtype or not dtype.is_16bit:
        return node
    if _index_leaves(node) and all(_index_bound(n) < EXACT_INTEGERS[dtype] for n in toposort([node])):
        return _retyped(node, dtype)
    if is_mask(node):
        one, zero = (kernel_constant(v, (1,) * node.rank, dtype) for v in (1.0, 0.0))
        return KNode(TOp.SELECT, (node, one, zero))
    return node.cast(dtype)  # integers beyond the dtype's exact range round, as in JAX


def _retyped(node: KNode, dtype: DType) -> KNode:
    """An index expression rebuilt with every leaf (iotas, constants) in `dtype`."""
    if node.op is KOp.IOTA:
        return kernel_iota(node.arg[0], node.arg[1], dtype)
    if node.op is KOp.CONSTANT:
        return kernel_constant(node.arg[0], node.arg[1], dtype)
    return KNode(node.op, tuple(_retyped(s, dtype) for s in node.srcs), node.arg)


def _is_index(dtype) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer))


# ---- predicates, selects and indices --------------------------------------------------------------
def lift_iota(eqn):
    """An index array: one float32 IOTA leaf along its dim (other dims are broadcast labels)."""
    shape, dim = tuple(eqn.params["shape"]), eqn.params["dimension"]
    if shape[dim] > EXACT_INTEGERS[DType.FLOAT32]:
        raise _Unsupported(f"an iota of extent {shape[dim]} is not exact in float32",
                           hint=f"index arrays are lifted below {EXACT_INTEGERS[DType.FLOAT32]}")
    return _view(kernel_iota((shape[dim],), 0, "float32"), (dim,), shape)


def _logical(op: TOp):
    """`and` / `or` of masks (0/1 floats): a product, a maximum."""
    def rule(eqn, a, b):
        _bools_only(eqn)
        return _apply_binary(eqn, op, a, b)
    rule.__name__ = f"lift_logical_{op.value}"
    return rule


def lift_not(eqn, x):
    _bools_only(eqn)
    return _apply_binary(eqn, TOp.SUB, Const(1.0, np.dtype(np.float32), ()), x)


def _bools_only(eqn) -> None:
    if any(np.dtype(v.aval.dtype) != np.bool_ for v in eqn.invars):
        raise _Unsupported("bitwise logic on integers",
                           hint="mugraph lifts and/or/not of boolean masks only")


def _zero(v) -> bool:
    return isinstance(v, KNode) and v.op is KOp.CONSTANT and v.arg[0] == 0.0 and \
        all(d == 1 for d in v.shape)


# mask op -> (x >= 0 or x > 0 is the mask's truth: strict, whether "x" is its true case)
_SIGN_TESTS = {(TOp.GE, 0): (False, True), (TOp.LE, 1): (False, True),
               (TOp.GT, 0): (True, True), (TOp.LT, 1): (True, True),
               (TOp.LT, 0): (False, False), (TOp.GT, 1): (False, False),
               (TOp.LE, 0): (True, False), (TOp.GE, 1): (True, False)}


def _sign_test(mask: KNode):
    """(x, strict, x_when_true) when `mask` compares a tensor x with 0, else None."""
    if mask.op not in (TOp.GE, TOp.GT, TOp.LE, TOp.LT):
        return None
    for side, zero in ((0, 1), (1, 0)):
        if _zero(mask.srcs[zero]):
            strict, x_when_true = _SIGN_TESTS[(mask.op, side)]
            return mask.srcs[side], strict, x_when_true
    return None


def _slope_of(prod: KNode, x: KNode):
    """s when `prod` is s * x or x * s."""
    if prod.op is not TOp.MUL or x not in prod.srcs:
        return None
    a, b = prod.srcs
    return b if a is x else a


def _leaky(eqn, which, false, true):
    """where(x >= 0, x, s * x) (and its > / < / <= forms) as LEAKY_RELU(x, s), else None.

    At x = 0 the strict forms take s * 0, which is 0 only for a finite slope: they are
    recognised with a finite constant slope only. NaN gives NaN either way.
    """
    if not (isinstance(which, View) and isinstance(true, View) and isinstance(false, View)):
        return None
    found = _sign_test(which.node)
    if found is None:
        return None
    x, strict, x_when_true = found
    same, scaled = (true, false) if x_when_true else (false, true)
    slope = _slope_of(scaled.node, x)
    if same.node is not x or slope is None or same.labels != which.labels \
            or scaled.labels != which.labels:
        return None
    if strict and not (slope.op is KOp.CONSTANT and math.isfinite(slope.arg[0])):
        return None
    return _view(KNode(TOp.LEAKY_RELU, (x, slope)), which.labels, _out(eqn)[0])


def _softplus(eqn, which, false, true):
    """JAX's logaddexp(x, 0) = where(isnan(d), x + 0, max(x, 0) + log1p(exp(-|d|))), d = x - 0,
    as SOFTPLUS(x) (jax.nn.softplus), else None."""
    if not (isinstance(which, View) and isinstance(true, View) and isinstance(false, View)):
        return None
    nan_test, body = which.node, false.node
    if nan_test.op is not TOp.NE or nan_test.srcs[0] is not nan_test.srcs[1]:
        return None
    d = nan_test.srcs[0]
    x = _with_zero(d, TOp.SUB)
    if x is None or body.op is not TOp.ADD:
        return None
    tail = body.srcs[1]
    chain = [TOp.LOG1P, TOp.EXP, TOp.NEG, TOp.ABS]
    for op in chain:
        if tail.op is not op:
            return None
        tail = tail.srcs[0]
    if tail is not d or body.srcs[0].op is not TOp.RELU or body.srcs[0].srcs[0] is not x or \
            _with_zero(true.node, TOp.ADD) is not x:
        return None
    return _view(KNode(TOp.SOFTPLUS, (x,)), which.labels, _out(eqn)[0])


def _with_zero(node: KNode, op: TOp):
    """x when `node` is op(x, 0) or op(0, x) with a scalar zero constant, else None."""
    if node.op is not op:
        return None
    a, b = node.srcs
    return a if _zero(b) else b if _zero(a) else None


# Ops whose result is +0, positive, +inf or NaN (never negative, never -0.0) when their operands are
# (constants: >= +0.0; a predicate: 0 or 1): abs of such a value is the value itself, bit for bit.
_NONNEGATIVE_ALWAYS = frozenset({TOp.EXP, TOp.SQUARE, TOp.ABS, TOp.SIGMOID, TOp.SOFTPLUS}) | PREDICATES
_NONNEGATIVE_IF_OPERANDS = frozenset({TOp.ADD, TOp.MUL, TOp.DIV, TOp.MAX, TOp.MIN, TOp.CAST, KOp.REDUCE_SUM,
                                      KOp.REDUCE_MAX, KOp.MATMUL}) | KERNEL_LAYOUT


def _nonnegative(node: KNode) -> bool:
    if node.op in _NONNEGATIVE_ALWAYS:
        return True
    if node.op is KOp.CONSTANT:
        return node.arg[0] > 0 or (node.arg[0] == 0 and math.copysign(1.0, node.arg[0]) > 0)
    return node.op in _NONNEGATIVE_IF_OPERANDS and all(_nonnegative(s) for s in node.srcs)


def lift_abs(eqn, x):
    """|x|, or x itself where x is never negative (logsumexp's log(abs(sum(exp(...)))))."""
    if isinstance(x, View) and _nonnegative(x.node):
        return View(x.node, x.labels, _out(eqn)[0])
    return _apply_unary(eqn, TOp.ABS, x)


def lift_sign(eqn, x):
    """sign(x) = where(x > 0, 1, where(x < 0, -1, x)): NaN and +-0 come through as themselves."""
    dtype = _out(eqn)[1]
    one, zero = Const(1.0, dtype, ()), Const(0.0, dtype, ())
    inner = _apply_select(eqn, _apply_binary(eqn, TOp.LT, x, zero), Const(-1.0, dtype, ()), x)
    return _apply_select(eqn, _apply_binary(eqn, TOp.GT, x, zero), one, inner)


def lift_select_n(eqn, which, *cases):
    """jnp.where: select_n(c, false_case, true_case) is SELECT(c, true_case, false_case);
    a constant predicate picks its case (jnp.var guards its divisor like this)."""
    if isinstance(which, Const):
        return _relabel(cases[int(which.value)], eqn, {j: j for j in range(len(_out(eqn)[0]))})
    if len(cases) != 2:
        raise _Unsupported(f"a select_n of {len(cases)} cases",
                           hint="mugraph lifts two-way selects (jnp.where); nest them")
    false, true = cases
    return _leaky(eqn, which, false, true) or _softplus(eqn, which, false, true) or \
        _apply_select(eqn, which, true, false)


# ---- layout rules: relabelings -------------------------------------------------------------------
def _relabel(x, eqn, mapping):
    """x as the equation's output, jaxpr dim j of the operand becoming dim mapping[j]."""
    shape = _out(eqn)[0]
    if isinstance(x, Const):
        return Const(x.value, x.dtype, shape)
    return View(x.node, tuple(None if l is None else mapping[l] for l in x.labels), shape)


def lift_broadcast_in_dim(eqn, x, *dynamic_shape):
    return _relabel(x, eqn, dict(enumerate(eqn.params["broadcast_dimensions"])))


def lift_transpose(eqn, x):
    perm = eqn.params["permutation"]
    return _relabel(x, eqn, {old: new for new, old in enumerate(perm)})


def lift_squeeze(eqn, x):
    dropped = set(eqn.params["dimensions"])
    kept = [d for d in range(len(eqn.invars[0].aval.shape)) if d not in dropped]
    return _relabel(x, eqn, {old: new for new, old in enumerate(kept)})


def lift_reshape(eqn, x, *dynamic_shape):
    """A reshape that only adds or drops unit dims is a relabeling; one that splits or merges
    dims (a head split [B, S, H*D] -> [B, S, H, D], a head merge) is a RESHAPE of the
    materialised operand: row-major, so a view of it wherever the strides allow."""
    old, new = tuple(eqn.invars[0].aval.shape), _out(eqn)[0]
    if eqn.params.get("dimensions") is not None:
        raise _Unsupported("a reshape with a `dimensions` permutation",
                           hint="transpose first, then reshape (jnp.reshape does)")
    if isinstance(x, Const):
        return Const(x.value, x.dtype, new)
    old_dims = [d for d, n in enumerate(old) if n != 1]
    new_dims = [d for d, n in enumerate(new) if n != 1]
    if [old[d] for d in old_dims] == [new[d] for d in new_dims]:
        return _relabel(x, eqn, dict(zip(old_dims, new_dims)))
    return _reshaped_view(_materialize_wide(x), new)


def _reshaped(node: KNode, shape) -> KNode:
    """`node` reshaped to `shape`: a reshape of a reshape reshapes the first one's source (they
    compose, row-major), and one to the same shape is none."""
    shape = tuple(shape)
    while node.op is KOp.RESHAPE:
        node = node.srcs[0]
    return node if node.shape == shape else node.reshape(shape)


def _reshaped_view(node: KNode, shape) -> View:
    """`node` reshaped (row-major) to the jaxpr `shape`, held without its unit dims (a view's
    unit dims carry no label), so a rank-5 shape with a unit dim still fits."""
    wide = [d for d, n in enumerate(shape) if n != 1]
    _check_rank([shape[d] for d in wide])
    target = tuple(shape[d] for d in wide) or (1,)
    return _view(_reshaped(node, target), wide or (None,), shape)


def _materialize_wide(v: View) -> KNode:
    """v as a tensor whose row-major order is the jaxpr value's, for a reshape to read: unit dims
    dropped, and where that leaves more dims than a kernel tensor has, adjacent dims the node
    holds merged, leftmost first, until it fits: jnp.repeat(k, r, axis=2) of k [B, T, H, D] is
    [B*T, H, r, D] before its reshape to [B, T, H*r, D] (a view of k: a repeated dim)."""
    slots = tuple(d for d, n in enumerate(v.shape) if n != 1) or (None,)
    if len(slots) <= MAX_RANK:
        return _fill(_arrange(v, slots), slots, v.shape)
    held = tuple(d for d in slots if d in v.labels)
    groups = [[d] for d in slots]
    while len(groups) > MAX_RANK:
        pair = next((k for k in range(len(groups) - 1) if groups[k][-1] in held and
                     groups[k + 1][0] in held), None)
        if pair is None:
            _check_rank([v.shape[d] for d in slots])
        groups[pair:pair + 2] = [groups[pair] + groups[pair + 1]]
    sizes = [math.prod(v.shape[d] for d in g) for g in groups]
    node = _arrange(v, held)
    node = _reshaped(node, tuple(n for n, g in zip(sizes, groups) if g[0] in held))
    node = _reshaped(node, tuple(n if g[0] in held else 1 for n, g in zip(sizes, groups)))
    return node.broadcast_to(tuple(sizes))


def _check_rank(shape, hint: str = "") -> None:
    """Kernel tensors have at most MAX_RANK dims (`shape`: the sizes of the dims needed)."""
    if len(shape) > MAX_RANK:
        raise _Unsupported(f"a tensor of {len(shape)} non-unit dims {list(shape)} is needed here",
                           hint=hint or f"kernel tensors have 1 to {MAX_RANK} dims; fold extra "
                                        "dims outside the traced function")


def lift_slice(eqn, x):
    """x[a:b, ...] with strides 1: a SLICE (a view: an offset into its source)."""
    starts, limits = tuple(eqn.params["start_indices"]), tuple(eqn.params["limit_indices"])
    steps = eqn.params.get("strides")
    if steps is not None and any(st != 1 for st in steps):
        raise _Unsupported(f"a slice with strides {list(steps)}",
                           hint="mugraph lifts contiguous windows (strides 1), e.g. x[..., :h]; "
                                "take strided elements outside the traced function")
    return _window(eqn, x, starts, limits, _out(eqn)[0])


def _window(eqn, x, starts, limits, shape):
    if isinstance(x, Const):
        return Const(x.value, x.dtype, shape)
    node = _materialize(x)
    if tuple(starts) == (0,) * len(starts) and tuple(limits) == node.shape:
        return _view(node, range(len(shape)), shape)
    return _view(node.slice(starts or (0,), limits or (1,)), range(len(shape)), shape)


def lift_split(eqn, x):
    """jnp.split / a fused QKV: one window per part along `axis`."""
    axis, sizes = eqn.params["axis"], [int(n) for n in eqn.params["sizes"]]
    shape = tuple(eqn.invars[0].aval.shape)
    outs, start = [], 0
    for var, n in zip(eqn.outvars, sizes):
        starts = tuple(start if d == axis else 0 for d in range(len(shape)))
        limits = tuple(start + n if d == axis else e for d, e in enumerate(shape))
        outs.append(_window(eqn, x, starts, limits, tuple(var.aval.shape)))
        start += n
    return outs


# ---- reductions ----------------------------------------------------------------------------------
def _reduce(eqn, x, op: KOp):
    """Reduce each axis (keepdim) in turn; sums over broadcast dims become a multiply."""
    axes = tuple(eqn.params["axes"])
    shape, dtype = _out(eqn)
    mapping = {j: j - sum(a < j for a in axes) for j in range(len(x.shape)) if j not in axes}
    summed = op is KOp.REDUCE_SUM
    if isinstance(x, Const):
        count = math.prod(x.shape[a] for a in axes) if summed else 1
        return Const(_rounded(x.value * count, dtype), dtype, shape)
    node = x.node
    for a in axes:
        if a in x.labels:
            node = KNode(op, (node,), x.labels.index(a))
    count = math.prod(x.shape[a] for a in axes if a not in x.labels) if summed else 1
    if count != 1:
        node = KNode(TOp.MUL, (node, _const_node(float(count), node)))
    labels = tuple(None if l is None or l in axes else mapping[l] for l in x.labels)
    return _view(node, labels, shape)


def lift_reduce_sum(eqn, x):
    return _reduce(eqn, x, KOp.REDUCE_SUM)


def lift_reduce_max(eqn, x):
    return _reduce(eqn, x, KOp.REDUCE_MAX)


def _negated(x):
    """-x with x's own shape (for rules whose output shape differs from the operand's)."""
    if isinstance(x, Const):
        return Const(-x.value, x.dtype, x.shape)
    return View(KNode(TOp.NEG, (x.node,)), x.labels, x.shape)


def lift_reduce_min(eqn, x):
    """min = -max(-x)."""
    return _negated(_reduce(eqn, _negated(x), KOp.REDUCE_MAX))


# ---- matmul and concat ---------------------------------------------------------------------------
_DOT_HINT = ("mugraph lifts batched matmuls [..., M, K] @ [..., K, N]: one contracting dim, "
             "and either paired batch dims with at most one free dim per side, or extra free dims "
             "on one side only (NumPy matmul broadcasting); reshape or use jnp.matmul / einsum "
             "in that form")


def _dot_slots(dims, lrank: int, rrank: int):
    """The IR layouts of both operands (jaxpr dims in order; None = a unit dim) and, per IR dim
    of the result, the dim of the dot_general's output it holds.

    The last free dim of each side is M (or N); the rest lead, like batch dims: paired batch dims,
    or extra free dims on one side only, which the IR matmul broadcasts against the other.
    """
    (lc, rc), (lb, rb) = dims
    lf = [d for d in range(lrank) if d not in (*lc, *lb)]
    rf = [d for d in range(rrank) if d not in (*rc, *rb)]
    if len(lc) != 1:
        raise _Unsupported(f"a dot_general contracting {len(lc)} dims", hint=_DOT_HINT)
    lead_l, lead_r = lf[:-1], rf[:-1]
    if (lb and (lead_l or lead_r)) or (lead_l and lead_r):
        raise _Unsupported(f"a dot_general with {len(lf)} free dim(s) on the left and {len(rf)} "
                           f"on the right, {len(lb)} batch dim(s)", hint=_DOT_HINT)
    m, n = (lf[-1] if lf else None), (rf[-1] if rf else None)
    out_l = {d: len(lb) + i for i, d in enumerate(lf)}
    out_r = {d: len(lb) + len(lf) + i for i, d in enumerate(rf)}
    lslots = (*lb, *lead_l, m, lc[0])
    rslots = (*rb, *lead_r, rc[0], n)
    out = (*range(len(lb)), *(out_l[d] for d in lead_l), *(out_r[d] for d in lead_r),
           out_l.get(m), out_r.get(n))
    return lslots, rslots, out


def _swapped(dims, lrank: int, rrank: int):
    """The same product as B^T A^T: (slots of rhs as the IR's left operand, slots of lhs as its
    right one, and the original output dim of each IR result dim)."""
    (lc, rc), (lb, rb) = dims
    lslots, rslots, out = _dot_slots(((rc, lc), (rb, lb)), rrank, lrank)
    nb, nlf = len(lb), lrank - len(lc) - len(lb)
    nrf = rrank - len(rc) - len(rb)

    def original(p):
        if p is None or p < nb:
            return p
        return nb + nlf + (p - nb) if p < nb + nrf else nb + (p - nb - nrf)
    return lslots, rslots, tuple(original(p) for p in out)


def _moves_computed_dims(v: View, slots) -> bool:
    """Whether arranging `v` in `slots` transposes a computed tensor (not a view of an input or
    an index): a copy, where a view of an input is free."""
    mapped = [slots.index(label) for label in v.labels if label is not None and label in slots]
    return mapped != sorted(mapped) and _computed(v)


def _computed(v: View) -> bool:
    """Whether `v` is a computed tensor, not a strided view of an input, an iota or a table."""
    root = strided_view(v.node)
    return root is None or root.root.op not in (KOp.INPUT, KOp.IOTA, KOp.TABLE)


def _dot_layout(eqn, lhs: View, rhs: View):
    """(left view, right view, left slots, right slots, out): the operand order that transposes
    fewer computed tensors (attention's probs @ V rather than V^T @ probs^T; the result is a lazy
    view either way); on a tie, a computed row vector goes on the left (a decode step's
    probs [1, T] @ V [T, d], which jnp.einsum emits as dot_general(V, probs))."""
    dims = eqn.params["dimension_numbers"]
    lrank, rrank = len(lhs.shape), len(rhs.shape)
    lslots, rslots, out = _dot_slots(dims, lrank, rrank)
    try:
        sl, sr, sout = _swapped(dims, lrank, rrank)
    except _Unsupported:
        return lhs, rhs, lslots, rslots, out
    cost = _moves_computed_dims(lhs, lslots) + _moves_computed_dims(rhs, rslots)
    swapped = _moves_computed_dims(rhs, sl) + _moves_computed_dims(lhs, sr)
    if swapped < cost or (swapped == cost and _computed_vector_on_the_right(dims, lhs, rhs)):
        return rhs, lhs, sl, sr, sout
    return lhs, rhs, lslots, rslots, out


def _computed_vector_on_the_right(dims, lhs: View, rhs: View) -> bool:
    """Whether the right operand is a computed tensor with one free element per batch (a decode
    step's probs) against a left operand with several: it goes on the left, probs @ V, the form
    the search's attention structures take (jnp.einsum emits dot_general(V, probs))."""
    (lc, rc), (lb, rb) = dims
    return _free_elements(rhs, rc, rb) == 1 < _free_elements(lhs, lc, lb) and _computed(rhs)


def _free_elements(v: View, contracting, batch) -> int:
    return math.prod(n for d, n in enumerate(v.shape) if d not in (*contracting, *batch))


def lift_dot_general(eqn, lhs, rhs):
    """dot_general as an IR matmul; operands not in [..., M, K] / [..., K, N] order are
    transposed. Several contracting dims, or free dims on both sides next to batch dims (Flax's
    LinearGeneral [B, S, D] x [D, H, hd], an einsum over heads), become one matmul of the
    operands reshaped to [batch..., M, K] @ [batch..., K, N] (views where the dims are
    contiguous) and a reshape of the result to JAX's [batch..., free left..., free right...]."""
    lhs, rhs = _as_view(lhs), _as_view(rhs)
    try:
        lhs, rhs, lslots, rslots, out = _dot_layout(eqn, lhs, rhs)
    except _Unsupported:
        return _grouped_dot(eqn, lhs, rhs)
    # Batch and free dims may stay unit (the IR matmul broadcasts, the result view keeps them
    # unit); the contracting dim (last on the left, next to last on the right) must be real.
    left = _fill(_arrange(lhs, lslots), lslots, lhs.shape, keep_unit=lslots[:-1])
    right = _fill(_arrange(rhs, rslots), rslots, rhs.shape, keep_unit=rslots[:-2] + rslots[-1:])
    node = _typed_matmul(left, right, _ir_dtype(_out(eqn)[1]))
    return _view(node, (None,) * (node.rank - len(out)) + out, _out(eqn)[0])


def _grouped_dot(eqn, lhs: View, rhs: View) -> View:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lf = [d for d in range(len(lhs.shape)) if d not in (*lc, *lb)]
    rf = [d for d in range(len(rhs.shape)) if d not in (*rc, *rb)]
    batch = tuple(lhs.shape[d] for d in lb)
    m, k = math.prod(lhs.shape[d] for d in lf), math.prod(lhs.shape[d] for d in lc)
    n = math.prod(rhs.shape[d] for d in rf)
    left = _grouped(lhs, (*lb, *lf, *lc), batch + (m, k))
    right = _grouped(rhs, (*rb, *rc, *rf), batch + (k, n))
    node = _typed_matmul(left, right, _ir_dtype(_out(eqn)[1]))
    return _reshaped_view(node, _out(eqn)[0])


def _grouped(v: View, slots, shape) -> KNode:
    """v with its jaxpr dims in `slots` order, reshaped to `shape` (dims grouped row-major)."""
    wide = tuple(d for d in slots if v.shape[d] != 1) or (None,)
    _check_rank([v.shape[d] for d in wide if d is not None])
    node = _fill(_arrange(v, wide), wide, v.shape)
    shape = tuple(shape)
    if len(shape) > MAX_RANK:   # leading unit batch dims
        shape = (math.prod(shape[:-2]),) + shape[-2:]
    return _reshaped(node, shape)


def _typed_matmul(left: KNode, right: KNode, want: DType) -> KNode:
    """left @ right in JAX's result dtype: a wider `preferred_element_type` multiplies the
    operands' casts (exact: fp32 holds every 16-bit product), a narrower one rounds the result."""
    node = KNode(KOp.MATMUL, (left, right))
    if node.dtype is want:
        return node
    if want is DType.FLOAT32:
        return KNode(KOp.MATMUL, (_cast(left, want), _cast(right, want)))
    return node.cast(want)


def lift_concatenate(eqn, *xs):
    dim = eqn.params["dimension"]
    nodes = [_materialize(_as_view(x)) for x in xs]
    node = nodes[0] if len(nodes) == 1 else concat(nodes, dim)
    return _view(node, range(node.rank), _out(eqn)[0])


# ---- constant-only folds: masks and predicates that do not depend on a tensor -------------------
def _fold_with(fn):
    def fold(eqn, *args):
        shape, dtype = _out(eqn)
        value = fn(*(np.asarray(a.value, a.dtype) for a in args))
        return Const(_rounded(value, dtype), dtype, shape)
    fold.__name__ = f"fold_{fn.__name__}"
    return fold


FOLDS = {"eq": _fold_with(np.equal), "ne": _fold_with(np.not_equal), "lt": _fold_with(np.less),
         "le": _fold_with(np.less_equal), "gt": _fold_with(np.greater),
         "ge": _fold_with(np.greater_equal), "and": _fold_with(np.logical_and),
         "or": _fold_with(np.logical_or), "not": _fold_with(np.logical_not),
         "is_finite": _fold_with(np.isfinite), "xor": _fold_with(np.logical_xor),
         "sign": _fold_with(np.sign)}


# ---- nested jaxprs -------------------------------------------------------------------------------
# jit, custom_jvp/custom_vjp, remat and closed_call are lifted in place: their body's equations
# become IR nodes like any others (see `lift_eqn`).
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint"})


def _call_body(eqn):
    """(jaxpr, consts) of a call-like equation's body."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if isinstance(body, ClosedJaxpr):
            return body.jaxpr, body.consts
        if body is not None:
            return body, ()
    raise _Unsupported("a call without a body jaxpr")


RULES = {
    "add": _binary(TOp.ADD), "add_any": _binary(TOp.ADD), "sub": _binary(TOp.SUB), "mul": lift_mul, "div": _binary(TOp.DIV),
    "pow": _binary(TOp.POW), "max": lift_max, "min": lift_min, "clamp": lift_clamp,
    "neg": _unary(TOp.NEG), "exp": _unary(TOp.EXP), "log": _unary(TOp.LOG),
    "sqrt": _unary(TOp.SQRT), "rsqrt": _unary(TOp.RSQRT), "square": _unary(TOp.SQUARE),
    "logistic": _unary(TOp.SIGMOID), "tanh": _unary(TOp.TANH), "erf": _unary(TOp.ERF),
    "erfc": lift_erfc, "abs": lift_abs, "expm1": _unary(TOp.EXPM1),
    "log1p": _unary(TOp.LOG1P), "exp2": lift_exp2, "integer_pow": lift_integer_pow,
    "gt": _binary(TOp.GT), "ge": _binary(TOp.GE), "lt": _binary(TOp.LT), "le": _binary(TOp.LE),
    "eq": _binary(TOp.EQ), "ne": _binary(TOp.NE), "is_finite": _unary(TOp.IS_FINITE),
    "and": _logical(TOp.MUL), "or": _logical(TOp.MAX), "xor": _binary(TOp.NE), "not": lift_not,
    "iota": lift_iota, "sign": lift_sign,
    "convert_element_type": lift_convert_element_type,
    "stop_gradient": lift_identity, "copy": lift_identity, "copy_p": lift_identity,
    "reduce_precision": lift_reduce_precision, "optimization_barrier": lift_identity,
    "broadcast_in_dim": lift_broadcast_in_dim, "reshape": lift_reshape, "slice": lift_slice,
    "split": lift_split,
    "squeeze": lift_squeeze, "transpose": lift_transpose,
    "reduce_sum": lift_reduce_sum, "reduce_max": lift_reduce_max, "reduce_min": lift_reduce_min,
    "dot_general": lift_dot_general, "concatenate": lift_concatenate, "select_n": lift_select_n,
}

_INDEX_HINT = "mugraph lifts dense math on whole tensors; do indexing outside the traced function"
UNSUPPORTED_HINTS = {
    "sort": "sorting has no IR op; sort outside the traced function",
    "cumsum": "prefix sums have no IR op; compute them outside the traced function",
    "cumprod": "prefix products have no IR op", "cummax": "prefix maxima have no IR op",
    "cumlogsumexp": "prefix reductions have no IR op",
    "argmax": "mugraph lifts values, not indices; use jnp.max for the value",
    "argmin": "mugraph lifts values, not indices; use jnp.min for the value",
    "gather": _INDEX_HINT, "scatter": _INDEX_HINT, "scatter-add": _INDEX_HINT,
    "scatter_add": _INDEX_HINT, "dynamic_slice": _INDEX_HINT, "dynamic_update_slice": _INDEX_HINT,
    "pad": "mugraph's IR has no padding; pad outside the traced function",
    "conv_general_dilated": "convolutions are not lifted; express the layer as a matmul "
                            "(e.g. a 1x1 convolution is x @ w)",
    "while": "loops are not lifted; unroll with a Python loop",
    "scan": "loops are not lifted; unroll with a Python loop",
    "cond": "control flow is not lifted; branch in Python outside the traced function",
    "reduce_prod": "only sum, max and min reductions are lifted",
}
_DEFAULT_HINT = ("mugraph lifts elementwise float math, comparisons and jnp.where, index arrays "
                 "(iota), sum/max/min reductions, matmuls and einsums, reshapes, transposes, "
                 "slices and concatenations; compute this part outside the traced function")


# ---- the driver ----------------------------------------------------------------------------------
def _source(eqn) -> str | None:
    """`file.py:LINE (function)` of the user's frame that produced `eqn`, if JAX recorded one."""
    try:
        from jax._src import source_info_util
        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:  # source info is a private JAX detail; the message works without it
        return None
    if frame is None:
        return None
    return f"{os.path.basename(frame.file_name)}:{frame.start_line} ({frame.function_name})"


def _equation_text(eqn, limit: int = 160) -> str:
    text = " ".join(str(eqn).split())
    return text if len(text) <= limit else text[:limit - 4] + " ..."


def _read(env: dict, var):
    if isinstance(var, Literal):
        dtype = np.dtype(var.aval.dtype)
        return Const(_rounded(var.val, dtype), dtype, tuple(var.aval.shape))
    return env[var]


def _closed_const(array) -> Const | Opaque:
    array = np.asarray(array)
    flat = array.reshape(-1)
    numeric = jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer) \
        or array.dtype == np.bool_
    if numeric and flat.size and (flat.size == 1 or bool(np.all(flat == flat[0]))):
        return Const(_rounded(flat[0], array.dtype), array.dtype, array.shape)
    return Opaque(array.shape, array.dtype, array if numeric else None)


_LAYOUT_PRIMITIVES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "transpose",
                                "convert_element_type", "stop_gradient", "copy", "copy_p",
                                "optimization_barrier", "select_n", "concatenate"})
# what may make a mask (a bool tensor), and what an index tensor (integers, exact in float32)
_MASK_PRIMITIVES = _LAYOUT_PRIMITIVES | {"eq", "ne", "lt", "le", "gt", "ge", "is_finite", "and",
                                         "or", "not", "xor"}
_INDEX_PRIMITIVES = _LAYOUT_PRIMITIVES | {"iota", "add", "sub", "mul", "neg", "max", "min", "abs",
                                          "clamp"}


def _check_operands(eqn, args) -> None:
    """Tensors meet only lifted constants, and make float tensors, masks or exact indices."""
    for a in args:
        if isinstance(a, Opaque):
            what = "not computable ahead of time" if a.array is None else \
                f"of {a.array.size} elements, above the {MAX_TABLE_ELEMENTS} a graph holds"
            raise _Unsupported(f"an operand is a constant array (closed over, or built inside the "
                               f"function) {what}",
                               hint="pass the array as an argument of the traced function")
    if not any(isinstance(a, View) for a in args) and eqn.primitive.name != "iota":
        return
    for var in eqn.outvars:
        dtype = np.dtype(var.aval.dtype)
        allowed = _MASK_PRIMITIVES if dtype == np.bool_ else \
            _INDEX_PRIMITIVES if _is_index(dtype) else None
        if allowed is not None and eqn.primitive.name not in allowed:
            raise _Unsupported(f"it makes a tensor of {dtype.name}",
                               hint="mugraph computes on float16/bfloat16/float32 tensors, with "
                                    "boolean masks from comparisons and integer indices from "
                                    "iota under +, -, *, max and min only")
        if allowed is None and not jnp.issubdtype(dtype, jnp.floating):
            raise _Unsupported(f"it makes a tensor of {dtype.name}",
                               hint="mugraph computes on float16/bfloat16/float32 tensors only")


def _check_indices(eqn, outs) -> None:
    """Integer results are computed in float32: each must stay exact (|value| < 2^24)."""
    limit = EXACT_INTEGERS[DType.FLOAT32]
    for var, out in zip(eqn.outvars, outs):
        if isinstance(out, View) and _is_index(np.dtype(var.aval.dtype)):
            bound = _index_bound(out.node)
            if bound >= limit:
                raise _Unsupported(f"index arithmetic reaches {bound:g}, beyond the {limit} "
                                   "float32 holds exactly",
                                   hint="keep index expressions (iota, offsets, products) small")


_BOUND_RULES = {
    TOp.ADD: lambda a, b: a + b, TOp.SUB: lambda a, b: a + b, TOp.MUL: lambda a, b: a * b,
    TOp.NEG: lambda a: a, TOp.ABS: lambda a: a, TOp.MAX: max, TOp.MIN: max,
    TOp.CLAMP: lambda a: a, TOp.SELECT: lambda c, a, b: max(a, b),
}


def _index_bound(node: KNode, memo=None) -> float:
    """An upper bound of |value| over an integer-valued node (inf where none is known)."""
    memo = {} if memo is None else memo
    if node in memo:
        return memo[node]
    if node.op is KOp.IOTA:
        bound = float(node.shape[node.arg[1]] - 1)
    elif node.op is KOp.CONSTANT:
        bound = abs(node.arg[0])
    elif node.op in PREDICATES:
        bound = 1.0
    elif node.op in KERNEL_LAYOUT:
        bound = _index_bound(node.srcs[0], memo)
    elif node.op in _BOUND_RULES:
        bound = _BOUND_RULES[node.op](*(_index_bound(s, memo) for s in node.srcs))
    else:
        bound = math.inf
    memo[node] = bound
    return bound


def lift_eqn(eqn, args, where: str | None = None) -> list:
    """The lifted outputs of one equation (a list, one value per outvar).

    `where` is the user's source line of the enclosing call: JAX records none inside the body of
    a nested jit, so errors there point at the line that called it.

    Work on values that depend on no input is also computed, by JAX itself: a result the IR can
    hold as an index expression stays one (a causal mask is computed in the kernel); one it
    cannot (cos of RoPE angles, a concatenation of constants, a closed-over array where it meets
    a tensor) is folded into a TABLE, as XLA folds it into a literal.
    """
    name = eqn.primitive.name
    if name in CALLS:
        return _lift_call(eqn, args, _source(eqn) or where)
    rule = RULES.get(name)
    known = _concrete(args)
    if not any(isinstance(a, View) for a in args):
        if name in FOLDS and not any(isinstance(a, Opaque) for a in args):
            return [FOLDS[name](eqn, *args)]
        if rule is None or any(isinstance(a, Opaque) for a in args):
            return _constant_outputs(eqn, known)
    try:
        if rule is None:
            if known is not None:
                return _folded_outputs(eqn, known)
            raise _Unsupported("mugraph has no rule for this primitive",
                               hint=UNSUPPORTED_HINTS.get(name, _DEFAULT_HINT))
        args = [_table_of(a) if isinstance(a, Opaque) else a for a in args]
        _check_operands(eqn, args)
        out = rule(eqn, *args)
        out = out if isinstance(out, list) else [out]
        _check_indices(eqn, out)
    except _Unsupported as e:
        if known is not None and rule is not None:
            return _folded_outputs(eqn, known)
        raise _error(eqn, e, where) from None
    return out if known is None else _with_known(eqn, out, known)


# ---- values that depend on no input: computed by JAX, folded where the IR cannot hold them -------
def _concrete(args) -> list | None:
    """The arrays of `args` where every one is known (depends on no input), else None."""
    arrays = []
    for a in args:
        if isinstance(a, Const):
            arrays.append(np.full(a.shape, a.value, a.dtype))
        elif isinstance(a, Opaque) and a.array is not None:
            arrays.append(a.array)
        elif isinstance(a, View) and a.known is not None:
            arrays.append(a.known)
        else:
            return None
    return arrays


def _evaluate(eqn, arrays) -> list | None:
    """The equation's outputs computed by JAX on concrete arrays (eagerly, even inside a trace
    of the caller), or None where JAX cannot."""
    try:
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*arrays, **eqn.params)
    except Exception:   # a primitive that does not evaluate eagerly: the value stays unknown
        return None
    out = out if eqn.primitive.multiple_results else [out]
    return [np.asarray(o) for o in out]


def _constant_outputs(eqn, known) -> list:
    """Outputs of constant-only work mugraph has no rule for: uniform ones are Consts, others
    Opaque (with their values where JAX computes them); an error, if any, belongs to the
    equation where one meets a tensor."""
    values = _evaluate(eqn, known) if known is not None else None
    if values is None:
        return [Opaque(tuple(v.aval.shape), np.dtype(v.aval.dtype)) for v in eqn.outvars]
    return [_closed_const(v) for v in values]


def _folded_outputs(eqn, known) -> list:
    """Outputs of work on known values that has no rule: computed by JAX and held as TABLEs
    (floats) or Opaque arrays (booleans and integers, until they meet a tensor)."""
    values = _evaluate(eqn, known)
    if values is None:
        raise _error(eqn, _Unsupported("mugraph has no rule for this primitive",
                                       hint=UNSUPPORTED_HINTS.get(eqn.primitive.name,
                                                                  _DEFAULT_HINT)), None)
    outs = []
    for v in values:
        c = _closed_const(v)
        outs.append(_table_of(c) if isinstance(c, Opaque) and jnp.issubdtype(v.dtype, jnp.floating)
                    else c)
    return outs


def _with_known(eqn, out: list, known) -> list:
    """Outputs of work on known values: index expressions keep their IR nodes (and learn their
    values); anything else the IR would compute from constants is folded into a TABLE."""
    values = _evaluate(eqn, known)
    if values is None:
        return out
    done = []
    for o, v in zip(out, values):
        if isinstance(o, View) and _index_leaves(o.node):
            done.append(replace(o, known=v))
        elif isinstance(o, View) and jnp.issubdtype(v.dtype, jnp.floating) and \
                v.size <= MAX_TABLE_ELEMENTS:
            done.append(_table_view(v, o.from_mask))
        elif isinstance(o, View):
            done.append(replace(o, known=v))
        else:
            done.append(o)
    return done


def _table_of(value: Opaque) -> View | Opaque:
    """A known constant array as a TABLE where it meets a tensor: booleans as 0/1 masks, integers
    as exact floats; unknown or too large, it stays Opaque (an error in `_check_operands`)."""
    array = value.array
    if array is not None and array.dtype == np.bool_:
        band = _band_mask(array)
        if band is not None:
            return band
    if array is None or array.size > MAX_TABLE_ELEMENTS:
        return value
    if array.dtype == np.bool_:
        return _table_view(array.astype(np.float32), from_mask=True)
    if _is_index(array.dtype):
        if array.size and np.abs(array).max() >= EXACT_INTEGERS[DType.FLOAT32]:
            return value
        return _table_view(array.astype(np.float32))
    return _table_view(array)


def _band_mask(mask: np.ndarray) -> View | None:
    """A boolean array that is a band of its last two dims, i + k >= j (jnp.tril) or
    j >= i + k (jnp.triu), the same for every index of its leading dims (folded by JAX where
    `jnp.tril(jnp.ones(...))` was built), rebuilt as the comparison of two iotas it is:
    computed in the kernel, whatever its size."""
    if mask.ndim < 2 or not mask.size:
        return None
    planes = mask.reshape((-1,) + mask.shape[-2:])
    m = planes[0]
    if not all(np.array_equal(p, m) for p in planes[1:]):
        return None
    rows, cols = m.shape
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    counts = m.sum(axis=1)
    partial = np.flatnonzero((counts > 0) & (counts < cols))
    if not len(partial):
        return None
    r = int(partial[0])
    for op, k in ((TOp.GE, int(counts[r]) - 1 - r), (TOp.LE, cols - int(counts[r]) - r)):
        band = i + k >= j if op is TOp.GE else i + k <= j
        if np.array_equal(m, band):
            return _band_view(op, k, mask.shape)
    return None


def _band_view(op: TOp, k: int, shape) -> View:
    rows = kernel_iota((shape[-2], 1), 0, "float32")
    if k:
        rows = KNode(TOp.ADD, (rows, kernel_constant(float(k), (1, 1), "float32")))
    node = KNode(op, (rows, kernel_iota((1, shape[-1]), 1, "float32")))
    labels = tuple(len(shape) - 2 + d if n != 1 else None for d, n in enumerate(node.shape))
    return View(node, labels, tuple(shape), known=None)


def _table_view(array, from_mask: bool = False) -> View:
    array = np.asarray(array)
    node = kernel_table(array, _ir_dtype(array.dtype))
    return View(node, tuple(None if n == 1 else d for d, n in enumerate(node.shape))
                if array.ndim else (None,), tuple(array.shape), from_mask, array)


def _error(eqn, e: _Unsupported, where) -> UnsupportedOp:
    name = eqn.primitive.name
    return UnsupportedOp(f"cannot lift `{name}`: {e.detail}", primitive=name,
                         equation=_equation_text(eqn), source=_source(eqn) or where, hint=e.hint)


def _lift_call(eqn, args, where) -> list:
    try:
        jaxpr, consts = _call_body(eqn)
    except _Unsupported as e:
        raise _error(eqn, e, where) from None
    return lift_jaxpr(jaxpr, consts, args, where)


def _live_eqns(jaxpr) -> list:
    """The equations the outputs depend on (dead ones, e.g. with dropped outputs, are skipped)."""
    live = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if not isinstance(v, Literal))
    return kept[::-1]


def lift_jaxpr(jaxpr, consts, args, where: str | None = None) -> list:
    """Lift every equation of `jaxpr` given lifted invars `args`; return the lifted outvars."""
    env = {v: _closed_const(c) for v, c in zip(jaxpr.constvars, consts)}
    env.update(zip(jaxpr.invars, args))
    for eqn in _live_eqns(jaxpr):
        outs = lift_eqn(eqn, [_read(env, v) for v in eqn.invars], where)
        env.update(zip(eqn.outvars, outs))
    return [_read(env, v) for v in jaxpr.outvars]


# ---- arguments, names, outputs -------------------------------------------------------------------
def _arg_spec(i: int, leaf) -> tuple[tuple, DType]:
    """Shape and dtype of one example argument, or InvalidInput saying what to pass instead."""
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
        raise InvalidInput(f"example argument {i} is a {type(leaf).__name__}, not an array",
                           hint="pass arrays or jax.ShapeDtypeStruct; bind other arguments "
                                "with functools.partial")
    shape, dtype = tuple(int(d) for d in leaf.shape), np.dtype(leaf.dtype)
    if dtype.name not in _INPUT_DTYPES:
        raise InvalidInput(f"example argument {i} has dtype {dtype.name}",
                           hint="mugraph takes float16, bfloat16 or float32 tensors; cast it "
                                "(integer and boolean inputs are not supported)")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"example argument {i} has rank {len(shape)} (shape {list(shape)})",
                           hint=f"kernel tensors have 1 to {MAX_RANK} dims; reshape outside the "
                                "traced function")
    return shape, DType.parse(dtype.name)


def _key_name(key) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _default_names(fn, example_args, paths) -> list[str]:
    """Parameter names (plus pytree keys), or arg0, arg1, ... where the signature does not say."""
    fallback = [f"arg{i}" for i in range(len(paths))]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fallback
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(example_args) > len(positional):
        return fallback
    names = []
    for path in paths:
        parts = [positional[path[0].idx], *(_key_name(k) for k in path[1:])]
        names.append(re.sub(r"\W", "_", "_".join(parts)))
    return names if len(set(names)) == len(names) else fallback


def _check_names(names, count: int, what: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = [names]
    names = tuple(names)
    if len(names) != count or len(set(names)) != count or \
            not all(isinstance(n, str) and n for n in names):
        raise InvalidInput(f"{what} {list(names)!r}: need {count} unique non-empty strings")
    return names


def _output_node(value, var, index: int) -> KNode:
    """A graph output of exactly the jaxpr's shape (and its dtype where the IR can give it); a 0-d
    output (a mean loss) is a [1] tensor (`ir.origin.traced_outputs` gives it back its shape)."""
    shape, dtype = tuple(var.aval.shape), np.dtype(var.aval.dtype)
    if isinstance(value, Opaque):
        value = _table_of(value)
    if isinstance(value, Opaque):
        raise UnsupportedOp(f"output {index} is a constant array that is not uniform",
                            primitive="output", hint="pass it as an argument, or compute it "
                                                     "outside the traced function")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise UnsupportedOp(f"output {index} is a {dtype.name}{list(shape)} value mugraph cannot "
                            "produce", primitive="output", hint="return float tensors")
    if isinstance(value, Const):
        value = Const(value.value, value.dtype, shape or (1,))
    try:
        view = _as_view(value)
        node = _materialize(view) if shape else _arrange(view, (None,))
    except _Unsupported as e:
        raise UnsupportedOp(f"output {index}: {e.detail}", primitive="output",
                            hint=e.hint) from None
    return _cast(node, _ir_dtype(dtype))  # a mask or an index may still be wider than JAX's


def _trace(fn, example_args):
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*example_args)
    except MugraphError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InvalidInput(f"tracing {getattr(fn, '__name__', fn)!s} with jax.make_jaxpr failed: "
                           f"{type(e).__name__}: {first}",
                           hint="the function must trace with JAX on the example arguments; "
                                "see the chained exception for the full error") from e
    return closed, out_shape


def from_jax(fn, *example_args, input_names=None, output_names=None) -> KernelGraph:
    """Trace `fn(*example_args)` with jax.make_jaxpr and lift the jaxpr into a KernelGraph.

    `example_args`: arrays or jax.ShapeDtypeStruct (float16/bfloat16/float32, rank 1 to 4), or
    pytrees (dicts, tuples) of them; each leaf becomes one graph input, named after `fn`'s
    parameter (plus the pytree key) unless `input_names` says otherwise. The outputs are `fn`'s
    flat outputs (an array, or a tuple/dict of arrays), named by `output_names` if given.
    Float casts inside `fn` are CASTs (see the module docstring). Unsupported primitives raise
    UnsupportedOp naming the equation and source line; bad arguments raise InvalidInput.
    """
    if not callable(fn):
        raise InvalidInput(f"from_jax needs a function, got {type(fn).__name__}")
    leaves_with_paths, _ = jax.tree_util.tree_flatten_with_path(example_args)
    paths = [p for p, _ in leaves_with_paths]
    specs = [_arg_spec(i, leaf) for i, (_, leaf) in enumerate(leaves_with_paths)]
    names = _check_names(input_names, len(specs), "input_names") if input_names is not None \
        else _default_names(fn, example_args, paths)
    closed, out_shape = _trace(fn, example_args)
    inputs = [kernel_input(n, s or (1,), d) for n, (s, d) in zip(names, specs)]
    args = [_view(node, range(node.rank) if s else (None,), s)
            for node, (s, _) in zip(inputs, specs)]
    outs = lift_jaxpr(closed.jaxpr, closed.consts, args)
    nodes = [_output_node(v, var, i) for i, (v, var) in enumerate(zip(outs, closed.jaxpr.outvars))]
    if output_names is not None:
        output_names = _check_names(output_names, len(nodes), "output_names")
    else:
        output_names = _dict_output_names(out_shape, len(nodes))
    graph = KernelGraph(nodes, inputs=inputs, output_names=output_names)
    record_jax_origin(graph, fn, example_args,   # the float test compares with jax.jit(fn)
                      [v.aval.shape for v in closed.jaxpr.outvars])
    return graph


def _dict_output_names(out_shape, count: int):
    """Keys when `fn` returns a dict of arrays (else None: out0, out1, ...)."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]]
    if not paths or not all(p and all(hasattr(k, "key") for k in p) for p in paths):
        return None
    names = [re.sub(r"\W", "_", "_".join(_key_name(k) for k in p)) for p in paths]
    return names if len(set(names)) == count else None


# ---- hooks for programs of regions (search/classify.py) -----------------------------------------
# A program of regions lifts a function equation by equation (`lift_eqn`) and cuts it: a value
# computed outside a region enters it as a fresh input, and a value a region hands on leaves it
# as an output. A 0-d value crosses as a shape-(1,) tensor.
def boundary_view(name: str, shape, dtype) -> View | None:
    """A fresh graph input standing for a value computed elsewhere (float, rank 0 to 4), or None
    where no kernel tensor can hold it (integers, rank > 4). A boolean (a mask JAX computed from
    positions or lengths) enters as a float32 tensor of 0s and 1s, the front end's own form of a
    mask (SELECT takes c != 0); whoever feeds the kernel converts it (`boundary_array`)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    if len(shape) > MAX_RANK or (dtype.name not in _INPUT_DTYPES and dtype != np.bool_):
        return None
    node = kernel_input(name, shape or (1,), DType.parse("float32" if dtype == np.bool_ else dtype.name))
    if dtype == np.bool_:    # the mask as the front end makes one from a float: x != 0
        node = KNode(TOp.NE, (node, _const_node(0.0, node)))
    return _view(node, range(len(shape)), shape)


def boundary_input(view: View) -> KNode:
    """The kernel input under a `boundary_view` (a boolean's view is `input != 0`)."""
    node = view.node
    return node if node.op is KOp.INPUT else node.srcs[0]


def boundary_array(x, dtype):
    """The array a kernel input made by `boundary_view` for a value of `dtype` takes: a boolean
    as float32 0/1, anything else as it is (NumPy or JAX arrays alike)."""
    if np.dtype(dtype) != np.bool_:
        return x
    return x.astype(np.float32)


def literal_value(var) -> Const:
    """A jaxpr Literal as a lifted constant."""
    return _read({}, var)


def closed_value(array) -> Const | Opaque:
    """A closed-over array: a Const where it is uniform, else an Opaque value."""
    return _closed_const(array)


def exported_node(value, shape, dtype) -> KNode:
    """A lifted value as a tensor leaving its region: the jaxpr's shape (0-d as shape (1,)) and
    dtype. UnsupportedOp where no tensor can carry it (a mask, an index, rank > 4)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    try:
        if dtype.name not in _INPUT_DTYPES:
            raise _Unsupported(f"a {dtype.name} value cannot leave a kernel")
        if isinstance(value, Opaque):
            raise _Unsupported("a constant array that is not uniform cannot leave a kernel")
        if isinstance(value, Const):
            _check_constant(value.value)
            return kernel_constant(value.value, shape or (1,), _ir_dtype(dtype))
        node = _materialize(value) if shape else _arrange(value, (None,))
    except _Unsupported as e:
        raise UnsupportedOp(e.detail, primitive="output", hint=e.hint) from None
    return _cast(node, _ir_dtype(dtype))
