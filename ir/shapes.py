"""Shape and dtype rules, one small function per op, in tables keyed by op.

A rule takes the sources (anything with `.shape` and `.dtype`) and the op's argument, and returns
`(shape, dtype)` or raises `ShapeError` naming the operands and the fix.
"""
from __future__ import annotations

import math

from mugraph.ir.dtypes import DType, promote
from mugraph.ir.errors import InvalidGraph, ShapeError
from mugraph.ir.ops import BINARY, BOp, KOp, TERNARY, TOp, UNARY

MAX_RANK = 4


def _fmt(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def check_shape(shape, what: str) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not 1 <= len(shape) <= MAX_RANK or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise ShapeError(f"{what} has shape {shape!r}",
                         hint=f"shapes are tuples of 1 to {MAX_RANK} positive ints")
    return shape


def _arity(op, srcs, n: int) -> None:
    if len(srcs) != n:
        raise InvalidGraph(f"{op.value} takes {n} operand(s), got {len(srcs)}")


def _check_dim(op, node, dim) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < len(node.shape):
        raise ShapeError(f"{op.value} over dim {dim!r} of a rank-{len(node.shape)} tensor "
                         f"{_fmt(node.shape)}", hint="dims are counted from 0 (negative dims are "
                                                      "normalised by the builder)")
    return dim


def broadcast(op, a, b) -> tuple[int, ...]:
    """NumPy broadcasting of two shapes (aligned at the right)."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ShapeError(f"{op.value} of {_fmt(a)} and {_fmt(b)}: dim -{i} is {x} vs {y}",
                             hint="operands must be equal or 1 in every dim (NumPy broadcasting)")
        out.append(max(x, y))
    return tuple(reversed(out))


# ---- elementwise (every level) -------------------------------------------------------------------
def _unary(op, srcs, arg):
    _arity(op, srcs, 1)
    if op is TOp.CAST:
        return srcs[0].shape, _cast_target(arg)
    if op is TOp.CLAMP:
        if not (isinstance(arg, tuple) and len(arg) == 2 and all(isinstance(v, float) for v in arg)
                and arg[0] <= arg[1]):
            raise InvalidGraph(f"clamp needs (lo, hi) with lo <= hi, got {arg!r}")
    elif arg is not None:
        raise InvalidGraph(f"{op.value} takes no argument, got {arg!r}")
    return srcs[0].shape, srcs[0].dtype


def _cast_target(arg) -> DType:
    if not isinstance(arg, DType):
        raise InvalidGraph(f"cast needs a target DType, got {arg!r}",
                           hint="cast to DType.FLOAT16, DType.BFLOAT16 or DType.FLOAT32")
    return arg


def _no_arg(op, arg):
    if arg is not None:
        raise InvalidGraph(f"{op.value} takes no argument, got {arg!r}")


def _binary(op, srcs, arg):
    _arity(op, srcs, 2)
    _no_arg(op, arg)
    return broadcast(op, srcs[0].shape, srcs[1].shape), promote(srcs[0].dtype, srcs[1].dtype)


def _select(op, srcs, arg):
    """select(c, a, b): the three shapes broadcast; the dtype is the branches' (c is a mask)."""
    _arity(op, srcs, 3)
    _no_arg(op, arg)
    c, a, b = srcs
    return broadcast(op, c.shape, broadcast(op, a.shape, b.shape)), promote(a.dtype, b.dtype)


ELEMENTWISE_SHAPE = {op: _unary for op in UNARY} | {op: _binary for op in BINARY} | \
    {op: _select for op in TERNARY}


# ---- leaves, matmul, reductions (both levels) -----------------------------------------------------
def _constant(op, srcs, arg):
    _arity(op, srcs, 0)
    if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], float)
            and isinstance(arg[2], DType)):
        raise InvalidGraph(f"constant needs (value, shape, dtype), got {arg!r}")
    if arg[0] != arg[0]:  # NaN: equal to nothing, it would defeat interning and caches
        raise InvalidGraph("constant value nan is not allowed",
                           hint="constants are floats or +-inf; NaN is no value to compute with")
    return check_shape(arg[1], "constant"), arg[2]


