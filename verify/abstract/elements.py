"""Element expressions: one element of any tensor or tile, as an `Expr` over input elements.

`Elements.kernel(node, index)` is the value of `node` at an index of Affs (see `indices.py`):
inputs are `Op.ACCESS` leaves, elementwise ops use the abstract-expression column
(`lower.TOP_LOWER`, every entry an identity of real arithmetic, tested), and matmuls,
reductions, accumulators and rms norms are `reductions.reduction`s over fresh index variables.
A custom op is read literally, as the reference interpreter runs it: the output index is split
into a block index and a tile index by the omap (e // tile, e % tile), an input tile element is
its kernel tensor at block * (extent / grid) + iteration * tile + tile index (imap, fmap), an
accumulator over F iterations is a reduction over an iteration variable, and the running value
of a max accumulator at iteration t is the max over iterations 0..t. The rescaling accumulators
telescope: acc_t = acc_{t-1} * exp(m_{t-1} - m_t) + x_t gives sum_t x_t * exp(m_t - M).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.layout import reshape_groups
from mugraph.ir.node import BNode, KNode
from mugraph.ir.ops import ACCUMULATORS, BOp, KOp, TOp
from mugraph.ir.thread import expand
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.expr import Expr, Fn, Op
from mugraph.verify.abstract.indices import ZERO, Aff, IVar, Refine, Unproved, divide, split
from mugraph.verify.abstract.lower import TOP_LOWER
from mugraph.verify.abstract.reductions import MAX, SUM, reduction

MAX_REFINES = 64       # variable splits one binder may ask for before the check gives up
MAX_CASES = 16         # a concat index is decided case by case over at most this many values
_MEMO: dict = {}       # (node, index) -> element, shared by every check (see `Elements.bind`)
_MEMO_SIZE = 1 << 17


def clear_memo() -> None:
    _MEMO.clear()


def _clip(shape, index) -> tuple:
    """The canonical index of an element: 0 in every dim of size 1."""
    if len(index) != len(shape):
        raise Unproved(f"an index of rank {len(index)} into a tensor of shape {list(shape)}")
    return tuple(ZERO if n == 1 else i for n, i in zip(shape, index))


def broadcast_index(index, shape, src_shape) -> tuple:
    """The index into a NumPy-broadcast operand (aligned at the right, 0 where it has size 1)."""
    tail = tuple(index)[len(index) - len(src_shape):]
    return tuple(ZERO if n == 1 else i for n, i in zip(src_shape, tail))


def _with(index, dim: int, value: Aff) -> tuple:
    return tuple(index[:dim]) + (value,) + tuple(index[dim + 1:])


@dataclass(frozen=True)
class Block:
    """One thread block of a custom op: its graph, the kernel tensors it reads, its grid index."""

    graph: BlockGraph
    srcs: tuple
    blocks: tuple          # (bx, by, bz) as Affs


class Elements:
    """Element expressions of the tensors of one or more graphs, memoised by node and index.

    An element is a function of its index alone (its reductions' variables are bound and
    renamed canonically), so the memo is shared by every check: a mutant or a search candidate
    re-lowers only the nodes it changed.
    """

    def __init__(self, deadline: float = math.inf, new_roundings: frozenset = frozenset()):
        self.deadline = deadline
        # casts that are not the program's roundings (`casts.py`): uninterpreted. Their elements
        # differ from the shared memo's (which reads every cast as the identity), so they get
        # their own.
        self.new_roundings = new_roundings
        self._memo = {} if new_roundings else _MEMO
        self._phases: dict = {}
        self._depth = 0
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.clear()

    # ---- kernel level --------------------------------------------------------------------------
    def kernel(self, node: KNode, index) -> Expr:
        index = _clip(node.shape, index)
        key = (node, index)
        found = self._memo.get(key)
        if found is None:
            self._tick()
            rule = KERNEL_ELEMENT.get(node.op) or SHARED_ELEMENT.get(node.op)
            if rule is None:
                rule = elementwise if isinstance(node.op, TOp) else _unmodelled
            found = self._memo[key] = rule(self, node, index, self.kernel)
        return found

    # ---- block level -----------------------------------------------------------------------------
    def block(self, blk: Block, node: BNode, t, index) -> Expr:
        """A tile element at iteration `t` (an Aff; None after the loop)."""
        index = _clip(node.shape, index)
        phase = self._phase(blk.graph, node)
        if phase is Phase.INVARIANT:
            t = None
        elif phase is Phase.LOOP and t is None:
            raise Unproved(f"{node.op.value} is a loop value read after the loop")
        key = (blk, node, t, index)
        found = self._memo.get(key)
        if found is None:
            self._tick()
            found = self._memo[key] = self._block_rule(blk, node, t, index)
        return found

    def _block_rule(self, blk: Block, node: BNode, t, index) -> Expr:
        if node.op in ACCUMULATORS:
            table = ACC_FINAL if t is None else ACC_RUNNING
            rule = table.get(node.op)
            if rule is None:
                raise Unproved(f"{node.op.value} read inside the loop")
            return rule(self, blk, node, t, index)
        if node.op is BOp.INPUT:
            return _block_input(self, blk, node, t, index)
        rule = SHARED_ELEMENT.get(node.op) or BLOCK_ELEMENT.get(node.op)
        if rule is None:
            rule = elementwise if isinstance(node.op, TOp) else _unmodelled
        return rule(self, node, index, lambda s, i: self.block(blk, s, t, i))

    def _phase(self, graph: BlockGraph, node: BNode) -> Phase:
        phases = self._phases.get(graph)
        if phases is None:
            phases = self._phases[graph] = graph.phases()
        return phases[node]

    # ---- binders ------------------------------------------------------------------------------------
    def bind(self, kind: str, sizes, build, limits=None) -> Expr:
        """The `kind` reduction of build(*indices) over fresh variables of the given sizes.

        A `Refine` for one of these variables re-runs `build` over the split (or each value):
        sum over v of f(v) = sum over q, r of f(k*q + r) for v in 0..k*n-1. Variables are named
        by the binder's nesting depth: binders active at once never share a name, and the same
        node at the same index builds the same expression wherever it is asked for.
        """
        limits = limits or [None] * len(sizes)
        made = [IVar(f"b{self._depth}_{j}", n, lim) if n > 1 else None
                for j, (n, lim) in enumerate(zip(sizes, limits))]
        slots = [Aff.of(v) if v is not None else ZERO for v in made]
        self._depth += 1
        try:
            return self._bound(kind, [v for v in made if v is not None], slots, build)
        finally:
            self._depth -= 1

    def _bound(self, kind: str, bound: list, slots: list, build) -> Expr:
        for _ in range(MAX_REFINES):
            try:
                return reduction(kind, bound, build(*slots))
            except Refine as r:
                if r.var not in bound:
                    raise
                if r.factor is None:
                    return self._cases(kind, bound, slots, build, r.var)
                q, rest, aff = split(r.var, r.factor, names=(f"{r.var.name}q", f"{r.var.name}r"))
                bound = [x for v in bound for x in ((q, rest) if v == r.var else (v,))]
                slots = [s.substitute({r.var: aff}) for s in slots]
        raise Unproved("too many index refinements")

    def _cases(self, kind: str, bound: list, slots: list, build, var) -> Expr:
        if var.limit is not None:
            raise Unproved("a case split of a prefix variable")
        rest = [v for v in bound if v != var]
        parts = [self._bound(kind, rest, [s.substitute({var: Aff.constant(c)}) for s in slots], build)
                 for c in range(var.size)]
        if kind == SUM:
            return E.add(*parts)
        result = parts[0]
        for p in parts[1:]:
            result = E.maximum(result, p)
        return result

    def _tick(self) -> None:
        if time.perf_counter() > self.deadline:
            raise Unproved("timeout")


# ---- rules shared by both levels ----------------------------------------------------------------------
def elementwise(lw: Elements, node, index, read) -> Expr:
    """An elementwise op: its abstract-expression entry on its (broadcast) operands' elements;
    an op without one is an uninterpreted function of them."""
    args = [read(s, broadcast_index(index, node.shape, s.shape)) for s in node.srcs]
    entry = TOP_LOWER.get(node.op)
    if node in lw.new_roundings:   # a rounding the program does not make changes the value
        return E.fn(Fn.OPAQUE, *args, extra=("round", node.arg.value))
    if entry is None:
        return E.fn(Fn.OPAQUE, *args, extra=(node.op.value, repr(node.arg)))
    return entry(args, node.arg)


def _constant(lw: Elements, node, index, read) -> Expr:
    """A finite constant; inf and NaN would meet real-number laws (inf - inf = 0) they break."""
    if not math.isfinite(node.arg[0]):
        raise Unproved(f"constant {node.arg[0]!r}: IEEE special values are not modelled")
    return E.const(node.arg[0])


def _matmul(lw: Elements, node, index, read) -> Expr:
    a, b = node.srcs
    batch, m, n = index[:-2], index[-2], index[-1]
    ia = broadcast_index(batch, node.shape[:-2], a.shape[:-2])
    ib = broadcast_index(batch, node.shape[:-2], b.shape[:-2])
    return lw.bind(SUM, [a.shape[-1]], lambda k: E.mul(read(a, ia + (m, k)), read(b, ib + (k, n))))


def _reduce(kind: str):
    def rule(lw: Elements, node, index, read) -> Expr:
        src, dim = node.srcs[0], node.arg
        return lw.bind(kind, [src.shape[dim]], lambda j: read(src, _with(index, dim, j)))
    return rule


def _rms_norm(lw: Elements, node, index, read) -> Expr:
    """x * rsqrt(sum(x^2) / n + eps) over `dim`, as the interpreter computes it."""
    (src,), (dim, eps) = node.srcs, node.arg
    n = src.shape[dim]

    def square(j):
        x = read(src, _with(index, dim, j))
        return E.mul(x, x)

    mean = E.div(lw.bind(SUM, [n], square), E.const(n))
    return E.mul(read(src, index), E.inv(E.sqrt(E.add(mean, E.const(eps)))))


def _unmodelled(lw: Elements, node, index, read) -> Expr:
    raise Unproved(f"{node.op.value} has no index-level meaning")


SHARED_ELEMENT = {
    KOp.CONSTANT: _constant, BOp.CONSTANT: _constant,
    KOp.MATMUL: _matmul, BOp.MATMUL: _matmul,
    KOp.REDUCE_SUM: _reduce(SUM), BOp.REDUCE_SUM: _reduce(SUM),
    KOp.REDUCE_MAX: _reduce(MAX), BOp.REDUCE_MAX: _reduce(MAX),
    KOp.RMS_NORM: _rms_norm, BOp.RMS_NORM: _rms_norm,
}


# ---- kernel level ----------------------------------------------------------------------------------------
def _input(lw: Elements, node: KNode, index, read) -> Expr:
    return Expr(Op.ACCESS, (), (node.arg[0], tuple(index)))


IOTA = ("iota",)   # the "tensor" whose element at i is i: no input name (a str) equals it


def _table(lw: Elements, node: KNode, index, read) -> Expr:
    """A table's element: an uninterpreted tensor named by the table's content (no input name,
    a str, equals the tuple), which carries its values for numeric evaluation."""
    return Expr(Op.ACCESS, (), (("table", node.arg[0], node.shape), tuple(index)))


def _iota(lw: Elements, node: KNode, index, read) -> Expr:
    """An index tensor's element: its index along `dim`, an uninterpreted function of it."""
    dim = node.arg[1]
    return Expr(Op.ACCESS, (), (IOTA, (index[dim],)))


