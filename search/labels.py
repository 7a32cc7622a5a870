"""Dim labels: which dims of a program's tensors are "the same index" (einsum-style).

Every dim of every tensor gets a label by unification through the ops: matmul ties the
contracted dims, elementwise ops tie dims of equal extent, reductions turn a dim into a unit.
A label that reaches a spec output is *parallel*; the others are *reductions*. Schedules are
derived from labels: a grid axis splits one label in every tensor that has it, the loop walks
one label. Dims of tensors written by a split-K/split-KV kernel carry *composite* labels: the
grid's split (outer) times the tile's own label (inner).
"""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.layout import reshape_groups
from mugraph.ir.ops import KOp, TOp
from mugraph.search.leaves import TABLE_PREFIX


@dataclass(frozen=True)
class Label:
    """An index of the program. `uid` is stable within one analysis; `extent` its size."""

    uid: int
    extent: int
    name: str = ""

    def __repr__(self) -> str:
        return self.name or f"L{self.uid}"


UNIT = Label(-1, 1, "1")


@dataclass(frozen=True)
class DimLabel:
    """A dim's labels, outer to inner: one factor for plain dims, two for concatenated partials."""

    factors: tuple[Label, ...]

    @property
    def outer(self) -> Label:
        return self.factors[0]

    @property
    def extent(self) -> int:
        n = 1
        for f in self.factors:
            n *= f.extent
        return n

    def __repr__(self) -> str:
        return "x".join(map(repr, self.factors))


UNIT_DIM = DimLabel((UNIT,))


class _UnionFind:
    """Union-find over hashable keys; the earliest-seen key of a class is its root (determinism)."""

    def __init__(self):
        self.parent: dict = {}
        self.rank: dict = {}

    def find(self, x):
        if x not in self.parent:
            self.parent[x] = x
            self.rank[x] = len(self.rank)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            first, second = (ra, rb) if self.rank[ra] < self.rank[rb] else (rb, ra)
            self.parent[second] = first


def _unify_elementwise(uf, node: KNode) -> None:
    out = node.shape
    for src in node.srcs:
        for i in range(1, len(src.shape) + 1):
            if src.shape[-i] == out[-i] and out[-i] > 1:
                uf.union((node, len(out) - i), (src, len(src.shape) - i))


def _unify_matmul(uf, node: KNode) -> None:
    a, b = node.srcs
    uf.union((a, a.rank - 1), (b, b.rank - 2))
    uf.union((node, node.rank - 2), (a, a.rank - 2))
    uf.union((node, node.rank - 1), (b, b.rank - 1))
    for src in (a, b):
        for i in range(3, src.rank + 1):
            if src.shape[-i] > 1:
                uf.union((node, node.rank - i), (src, src.rank - i))


def _unify_same(uf, node: KNode, skip=()) -> None:
    src = node.srcs[0]
    for d in range(node.rank):
        if d not in skip and node.shape[d] > 1:
            uf.union((node, d), (src, d))


def _unify(uf, node: KNode) -> None:
    op = node.op
    if isinstance(op, TOp):
        _unify_elementwise(uf, node)
    elif op is KOp.MATMUL:
        _unify_matmul(uf, node)
    elif op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX):
        _unify_same(uf, node, skip=(node.arg,))
    elif op in (KOp.RMS_NORM, KOp.BROADCAST):
        _unify_same(uf, node)
    elif op is KOp.TRANSPOSE:
        for d, p in enumerate(node.arg):
            uf.union((node, d), (node.srcs[0], p))
    elif op is KOp.RESHAPE:
        for src_dims, dst_dims in _wide_groups(node):
            if len(src_dims) == 1 and len(dst_dims) == 1:
                uf.union((node, dst_dims[0]), (node.srcs[0], src_dims[0]))
    elif op is KOp.SLICE:
        src = node.srcs[0]
        for d in range(node.rank):
            if node.shape[d] == src.shape[d] > 1:
                uf.union((node, d), (src, d))
    elif op is KOp.CONCAT:
        for src in node.srcs:
            for d in range(node.rank):
                if d != node.arg and node.shape[d] > 1:
                    uf.union((node, d), (src, d))


def _wide_groups(node: KNode) -> list[tuple[list, list]]:
    """A reshape's dim groups (ir.layout.reshape_groups) without their unit dims."""
    old, new = node.srcs[0].shape, node.shape
    return [([i for i in gi if old[i] > 1], [j for j in gj if new[j] > 1])
            for gi, gj in reshape_groups(old, new)]