def _matmul_shape(op, a, b) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul of {_fmt(a)} and {_fmt(b)}: both operands need rank >= 2",
                         hint="add a unit dim with reshape")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul of {_fmt(a)} @ {_fmt(b)}: inner dims {a[-1]} and {b[-2]} differ",
                         hint="the operands are [..., M, K] @ [..., K, N]; transpose one of them?")
    batch = broadcast(op, a[:-2], b[:-2]) if (a[:-2] or b[:-2]) else ()
    return batch + (a[-2], b[-1])


def _kernel_matmul(op, srcs, arg):
    _arity(op, srcs, 2)
    return _matmul_shape(op, srcs[0].shape, srcs[1].shape), promote(srcs[0].dtype, srcs[1].dtype)


def _reduce(op, srcs, arg):
    _arity(op, srcs, 1)
    dim = _check_dim(op, srcs[0], arg)
    shape = list(srcs[0].shape)
    shape[dim] = 1
    return tuple(shape), srcs[0].dtype


def _rms_norm(op, srcs, arg):
    _arity(op, srcs, 1)
    if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[1], float) and arg[1] >= 0):
        raise InvalidGraph(f"rms_norm needs (dim, eps >= 0), got {arg!r}")
    _check_dim(op, srcs[0], arg[0])
    return srcs[0].shape, srcs[0].dtype


# ---- kernel-only ---------------------------------------------------------------------------------
def _input(op, srcs, arg):
    _arity(op, srcs, 0)
    if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str) and arg[0]
            and isinstance(arg[2], DType)):
        raise InvalidGraph(f"input needs (name, shape, dtype), got {arg!r}")
    return check_shape(arg[1], f"input {arg[0]!r}"), arg[2]


# The largest extent whose indices a dtype holds exactly (2^(mantissa bits + 1)).
EXACT_INTEGERS = {DType.FLOAT32: 1 << 24, DType.FLOAT16: 1 << 11, DType.BFLOAT16: 1 << 8}


def _iota(op, srcs, arg):
    _arity(op, srcs, 0)
    if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[2], DType)):
        raise InvalidGraph(f"iota needs (shape, dim, dtype), got {arg!r}")
    shape = check_shape(arg[0], "iota")
    dim = arg[1]
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < len(shape):
        raise ShapeError(f"iota along dim {dim!r} of shape {_fmt(shape)}",
                         hint="dims are counted from 0")
    if shape[dim] > EXACT_INTEGERS[arg[2]]:
        raise ShapeError(f"iota of extent {shape[dim]} in {arg[2].value}: indices above "
                         f"{EXACT_INTEGERS[arg[2]]} are not exact in that dtype",
                         hint="use a float32 iota")
    return shape, arg[2]


def _table(op, srcs, arg):
    from mugraph.ir.table_values import TableValues
    _arity(op, srcs, 0)
    if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], TableValues)
            and isinstance(arg[2], DType)):
        raise InvalidGraph(f"table needs (TableValues, shape, dtype), got {arg!r}")
    shape = check_shape(arg[1], "table")
    if len(arg[0]) != math.prod(shape):
        raise ShapeError(f"a table of {len(arg[0])} values has shape {_fmt(shape)}")
    return shape, arg[2]


def _concat(op, srcs, arg):
    if len(srcs) < 2:
        raise InvalidGraph(f"concat needs at least 2 operands, got {len(srcs)}")
    dim = _check_dim(op, srcs[0], arg)
    first = srcs[0].shape
    for s in srcs[1:]:
        if len(s.shape) != len(first) or any(x != y for i, (x, y) in enumerate(zip(s.shape, first))
                                             if i != dim):
            raise ShapeError(f"concat along dim {dim} of {_fmt(first)} and {_fmt(s.shape)}",
                             hint="all operands must agree except in the concatenated dim")
    shape = list(first)
    shape[dim] = sum(s.shape[dim] for s in srcs)
    dtype = srcs[0].dtype
    for s in srcs[1:]:
        dtype = promote(dtype, s.dtype)
    return tuple(shape), dtype


