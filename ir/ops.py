"""The op enums of the three IR levels and their named groups.

The thread level (`TOp`) is the elementwise math that every level shares: a kernel node or a
block node whose op is a `TOp` applies it to whole tensors or tiles. `KOp` and `BOp` hold the
structural ops of the kernel and block levels. Each op's meaning lives in tables keyed by these
enums (`shapes.py`, `semantics.py`, and the verify/codegen columns).

Predicates are float masks: a comparison or IS_FINITE yields exactly 1.0 (true) or 0.0 (false)
in its operands' dtype, and SELECT(c, a, b) takes a where c != 0 and b elsewhere. A mask is a
value like any other (JAX's `mask.astype(x.dtype) * x` is a MUL, `and` a MUL, `not` a 1 - c),
so no boolean dtype runs through the dtype rules, the JSON schema, codegen and the cost model;
SELECT itself is a true select everywhere floats are computed (never c*a + (1-c)*b, which would
let a NaN or inf of the branch not taken leak into the result).

CAST(x, dtype) is the one op whose dtype is its argument, not its operands': JAX's
`convert_element_type` between float types. Its value in real arithmetic is x (the float64
interpreter, the finite field and abstract expressions read it as the identity); computing in
the graph's own dtypes (the interpreter's own mode, generated code) rounds x to `dtype` there.
"""
from __future__ import annotations

from enum import Enum


class TOp(Enum):
    """Elementwise ops: the thread level, usable on kernel tensors and block tiles alike."""

    EXP = "exp"
    LOG = "log"
    SQUARE = "square"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    SILU = "silu"
    GELU = "gelu"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    ERF = "erf"
    NEG = "neg"
    CLAMP = "clamp"  # arg: (lo, hi)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    ABS = "abs"
    LOG1P = "log1p"            # log(1 + x), accurate near 0
    EXPM1 = "expm1"            # exp(x) - 1, accurate near 0
    SOFTPLUS = "softplus"      # log(1 + exp(x)) = jax.nn.softplus = logaddexp(x, 0)
    LEAKY_RELU = "leaky_relu"  # (x, slope): x where x >= 0, else slope * x (a tensor slope: PReLU)
    GT = "gt"                  # comparisons: 1.0 where true, 0.0 where false (NaN: false, but ne)
    GE = "ge"
    LT = "lt"
    LE = "le"
    EQ = "eq"
    NE = "ne"
    IS_FINITE = "is_finite"    # 1.0 where x is neither inf nor NaN
    SELECT = "select"          # (c, a, b): a where c != 0, else b (jnp.where(c, a, b))
    CAST = "cast"              # arg: the target DType; x rounded to it (identity in real arithmetic)


class KOp(Enum):
    """Structural ops of the kernel level (tensors in device memory)."""

    INPUT = "input"            # arg: (name, shape, dtype)
    CONSTANT = "constant"      # arg: (value, shape, dtype); value may be +-inf or NaN
    IOTA = "iota"              # arg: (shape, dim, dtype): each element is its index along dim
    TABLE = "table"            # arg: (values, shape, dtype): a constant tensor of any values
    MATMUL = "matmul"          # [..., M, K] @ [..., K, N]
    REDUCE_SUM = "reduce_sum"  # arg: dim (keepdim)
    REDUCE_MAX = "reduce_max"  # arg: dim (keepdim)
    RMS_NORM = "rms_norm"      # arg: (dim, eps): x * rsqrt(mean(x^2, dim) + eps)
    CONCAT = "concat"          # arg: dim
    TRANSPOSE = "transpose"    # arg: perm; a layout op (strided or .trans load, never a copy)
    RESHAPE = "reshape"        # arg: shape; row-major: splits, merges, adds or drops dims
    SLICE = "slice"            # arg: (starts, limits); a static window, strides 1 (a view)
    BROADCAST = "broadcast"    # arg: shape; expands unit dims
    CUSTOM = "custom"          # arg: (BlockGraph, output index); a graph-defined kernel


class BOp(Enum):
    """Structural ops of the block level (tiles in shared memory or registers)."""

    INPUT = "input"            # arg: BlockInput (imap, fmap, the tensor it tiles)
    CONSTANT = "constant"      # arg: (value, shape, dtype)
    MATMUL = "matmul"
    REDUCE_SUM = "reduce_sum"  # arg: dim (keepdim)
    REDUCE_MAX = "reduce_max"  # arg: dim (keepdim)
    RMS_NORM = "rms_norm"      # arg: (dim, eps), over a dim the tile holds whole
    ACC_SUM = "acc_sum"                    # sum over loop iterations
    ACC_SUM_LAST = "acc_sum_last"          # ... and over the last dim (keepdim)
    ACC_RMS_LAST = "acc_rms_last"          # sqrt(mean of x^2 over iterations and last dim)
    ACC_MAX = "acc_max"                    # running elementwise max
    ACC_MAX_LAST = "acc_max_last"          # running max of the last dim's max
    ACC_SUM_RESCALE = "acc_sum_rescale"    # (x, m): acc = acc * exp(m_prev - m) + x
    ACC_SUM_LAST_RESCALE = "acc_sum_last_rescale"  # (x, m): ... + sum(x, last)
    THREAD = "thread"          # arg: TNode, a DAG of elementwise ops over the operands (ir/thread.py)


