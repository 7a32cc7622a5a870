"""The op enums of the three IR levels and their named groups.

The thread level (`TOp`) is the elementwise math that every level shares: a kernel node or a
block node whose op is a `TOp` applies it to whole tensors or tiles. `KOp` and `BOp` hold the
structural ops of the kernel and block levels. Each op's meaning lives in tables keyed by these
enums (`shapes.py`, `semantics.py`, and the verify/codegen columns).
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


class KOp(Enum):
    """Structural ops of the kernel level (tensors in device memory)."""

    INPUT = "input"            # arg: (name, shape, dtype)
    CONSTANT = "constant"      # arg: (value, shape, dtype)
    MATMUL = "matmul"          # [..., M, K] @ [..., K, N]
    REDUCE_SUM = "reduce_sum"  # arg: dim (keepdim)
    REDUCE_MAX = "reduce_max"  # arg: dim (keepdim)
    RMS_NORM = "rms_norm"      # arg: (dim, eps): x * rsqrt(mean(x^2, dim) + eps)
    CONCAT = "concat"          # arg: dim
    TRANSPOSE = "transpose"    # arg: perm; a layout op (strided or .trans load, never a copy)
    RESHAPE = "reshape"        # arg: shape; adds or drops unit dims only
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
                   TOp.RELU, TOp.SIGMOID, TOp.TANH, TOp.ERF, TOp.NEG, TOp.CLAMP})
BINARY = frozenset({TOp.ADD, TOp.SUB, TOp.MUL, TOp.DIV, TOp.POW, TOp.MAX, TOp.MIN})
COMMUTATIVE = frozenset({TOp.ADD, TOp.MUL, TOp.MAX, TOp.MIN})
PARAMETRIC = frozenset({TOp.CLAMP})

KERNEL_REDUCE = frozenset({KOp.REDUCE_SUM, KOp.REDUCE_MAX})
KERNEL_LAYOUT = frozenset({KOp.TRANSPOSE, KOp.RESHAPE, KOp.BROADCAST})
KERNEL_LEAF = frozenset({KOp.INPUT, KOp.CONSTANT})

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


def op_by_name(name: str, level: str):
    """The op called `name` at `level` ("kernel" or "block"), or None: used by the JSON reader."""
    structural = KOp if level == "kernel" else BOp
    for enum in (structural, TOp):
        try:
            return enum(name)
        except ValueError:
            continue
    return None