def _transpose(op, srcs, arg):
    _arity(op, srcs, 1)
    shape = srcs[0].shape
    if not isinstance(arg, tuple) or sorted(arg) != list(range(len(shape))):
        raise ShapeError(f"transpose of {_fmt(shape)} with perm {arg!r}",
                         hint=f"perm must be a permutation of 0..{len(shape) - 1}")
    return tuple(shape[p] for p in arg), srcs[0].dtype


def _reshape(op, srcs, arg):
    """A row-major reshape: any shape with the same number of elements."""
    _arity(op, srcs, 1)
    new = check_shape(arg, "reshape target")
    if math.prod(new) != math.prod(srcs[0].shape):
        raise ShapeError(f"reshape of {_fmt(srcs[0].shape)} ({math.prod(srcs[0].shape)} "
                         f"elements) to {_fmt(new)} ({math.prod(new)} elements)",
                         hint="a reshape keeps the number of elements")
    return new, srcs[0].dtype


def _slice(op, srcs, arg):
    """x[starts[0]:limits[0], ...]: a static window with strides 1, every dim given."""
    _arity(op, srcs, 1)
    shape = srcs[0].shape
    if not (isinstance(arg, tuple) and len(arg) == 2 and all(
            isinstance(a, tuple) and len(a) == len(shape) and
            all(isinstance(v, int) and not isinstance(v, bool) for v in a) for a in arg)):
        raise InvalidGraph(f"slice of {_fmt(shape)} needs (starts, limits), one int per dim, "
                           f"got {arg!r}")
    starts, limits = arg
    if not all(0 <= a < b <= n for a, b, n in zip(starts, limits, shape)):
        raise ShapeError(f"slice [{', '.join(f'{a}:{b}' for a, b in zip(starts, limits))}] of "
                         f"{_fmt(shape)}", hint="each window must be non-empty and inside its dim")
    return tuple(b - a for a, b in zip(starts, limits)), srcs[0].dtype


def _broadcast(op, srcs, arg):
    _arity(op, srcs, 1)
    new = check_shape(arg, "broadcast target")
    old = srcs[0].shape
    if len(old) != len(new) or any(o != n and o != 1 for o, n in zip(old, new)):
        raise ShapeError(f"broadcast of {_fmt(old)} to {_fmt(new)}",
                         hint="broadcast keeps the rank and expands only unit dims")
    return new, srcs[0].dtype


def _custom(op, srcs, arg):
    from mugraph.ir.block import BlockGraph
    if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], BlockGraph)
            and isinstance(arg[1], int) and not isinstance(arg[1], bool)):
        raise InvalidGraph(f"custom needs (BlockGraph, output index), got {arg!r}")
    graph = arg[0]
    if not 0 <= arg[1] < len(graph.outputs):
        raise InvalidGraph(f"custom output index {arg[1]} is out of range: its block graph has "
                           f"{len(graph.outputs)} output(s)")
    _arity(op, srcs, len(graph.inputs))
    for i, (src, bin_) in enumerate(zip(srcs, graph.inputs)):
        spec = bin_.arg
        if src.shape != spec.shape or src.dtype is not spec.dtype:
            raise ShapeError(f"custom op input {i} is {src.dtype.short}{_fmt(src.shape)} but its "
                             f"block graph expects {spec.dtype.short}{_fmt(spec.shape)}",
                             hint="pass the tensors the block graph was built for, in order")
    out = graph.outputs[arg[1]]
    return out.shape, out.dtype


KERNEL_SHAPE = {
    KOp.INPUT: _input, KOp.CONSTANT: _constant, KOp.IOTA: _iota, KOp.TABLE: _table,
    KOp.MATMUL: _kernel_matmul,
    KOp.REDUCE_SUM: _reduce, KOp.REDUCE_MAX: _reduce, KOp.RMS_NORM: _rms_norm,
    KOp.CONCAT: _concat, KOp.TRANSPOSE: _transpose, KOp.RESHAPE: _reshape,
    KOp.BROADCAST: _broadcast, KOp.SLICE: _slice, KOp.CUSTOM: _custom,
} | ELEMENTWISE_SHAPE


