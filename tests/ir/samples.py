"""One small, valid graph per op of every level, for tests that must cover every op."""
from __future__ import annotations

import numpy as np

from mugraph import ir
from mugraph.ir import BNode, BOp, KNode, KOp, KernelGraph, TOp
from mugraph.ir import thread
from mugraph.ir.ops import BINARY, TERNARY

F16 = "float16"


def _clamp_arg(op):
    """The argument of a sample of a parametric op (clamp's bounds, a cast's dtype)."""
    return (-1.0, 1.0) if op is TOp.CLAMP else ir.DType.BFLOAT16 if op is TOp.CAST else None


def kernel_sample(op) -> KernelGraph:
    """A kernel graph whose last output is a node of `op` (a KOp or TOp)."""
    x = ir.input("X", (2, 3, 4), F16)
    y = ir.input("Y", (2, 4, 3), F16)
    build = {
        KOp.INPUT: lambda: x,
        KOp.CONSTANT: lambda: x * ir.constant(1.5, (1, 1, 4)),
        KOp.IOTA: lambda: x * ir.iota((1, 3, 1), 1),
        KOp.TABLE: lambda: x * ir.table(np.linspace(-1.0, 1.0, 12).reshape(3, 4), F16),
        KOp.MATMUL: lambda: x @ y,
        KOp.REDUCE_SUM: lambda: x.sum(1),
        KOp.REDUCE_MAX: lambda: x.amax(2),
        KOp.RMS_NORM: lambda: x.rms_norm(-1, 1e-5),
        KOp.CONCAT: lambda: ir.concat([x, y.transpose((0, 2, 1))], 0),
        KOp.TRANSPOSE: lambda: x.transpose((2, 0, 1)),
        KOp.RESHAPE: lambda: (x + 1.0).reshape((2, 12)).reshape((2, 3, 2, 2)),
        KOp.SLICE: lambda: (x + 1.0).slice((0, 1, 2), (2, 3, 4)),
        KOp.BROADCAST: lambda: x.sum(1).broadcast_to((2, 5, 4)),
        KOp.CUSTOM: lambda: _custom_node(x, y),
    }
    if isinstance(op, TOp):
        pos = x * x + 1.0  # inside every op's domain
        node = KNode(op, _operands(op, pos, x.amax(0)), _clamp_arg(op))
    else:
        node = build[op]()
    return KernelGraph([node])


def _operands(op, x, y) -> tuple:
    """Operands of an elementwise sample: a select picks by a mask comparing them."""
    if op in TERNARY:
        return (x.gt(y), x, y)
    return (x, y) if op in BINARY else (x,)


def _custom_node(x, y) -> KNode:
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    tx = b.input(x, imap=(0,), fmap=2)
    ty = b.input(y, imap=(0,), fmap=1)
    (out,) = b.finish([((tx @ ty).acc_sum(), (0,))])
    return out


def _gelu_like() -> thread.TNode:
    """p0 * (0.5 + tanh(p0 * 0.8 + p1)): a thread graph that reads p0 twice."""
    T, p0 = thread.TNode, thread.param(0)
    inner = T(TOp.ADD, (T(TOp.MUL, (p0, thread.const(0.8))), thread.param(1)))
    return T(TOp.MUL, (p0, T(TOp.ADD, (thread.const(0.5), T(TOp.TANH, (inner,))))))


def block_sample(op) -> KernelGraph:
    """A kernel graph with one custom op whose block graph has a node of `op` (a BOp or TOp)."""
    x = ir.input("X", (4, 8), F16)
    w = ir.input("W", (8, 4), F16)
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    tx = b.input(x, fmap=1)          # [4, 4] per iteration
    tw = b.input(w, fmap=0)          # [4, 4] per iteration
    positive = (tx * tx) + 1.0
    build = {
        BOp.INPUT: lambda: (tx + tw).acc_sum(),
        BOp.CONSTANT: lambda: (tx * b.constant(2.0, (1, 4)) + tw).acc_sum(),
        BOp.MATMUL: lambda: (tx @ tw).acc_sum(),
        BOp.REDUCE_SUM: lambda: (tx.sum(1) + tw.sum(0)).acc_sum(),
        BOp.REDUCE_MAX: lambda: (tx.amax(0) + tw.amax(1)).acc_max(),
        BOp.RMS_NORM: lambda: (tx.rms_norm(1, 1e-6) + tw).acc_sum(),
        BOp.ACC_SUM: lambda: (tx @ tw).acc_sum(),
        BOp.ACC_SUM_LAST: lambda: (tx @ tw).acc_sum_last() + tw.acc_sum_last(),
        BOp.ACC_RMS_LAST: lambda: tx.acc_rms_last() * tw.acc_rms_last(),
        BOp.ACC_MAX: lambda: (tx + tw).acc_max(),
        BOp.ACC_MAX_LAST: lambda: tx.acc_max_last() + tw.acc_max_last(),
        BOp.ACC_SUM_RESCALE: lambda: _online(tx, tw, last=False),
        BOp.ACC_SUM_LAST_RESCALE: lambda: _online(tx, tw, last=True),
        BOp.THREAD: lambda: thread.apply(_gelu_like(), tx, tw.sum(0)).acc_sum(),
    }
    if isinstance(op, TOp):
        value = BNode(op, _operands(op, positive, tw), _clamp_arg(op))
        value = value if op in BINARY or op in TERNARY else value * tw
        tile = value.acc_sum()
    else:
        tile = build[op]()
    (out,) = b.finish([(tile, None)])
    return KernelGraph([out])


def _online(tx, tw, last: bool):
    m = tx.acc_max_last()
    p = (tx - m).exp()
    return p.acc_sum_last_rescale(m) * tw.acc_sum_last() if last else (p @ tw).acc_sum_rescale(m)


def all_samples():
    """(op, level, graph) for every op: kernel level (KOp + TOp), block level (BOp + TOp)."""
    kernel = [(op, "kernel", kernel_sample(op)) for op in [*KOp, *TOp]]
    block = [(op, "block", block_sample(op)) for op in [*BOp, *TOp]]
    return kernel + block


def ops_in(graph: KernelGraph) -> set:
    """Every op of the graph, including those inside its block graphs."""
    found = {n.op for n in graph.nodes}
    for bg, _ in graph.custom_ops():
        found |= {n.op for n in bg.nodes}
    return found
