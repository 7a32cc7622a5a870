"""The abstract-expression column of the op tables: IR nodes (kernel and block level) to `Expr`s.

Layout ops (transpose, reshape, broadcast, slice) are identities: the abstraction forgets indices.
Concat is an opaque, ordered function of its parts. A kernel matmul with inner size K is
sum(K, a*b); a custom op is its block graph's output expression under the real tiling: an input
tile is its kernel tensor's expression, a block matmul over a K-tile of k is sum(k, a*b), and an
accumulator over F iterations is a reduction of F (times the last dim for the *_LAST forms), so
sum(F, sum(K/F, x)) meets the spec's sum(K, x) by the sum-merging law.
"""
from __future__ import annotations

import weakref
from typing import Sequence

from mugraph.ir.block import BlockGraph
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import BNode, KNode, toposort
from mugraph.ir.thread import evaluate
from mugraph.ir.ops import (ACCUMULATORS, BOp, KOp, LAST_DIM_ACCUMULATORS, RESCALE_ACCUMULATORS,
                            RUNNING_ACCUMULATORS, TOp)
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.expr import Expr, Fn

# ---- thread level: elementwise ops (shared by kernel and block nodes) ----------------------------
TOP_LOWER = {
    TOp.EXP: lambda a, arg: E.exp(a[0]),
    TOp.LOG: lambda a, arg: E.fn(Fn.LOG, a[0]),
    TOp.SQUARE: lambda a, arg: E.mul(a[0], a[0]),
    TOp.SQRT: lambda a, arg: E.sqrt(a[0]),
    TOp.RSQRT: lambda a, arg: E.inv(E.sqrt(a[0])),
    TOp.SILU: lambda a, arg: E.mul(a[0], E.fn(Fn.SIGMOID, a[0])),   # as JAX writes it
    TOp.GELU: lambda a, arg: E.fn(Fn.GELU, a[0]),                  # erf and tanh forms differ
    TOp.RELU: lambda a, arg: E.maximum(a[0], E.const(0)),          # as JAX writes it
    TOp.SIGMOID: lambda a, arg: E.fn(Fn.SIGMOID, a[0]),
    TOp.TANH: lambda a, arg: E.fn(Fn.TANH, a[0]),
    TOp.ERF: lambda a, arg: E.fn(Fn.ERF, a[0]),
    TOp.NEG: lambda a, arg: E.neg(a[0]),
    TOp.CLAMP: lambda a, arg: E.minimum(E.maximum(a[0], E.const(arg[0])), E.const(arg[1])),
    TOp.ADD: lambda a, arg: E.add(a[0], a[1]),
    TOp.SUB: lambda a, arg: E.sub(a[0], a[1]),
    TOp.MUL: lambda a, arg: E.mul(a[0], a[1]),
    TOp.DIV: lambda a, arg: E.div(a[0], a[1]),
    TOp.POW: lambda a, arg: E.power(a[0], a[1]),
    TOp.MAX: lambda a, arg: E.maximum(a[0], a[1]),
    TOp.MIN: lambda a, arg: E.minimum(a[0], a[1]),
    TOp.ABS: lambda a, arg: E.maximum(a[0], E.neg(a[0])),                      # as JAX writes it
    TOp.LOG1P: lambda a, arg: E.fn(Fn.LOG, E.add(E.const(1), a[0])),
    TOp.EXPM1: lambda a, arg: E.sub(E.exp(a[0]), E.const(1)),
    TOp.SOFTPLUS: lambda a, arg: E.fn(Fn.LOG, E.add(E.const(1), E.exp(a[0]))),
    TOp.LEAKY_RELU: lambda a, arg: E.fn(Fn.LEAKY_RELU, a[0], a[1]),
    TOp.GT: lambda a, arg: E.fn(Fn.GT, a[0], a[1]),
    TOp.LT: lambda a, arg: E.fn(Fn.GT, a[1], a[0]),
    TOp.GE: lambda a, arg: E.sub(E.const(1), E.fn(Fn.GT, a[1], a[0])),
    TOp.LE: lambda a, arg: E.sub(E.const(1), E.fn(Fn.GT, a[0], a[1])),
    TOp.EQ: lambda a, arg: E.fn(Fn.EQ, a[0], a[1]),
    TOp.NE: lambda a, arg: E.sub(E.const(1), E.fn(Fn.EQ, a[0], a[1])),
    TOp.IS_FINITE: lambda a, arg: E.fn(Fn.IS_FINITE, a[0]),
    TOp.SELECT: lambda a, arg: E.fn(Fn.SELECT, a[0], a[1], a[2]),
    TOp.CAST: lambda a, arg: a[0],   # real arithmetic: a rounding changes no value (prove.py)
}