def _transpose(lw: Elements, node: KNode, index, read) -> Expr:
    src = [ZERO] * len(index)
    for k, p in enumerate(node.arg):
        src[p] = index[k]
    return read(node.srcs[0], tuple(src))


def _reshape(lw: Elements, node: KNode, index, read) -> Expr:
    """A row-major reshape, group by group: the group's result dims are linearised and the
    linear index split into the source dims (divisions a merge needs may refine a variable)."""
    src = node.srcs[0]
    at = [ZERO] * src.rank
    for gi, gj in reshape_groups(src.shape, node.shape):
        linear = ZERO
        for j in gj:
            linear = linear * node.shape[j] + (ZERO if node.shape[j] == 1 else index[j])
        for i in reversed(gi[1:]):
            linear, at[i] = divide(linear, src.shape[i])
        at[gi[0]] = linear
    return read(src, _clip(src.shape, at))


def _slice(lw: Elements, node: KNode, index, read) -> Expr:
    return read(node.srcs[0], tuple(i + a for i, a in zip(index, node.arg[0])))


def _broadcast(lw: Elements, node: KNode, index, read) -> Expr:
    return read(node.srcs[0], tuple(index))     # the reader puts 0 in the expanded unit dims


def _concat(lw: Elements, node: KNode, index, read) -> Expr:
    dim = node.arg
    e = index[dim]
    lo, hi = e.bounds()
    offset = 0
    for s in node.srcs:
        if offset <= lo and hi < offset + s.shape[dim]:
            return read(s, _with(index, dim, e - offset))
        offset += s.shape[dim]
    raise _concat_refinement(e, [s.shape[dim] for s in node.srcs])