UNARY = frozenset({TOp.EXP, TOp.LOG, TOp.SQUARE, TOp.SQRT, TOp.RSQRT, TOp.SILU, TOp.GELU,
                   TOp.RELU, TOp.SIGMOID, TOp.TANH, TOp.ERF, TOp.NEG, TOp.CLAMP, TOp.ABS,
                   TOp.LOG1P, TOp.EXPM1, TOp.SOFTPLUS, TOp.IS_FINITE, TOp.CAST})
BINARY = frozenset({TOp.ADD, TOp.SUB, TOp.MUL, TOp.DIV, TOp.POW, TOp.MAX, TOp.MIN,
                    TOp.LEAKY_RELU, TOp.GT, TOp.GE, TOp.LT, TOp.LE, TOp.EQ, TOp.NE})
TERNARY = frozenset({TOp.SELECT})
COMMUTATIVE = frozenset({TOp.ADD, TOp.MUL, TOp.MAX, TOp.MIN, TOp.EQ, TOp.NE})
PARAMETRIC = frozenset({TOp.CLAMP, TOp.CAST})
ARITY = {op: 1 for op in UNARY} | {op: 2 for op in BINARY} | {op: 3 for op in TERNARY}
COMPARISONS = frozenset({TOp.GT, TOp.GE, TOp.LT, TOp.LE, TOp.EQ, TOp.NE})
PREDICATES = COMPARISONS | {TOp.IS_FINITE}   # ops whose values are 0/1 masks

KERNEL_REDUCE = frozenset({KOp.REDUCE_SUM, KOp.REDUCE_MAX})
KERNEL_LAYOUT = frozenset({KOp.TRANSPOSE, KOp.RESHAPE, KOp.BROADCAST, KOp.SLICE})
KERNEL_LEAF = frozenset({KOp.INPUT, KOp.CONSTANT, KOp.IOTA, KOp.TABLE})

BLOCK_REDUCE = frozenset({BOp.REDUCE_SUM, BOp.REDUCE_MAX})
BLOCK_LEAF = frozenset({BOp.INPUT, BOp.CONSTANT})
ACCUMULATORS = frozenset({BOp.ACC_SUM, BOp.ACC_SUM_LAST, BOp.ACC_RMS_LAST, BOp.ACC_MAX,
                          BOp.ACC_MAX_LAST, BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE})
RUNNING_ACCUMULATORS = frozenset({BOp.ACC_MAX, BOp.ACC_MAX_LAST})  # readable inside the loop
RESCALE_ACCUMULATORS = frozenset({BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE})
LAST_DIM_ACCUMULATORS = frozenset({BOp.ACC_SUM_LAST, BOp.ACC_RMS_LAST, BOp.ACC_MAX_LAST,
                                   BOp.ACC_SUM_LAST_RESCALE})

KernelOpT = KOp | TOp
BlockOpT = BOp | TOp


_MASK_PRESERVING = frozenset({TOp.MUL, TOp.MAX, TOp.MIN})   # and, or, and of 0/1 masks


def is_mask(node, leaf=lambda n: False) -> bool:
    """Whether `node` (a kernel or block node) is a 0/1 mask by construction: a comparison or
    IS_FINITE, and/or/not of masks (MUL/MAX/MIN of masks, 1 - mask), a select between masks.
    `leaf(node)` answers for leaves (e.g. a block input tiling a mask). The enumerators take
    SELECT predicates from masks only: any float can be one, but a spec's never is anything else.
    """
    op = node.op
    if op in PREDICATES:
        return True
    if op in (KOp.CONSTANT, BOp.CONSTANT):
        return node.arg[0] in (0.0, 1.0)
    if op is KOp.TABLE:
        return node.arg[0].is_mask
    if op in _MASK_PRESERVING:
        return all(is_mask(s, leaf) for s in node.srcs)
    if op is TOp.SUB:
        first = node.srcs[0]
        return first.op in (KOp.CONSTANT, BOp.CONSTANT) and first.arg[0] == 1.0 and \
            is_mask(node.srcs[1], leaf)
    if op is TOp.SELECT:
        return is_mask(node.srcs[1], leaf) and is_mask(node.srcs[2], leaf)
    return not node.srcs and leaf(node)


def op_by_name(name: str, level: str):
    """The op called `name` at `level` ("kernel" or "block"), or None: used by the JSON reader."""
    structural = KOp if level == "kernel" else BOp
    for enum in (structural, TOp):
        try:
            return enum(name)
        except ValueError:
            continue
    return None