def _compositions(uf, nodes) -> tuple[dict, set]:
    """What reshapes and slices say beyond equal indices: {root: roots of its parts, outer
    first} for a dim a reshape splits into (or merges from) several, and the roots whose
    extents are rigid (a slice's window and its source dim; both sides of a reshape that
    regroups several dims into several others, like [6, 4] to [4, 6]; a table's dims: its values
    fix them).

    One dim split two ways into parts of the same extents (K and V repeated to the same heads)
    has equal parts: they are unified, until no composition disagrees."""
    splits, rigid = [], set()
    for node in nodes:
        if node.op is KOp.TABLE or node.op is KOp.INPUT and node.arg[0].startswith(TABLE_PREFIX):
            rigid.update(uf.find((node, d)) for d in range(node.rank) if node.shape[d] > 1)
        if node.op is KOp.SLICE:
            rigid.update(_sliced(uf, node))
        elif node.op is KOp.RESHAPE:
            for src_dims, dst_dims in _wide_groups(node):
                whole, pieces = ((node.srcs[0], src_dims), (node, dst_dims)) \
                    if len(src_dims) == 1 else ((node, dst_dims), (node.srcs[0], src_dims))
                if len(whole[1]) == 1 and len(pieces[1]) > 1:
                    splits.append(((whole[0], whole[1][0]), [(pieces[0], d) for d in pieces[1]]))
                elif len(src_dims) > 1 and len(dst_dims) > 1:
                    rigid.update(uf.find((n, d)) for n, dims in ((node.srcs[0], src_dims),
                                                                  (node, dst_dims)) for d in dims)
    while True:
        parts, conflicts = _split_roots(uf, splits)
        merged = False
        for a, b in conflicts:
            if [_extent(p) for p in a] == [_extent(p) for p in b]:
                for x, y in zip(a, b):
                    merged |= uf.find(x) != uf.find(y)
                    uf.union(x, y)
            else:
                rigid.update(uf.find(p) for p in a + b)
        if not merged:
            return parts, {uf.find(r) for r in rigid}


def _split_roots(uf, splits) -> tuple[dict, list]:
    parts, first, conflicts = {}, {}, []
    for whole, pieces in splits:
        root, split = uf.find(whole), tuple(uf.find(p) for p in pieces)
        if parts.setdefault(root, split) != split:
            conflicts.append((first[root], pieces))
        first.setdefault(root, pieces)
    return parts, conflicts


def _extent(key) -> int:
    node, dim = key
    return node.shape[dim]


def _sliced(uf, node) -> set:
    """The roots a slice fixes: its window's dim and its source's."""
    src, out = node.srcs[0], set()
    for d in range(node.rank):
        if node.shape[d] != src.shape[d]:
            out.add(uf.find((src, d)))
            if node.shape[d] > 1:
                out.add(uf.find((node, d)))
    return out


def _factors(root, parts: dict, labels: dict, seen=()) -> tuple:
    """The atomic labels of a root, outer to inner (a composite root's parts, flattened)."""
    if root in parts and root not in seen:
        return tuple(f for p in parts[root] for f in _factors(p, parts, labels, seen + (root,)))
    return (labels[root],)


@dataclass
class LabelAnalysis:
    """Labels of every dim of every node of a graph, and which labels are parallel."""

    dims: dict          # KNode -> tuple[DimLabel, ...]
    parallel: frozenset  # labels that appear in an output dim
    labels: tuple       # every non-unit label, by uid
    reduced: frozenset = frozenset()  # labels the program sums or maxes over somewhere
    rigid: frozenset = frozenset()    # labels whose extent a slice or a regrouping fixes

    def of(self, node: KNode) -> tuple[DimLabel, ...]:
        return self.dims[node]

    def is_reduction(self, label: Label) -> bool:
        return label is not UNIT and label not in self.parallel

    def may_reduce(self, dim: DimLabel) -> bool:
        """Whether an equivalent program may reduce over a dim with these labels: only over
        indices the spec itself reduces (split partials, uid < 0, are the search's own)."""
        return all(f.uid < 0 or f in self.reduced for f in dim.factors)