def _concat_refinement(e: Aff, sizes) -> Exception:
    """Which operand an index reads is decided by case analysis on its leading variable."""
    v, _ = max(e.terms, key=lambda t: abs(t[1]))
    if v.limit is None and v.size <= MAX_CASES:
        return Refine(v, None)
    g = math.gcd(*sizes)
    if e == Aff.of(v) and 1 < g < v.size and v.size % g == 0:
        return Refine(v, g)
    return Unproved(f"concat index {e!r} spans operands of sizes {sizes}")


def _custom(lw: Elements, node: KNode, index, read) -> Expr:
    """Block index and tile index from the output index, by the omap; then the block's tile."""
    graph, k = node.arg
    out = graph.outputs[k]
    blocks, local = [ZERO, ZERO, ZERO], list(index)
    for axis, dim in enumerate(out.omap):
        if dim is not None:
            blocks[axis], local[dim] = divide(index[dim], out.node.shape[dim])
    return lw.block(Block(graph, node.srcs, tuple(blocks)), out.node, None, tuple(local))


KERNEL_ELEMENT = {
    KOp.INPUT: _input,
    KOp.TABLE: _table,
    KOp.TRANSPOSE: _transpose,
    KOp.RESHAPE: _reshape,
    KOp.SLICE: _slice,
    KOp.BROADCAST: _broadcast,
    KOp.CONCAT: _concat,
    KOp.CUSTOM: _custom,
}
if hasattr(KOp, "IOTA"):   # the index op arrives with the comparison and mask ops
    KERNEL_ELEMENT[KOp.IOTA] = _iota