# ---- block-only ----------------------------------------------------------------------------------
def _block_input(op, srcs, arg):
    from mugraph.ir.block import BlockInput
    _arity(op, srcs, 0)
    if not isinstance(arg, BlockInput):
        raise InvalidGraph(f"a block input needs a BlockInput argument, got {arg!r}")
    return arg.tile_shape, arg.dtype


def _mma_dtype(a: DType, b: DType) -> DType:
    low = {d for d in (a, b) if d.is_16bit}
    if len(low) > 1:
        raise ShapeError(f"block matmul mixes {a.value} and {b.value}",
                         hint="tensor-core MMA takes one 16-bit type; cast an operand first")
    return low.pop() if low else DType.FLOAT32


def _block_matmul(op, srcs, arg):
    _arity(op, srcs, 2)
    _mma_dtype(srcs[0].dtype, srcs[1].dtype)
    return _matmul_shape(op, srcs[0].shape, srcs[1].shape), DType.FLOAT32


def _f32(rule):
    """Block values other than input tiles live in fp32 registers (a cast's value is rounded
    to its target dtype, and keeps it: a tile cast to fp16 feeds a 16-bit MMA)."""
    def wrapped(op, srcs, arg):
        shape, dtype = rule(op, srcs, arg)
        return shape, dtype if op is TOp.CAST else DType.FLOAT32
    return wrapped


def _accumulate(op, srcs, arg):
    _arity(op, srcs, 1)
    if arg is not None:
        raise InvalidGraph(f"{op.value} takes no argument, got {arg!r}")
    shape = srcs[0].shape
    if op in (BOp.ACC_SUM_LAST, BOp.ACC_RMS_LAST, BOp.ACC_MAX_LAST):
        shape = shape[:-1] + (1,)
    return shape, DType.FLOAT32


def _rescale(op, srcs, arg):
    from mugraph.ir.ops import RUNNING_ACCUMULATORS
    _arity(op, srcs, 2)
    x, m = srcs
    if m.op not in RUNNING_ACCUMULATORS:
        raise InvalidGraph(f"{op.value} rescales by a running max, but its second operand is "
                           f"{m.op.value}", hint="pass the acc_max / acc_max_last node")
    shape = x.shape if op is BOp.ACC_SUM_RESCALE else x.shape[:-1] + (1,)
    if broadcast(op, shape, m.shape) != shape:
        raise ShapeError(f"{op.value}: running max {_fmt(m.shape)} does not broadcast to the "
                         f"accumulator {_fmt(shape)}")
    return shape, DType.FLOAT32


BLOCK_SHAPE = {
    BOp.INPUT: _block_input, BOp.CONSTANT: _constant, BOp.MATMUL: _block_matmul,
    BOp.REDUCE_SUM: _f32(_reduce), BOp.REDUCE_MAX: _f32(_reduce), BOp.RMS_NORM: _f32(_rms_norm),
    BOp.ACC_SUM: _accumulate, BOp.ACC_SUM_LAST: _accumulate, BOp.ACC_RMS_LAST: _accumulate,
    BOp.ACC_MAX: _accumulate, BOp.ACC_MAX_LAST: _accumulate,
    BOp.ACC_SUM_RESCALE: _rescale, BOp.ACC_SUM_LAST_RESCALE: _rescale,
    BOp.THREAD: lambda op, srcs, arg: _thread_shape(op, srcs, arg),
} | {op: _f32(rule) for op, rule in ELEMENTWISE_SHAPE.items()}


def _thread_shape(op, srcs, arg):
    from mugraph.ir.thread import thread_shape
    return thread_shape(op, srcs, arg)


def infer_kernel(op, srcs, arg):
    rule = KERNEL_SHAPE.get(op)
    if rule is None:
        raise InvalidGraph(f"{op!r} is not a kernel-level op")
    return rule(op, srcs, arg)


def infer_block(op, srcs, arg):
    rule = BLOCK_SHAPE.get(op)
    if rule is None:
        raise InvalidGraph(f"{op!r} is not a block-level op")
    return rule(op, srcs, arg)


mma_dtype = _mma_dtype