def analyze(graph: KernelGraph) -> LabelAnalysis:
    uf = _UnionFind()
    nodes = graph.nodes
    for node in nodes:
        for d in range(node.rank):
            uf.find((node, d))
        _unify(uf, node)
    parts, rigid_roots = _compositions(uf, nodes)
    roots: dict = {}
    for node in nodes:
        for d, n in enumerate(node.shape):
            root = uf.find((node, d))
            if n > 1 and root not in parts and root not in roots:
                roots[root] = Label(len(roots), n, _name(node, d, len(roots)))
    dims = {node: tuple(UNIT_DIM if n == 1 else
                        DimLabel(_factors(uf.find((node, d)), parts, roots))
                        for d, n in enumerate(node.shape)) for node in nodes}
    parallel = frozenset(f for o in graph.outputs for dl in dims[o] if dl is not UNIT_DIM
                         for f in dl.factors)
    reduced = set()
    for node in nodes:
        if node.op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX):
            dim = node.arg
        elif node.op is KOp.RMS_NORM:
            dim = node.arg[0]
        elif node.op is KOp.MATMUL:
            dim = node.srcs[0].rank - 1
        else:
            continue
        src = dims[node.srcs[0]][dim] if node.op is not KOp.MATMUL else dims[node.srcs[0]][-1]
        reduced.update(f for f in src.factors if f is not UNIT)
    rigid = frozenset(f for r in rigid_roots for f in _factors(r, parts, roots) if r in roots
                      or r in parts)
    return LabelAnalysis(dims, parallel, tuple(roots.values()), frozenset(reduced), rigid)


def _name(node: KNode, dim: int, uid: int) -> str:
    if node.op is KOp.INPUT:
        return f"{node.arg[0]}.{dim}"
    return f"L{uid}"


# ---- labels of one new node from its sources (the search builds nodes one at a time) ------------
def _broadcast_labels(srcs, out_shape):
    """Labels of an elementwise result: operands' labels must agree where extents exceed 1.

    An extent-1 dim keeps a label (a fully split dim, e.g. one batch entry per block) when every
    operand that names it agrees; otherwise it is a plain unit dim.
    """
    out = []
    for i in range(1, len(out_shape) + 1):
        wide = {labels[-i] for labels, shape in srcs if i <= len(shape) and shape[-i] > 1}
        if len(wide) > 1:
            return None
        if wide:
            out.append(wide.pop())
            continue
        named = {labels[-i] for labels, shape in srcs if i <= len(shape)} - {UNIT_DIM}
        out.append(named.pop() if len(named) == 1 else UNIT_DIM)
    return tuple(reversed(out))


def _matmul_labels(srcs, out_shape):
    (la, sa), (lb, sb) = srcs
    if sa[-1] > 1 and la[-1] != lb[-2]:
        return None
    batch = _broadcast_labels([(la[:-2], sa[:-2]), (lb[:-2], sb[:-2])], out_shape[:-2]) \
        if len(out_shape) > 2 else ()
    if batch is None:
        return None
    return batch + (la[-2], lb[-1])


def node_labels(op, srcs, out_shape, arg):
    """Dim labels of a node given (labels, shape) of its sources, or None when they clash.

    A clash (e.g. adding a tile indexed by (m, k) to one indexed by (m, n) of the same shape)
    means the op combines unrelated indices: the abstraction of expressions cannot see that,
    labels can.
    """
    from mugraph.ir.ops import ACCUMULATORS, BOp, LAST_DIM_ACCUMULATORS
    if isinstance(op, TOp) or op is BOp.THREAD:
        return _broadcast_labels(srcs, out_shape)
    if op in (KOp.MATMUL, BOp.MATMUL):
        return _matmul_labels(srcs, out_shape)
    labels = srcs[0][0]
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        return tuple(UNIT_DIM if d == arg else dl for d, dl in enumerate(labels))
    if op in LAST_DIM_ACCUMULATORS:
        return labels[:-1] + (UNIT_DIM,)
    if op in ACCUMULATORS or op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return labels
    if op is KOp.TRANSPOSE:
        return tuple(labels[p] for p in arg)
    return None


def _reduced_dim(op, rank: int, arg) -> int | None:
    """The dim a reduction (sum, max, rms, last-dim accumulator) reduces, else None."""
    from mugraph.ir.ops import BOp, LAST_DIM_ACCUMULATORS
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        return arg
    if op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return arg[0]
    if op in LAST_DIM_ACCUMULATORS:
        return rank - 1
    return None


def checked_labels(analysis: LabelAnalysis, op, srcs, out_shape, arg):
    """`node_labels`, and None as well when the op reduces an index the spec never reduces:
    abstract expressions do not name dims, so without this a sum over rows would pass for a
    sum over columns of the same extent."""
    labels = node_labels(op, srcs, out_shape, arg)
    if labels is None:
        return None
    src = srcs[0][0]
    dim = _reduced_dim(op, len(src), arg)
    if dim is not None and src[dim] is not UNIT_DIM and not analysis.may_reduce(src[dim]):
        return None
    return labels