def _thread(lw: Elements, node: BNode, index, read) -> Expr:
    """A thread graph: the plain elementwise nodes it stands for (`ir.thread.expand`), over its
    operands' elements."""
    operands = set(node.srcs)

    def inner(n, at):
        if n in operands:
            return read(n, at)
        rule = SHARED_ELEMENT.get(n.op) or elementwise
        return rule(lw, n, _clip(n.shape, at), inner)

    return inner(expand(node), index)


BLOCK_ELEMENT = {BOp.THREAD: _thread}   # block-only ops other than inputs and accumulators


# ---- block level ----------------------------------------------------------------------------------------------
def _block_input(lw: Elements, blk: Block, node: BNode, t, index) -> Expr:
    """The kernel tensor at block * (extent / grid) + t * tile + index (imap, fmap)."""
    spec = node.arg
    at = list(index)
    for axis, dim in enumerate(spec.imap):
        if dim is not None:
            at[dim] = at[dim] + blk.blocks[axis] * (spec.shape[dim] // spec.grid[axis])
    if spec.fmap is not None:
        at[spec.fmap] = at[spec.fmap] + t * spec.tile_shape[spec.fmap]
    return lw.kernel(blk.srcs[spec.index], tuple(at))


def _body(lw: Elements, blk: Block, node: BNode):
    return lambda t, index: lw.block(blk, node.srcs[0], t, index)


def _last(index, j) -> tuple:
    return tuple(index[:-1]) + (j,)


def _acc(kind: str, last: bool):
    """sum / max over the iterations (and the last dim of the body for the *_LAST forms)."""
    def rule(lw: Elements, blk: Block, node: BNode, t, index) -> Expr:
        body, f = _body(lw, blk, node), blk.graph.forloop
        if last:
            return lw.bind(kind, [f, node.srcs[0].shape[-1]], lambda i, j: body(i, _last(index, j)))
        return lw.bind(kind, [f], lambda i: body(i, index))
    return rule


def _acc_rms(lw: Elements, blk: Block, node: BNode, t, index) -> Expr:
    body, f, n = _body(lw, blk, node), blk.graph.forloop, node.srcs[0].shape[-1]

    def square(i, j):
        x = body(i, _last(index, j))
        return E.mul(x, x)

    return E.sqrt(E.div(lw.bind(SUM, [f, n], square), E.const(f * n)))


def _rescaled(last: bool):
    """sum over iterations t of x_t * exp(m_t - M): the closed form of acc * exp(m_prev - m) + x."""
    def rule(lw: Elements, blk: Block, node: BNode, t, index) -> Expr:
        body, m = _body(lw, blk, node), node.srcs[1]
        at = broadcast_index(index, node.shape, m.shape)
        final = lw.block(blk, m, None, at)

        def term(i):
            x = lw.bind(SUM, [node.srcs[0].shape[-1]], lambda j: body(i, _last(index, j))) \
                if last else body(i, index)
            return E.mul(x, E.exp(E.sub(lw.block(blk, m, i, at), final)))

        return lw.bind(SUM, [blk.graph.forloop], term)
    return rule


def _running_max(last: bool):
    """A max accumulator read inside the loop at iteration t: the max over iterations 0..t."""
    def rule(lw: Elements, blk: Block, node: BNode, t, index) -> Expr:
        body, f = _body(lw, blk, node), blk.graph.forloop
        if last:
            return lw.bind(MAX, [f, node.srcs[0].shape[-1]], lambda i, j: body(i, _last(index, j)),
                           limits=[t + 1, None])
        return lw.bind(MAX, [f], lambda i: body(i, index), limits=[t + 1])
    return rule


ACC_FINAL = {
    BOp.ACC_SUM: _acc(SUM, last=False),
    BOp.ACC_SUM_LAST: _acc(SUM, last=True),
    BOp.ACC_RMS_LAST: _acc_rms,
    BOp.ACC_MAX: _acc(MAX, last=False),
    BOp.ACC_MAX_LAST: _acc(MAX, last=True),
    BOp.ACC_SUM_RESCALE: _rescaled(last=False),
    BOp.ACC_SUM_LAST_RESCALE: _rescaled(last=True),
}
ACC_RUNNING = {
    BOp.ACC_MAX: _running_max(last=False),
    BOp.ACC_MAX_LAST: _running_max(last=True),
}


def modelled_ops() -> set:
    """Every structural op with an index-level meaning (elementwise ops all have one)."""
    return set(KERNEL_ELEMENT) | set(SHARED_ELEMENT) | set(BLOCK_ELEMENT) | set(ACC_FINAL) | \
        {BOp.INPUT}