def rms_norm(x: Expr, n: int, eps: float) -> Expr:
    """x * rsqrt(sum(n, x*x)/n + eps): the form JAX's `x * rsqrt(mean(x*x) + eps)` lifts to."""
    mean = E.div(E.reduce_sum(n, E.mul(x, x)), E.const(n))
    return E.mul(x, E.inv(E.sqrt(E.add(mean, E.const(eps)))))


def _matmul(node, a) -> Expr:
    return E.reduce_sum(node.srcs[0].shape[-1], E.mul(a[0], a[1]))


def _reduce(head):
    return lambda node, a, *_: head(node.srcs[0].shape[node.arg], a[0])


def _rms(node, a, *_) -> Expr:
    dim, eps = node.arg
    return rms_norm(a[0], node.srcs[0].shape[dim], eps)


# ---- kernel level ------------------------------------------------------------------------------------
def _kernel_input(node: KNode, a) -> Expr:
    name, shape, _ = node.arg
    return E.var(name, shape)


def _custom(node: KNode, a) -> Expr:
    graph, index = node.arg
    return block_expressions(graph, a)[graph.outputs[index].node]


def _iota(node: KNode, a) -> Expr:
    """An index tensor is a leaf of its own, one per (shape, dim); '%' keeps it apart from
    the inputs the JAX front end names (identifiers)."""
    shape, dim, _ = node.arg
    return E.var(f"%iota{dim}", shape)


def _table(node: KNode, a) -> Expr:
    """A table is a leaf of its own, named by its content."""
    return E.var(f"%table{node.arg[0].digest}", node.shape)


KERNEL_LOWER = {
    KOp.INPUT: _kernel_input,
    KOp.TABLE: _table,
    KOp.CONSTANT: lambda node, a: E.const(node.arg[0]),
    KOp.IOTA: _iota,
    KOp.MATMUL: _matmul,
    KOp.REDUCE_SUM: _reduce(E.reduce_sum),
    KOp.REDUCE_MAX: _reduce(E.reduce_max),
    KOp.RMS_NORM: _rms,
    KOp.CONCAT: lambda node, a: E.concat(*a),
    KOp.TRANSPOSE: lambda node, a: a[0],
    KOp.RESHAPE: lambda node, a: a[0],
    KOp.BROADCAST: lambda node, a: a[0],
    KOp.SLICE: lambda node, a: a[0],
    KOp.CUSTOM: _custom,
}


# ---- block level ----------------------------------------------------------------------------------------
def _accumulated(node: BNode, forloop: int) -> int:
    """How many elements an accumulator combines: F iterations, times the last dim for *_LAST."""
    last = node.srcs[0].shape[-1] if node.op in LAST_DIM_ACCUMULATORS else 1
    return forloop * last


def _sum_acc(node, a, forloop):
    return E.reduce_sum(_accumulated(node, forloop), a[0])


def _max_acc(node, a, forloop):
    return E.reduce_max(_accumulated(node, forloop), a[0])


def _rms_acc(node, a, forloop):
    n = _accumulated(node, forloop)
    return E.sqrt(E.div(E.reduce_sum(n, E.mul(a[0], a[0])), E.const(n)))


BLOCK_LOWER = {
    BOp.INPUT: lambda node, a, forloop: a[0],    # the tiled kernel tensor's expression
    BOp.CONSTANT: lambda node, a, forloop: E.const(node.arg[0]),
    BOp.MATMUL: lambda node, a, forloop: _matmul(node, a),
    BOp.REDUCE_SUM: _reduce(E.reduce_sum),
    BOp.REDUCE_MAX: _reduce(E.reduce_max),
    BOp.RMS_NORM: _rms,
    BOp.ACC_SUM: _sum_acc,
    BOp.ACC_SUM_LAST: _sum_acc,
    BOp.ACC_RMS_LAST: _rms_acc,
    BOp.ACC_MAX: _max_acc,       # its running value (read in the loop) is the same expression
    BOp.ACC_MAX_LAST: _max_acc,
    BOp.ACC_SUM_RESCALE: _sum_acc,
    BOp.ACC_SUM_LAST_RESCALE: _sum_acc,
    BOp.THREAD: lambda node, a, forloop: evaluate(
        node, a, lambda m, v: node_expression(m, v, forloop=forloop)),
}


def _lower_accumulator(node: BNode, a, forloop: int) -> Expr:
    """An accumulator's expression, or an opaque term where the plain reduction would be wrong.

    A running max m_i read inside the loop gets the expression of the final max M. That is exact
    for a rescaling accumulator whose body carries one factor exp(-m): it computes
    sum_i x_i * exp(m_i - M), and x_i = y_i * exp(-m_i) makes that sum_i y_i * exp(-M), the plain
    sum with m read as M. So ACC_SUM_RESCALE and ACC_SUM_LAST_RESCALE are plain sums. Any other
    use of a running value inside an accumulated body (or a rescale without that factor) is
    lowered to an opaque RESCALED_SUM, which no law equates with the spec.
    """
    if _exact(node, a):
        return BLOCK_LOWER[node.op](node, a, forloop)
    return E.fn(Fn.RESCALED_SUM, *a, extra=(_accumulated(node, forloop), node.op.value))


def _exact(node: BNode, a) -> bool:
    running = running_reads(node.srcs[0])
    if node.op not in RESCALE_ACCUMULATORS:
        return not running
    x, m = N.normalize(a[0]), N.normalize(a[1])
    return running <= {node.srcs[1]} and x is not None and m is not None and N.carries_rescale(x, m)


def running_reads(node: BNode) -> set[BNode]:
    """The running accumulators that `node` reads inside the loop (through non-accumulator ops)."""
    found, seen, stack = set(), set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in ACCUMULATORS:
            if n.op in RUNNING_ACCUMULATORS:
                found.add(n)
            continue
        stack.extend(n.srcs)
    return found


# ---- entry points ------------------------------------------------------------------------------------
def node_expression(node, src_exprs: Sequence[Expr], *, forloop: int | None = None) -> Expr:
    """One node's expression from its sources' (the search adds nodes one at a time).

    For a block INPUT node pass `[expression of the kernel tensor it tiles]`; for a block
    accumulator, `forloop` defaults to the trip count recorded in the block's input tiles.
    """
    a = list(src_exprs)
    if isinstance(node.op, TOp):
        return TOP_LOWER[node.op](a, node.arg)
    if isinstance(node, KNode):
        return KERNEL_LOWER[node.op](node, a)
    if node.op in ACCUMULATORS:
        return _lower_accumulator(node, a, forloop or _forloop_of(node))
    return BLOCK_LOWER[node.op](node, a, forloop)


def _forloop_of(node: BNode) -> int:
    for n in toposort([node]):
        if n.op is BOp.INPUT:
            return n.arg.forloop
    raise InvalidGraph(f"cannot tell the trip count of {node!r}: it reads no block input",
                       hint="pass forloop= to node_expression")


def expressions(graph: KernelGraph) -> dict[KNode, Expr]:
    """The abstract expression of every tensor of `graph` (custom ops through their tiling)."""
    out: dict[KNode, Expr] = {}
    for node in graph.nodes:
        out[node] = _cached_kernel(node, [out[s] for s in node.srcs])
    return out


_KERNEL_CACHE: "weakref.WeakKeyDictionary[KNode, Expr]" = weakref.WeakKeyDictionary()
_BLOCK_CACHE: dict = {}
_BLOCK_CACHE_SIZE = 4096


def _cached_kernel(node: KNode, srcs) -> Expr:
    # a kernel node's expression depends on the node alone (its sources are in it)
    found = _KERNEL_CACHE.get(node)
    if found is None:
        found = node_expression(node, srcs)
        _KERNEL_CACHE[node] = found
    return found


def block_expressions(block_graph, input_exprs: Sequence[Expr], *,
                      forloop: int | None = None) -> dict[BNode, Expr]:
    """The expression of every tile of a block graph, given its inputs' kernel expressions.

    `block_graph`: a BlockGraph, or the BNodes of a partial one (roots; the search's state).
    """
    graph = block_graph if isinstance(block_graph, BlockGraph) else tuple(block_graph)
    key = (graph, tuple(input_exprs), forloop)
    found = _BLOCK_CACHE.get(key)
    if found is None:
        found = _lower_block(graph, list(input_exprs), forloop)
        if len(_BLOCK_CACHE) > _BLOCK_CACHE_SIZE:
            _BLOCK_CACHE.clear()
        _BLOCK_CACHE[key] = found
    return found


def _lower_block(block_graph, input_exprs, forloop) -> dict[BNode, Expr]:
    if isinstance(block_graph, BlockGraph):
        nodes, forloop = block_graph.nodes, block_graph.forloop
    else:
        nodes = toposort(list(block_graph))
    out: dict[BNode, Expr] = {}
    for node in nodes:
        srcs = [_input_expr(node, input_exprs)] if node.op is BOp.INPUT else \
            [out[s] for s in node.srcs]
        out[node] = node_expression(node, srcs, forloop=forloop)
    return out


def _input_expr(node: BNode, input_exprs) -> Expr:
    index = node.arg.index
    if index >= len(input_exprs):
        raise InvalidGraph(f"block input {index} has no kernel expression ({len(input_exprs)} given)",
                           hint="pass one expression per block input, in index order")
    return input_exprs[index]


def check_tables() -> list[str]:
    """Ops without an abstract-expression entry (empty when every table is complete)."""
    missing = [f"TOp.{op.name}" for op in TOp if op not in TOP_LOWER]
    missing += [f"KOp.{op.name}" for op in KOp if op not in KERNEL_LOWER]
    missing += [f"BOp.{op.name}" for op in BOp if op not in BLOCK_LOWER]
    return missing
