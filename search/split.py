"""Split structures: one loop kernel becomes two kernels, the FlashDecoding construction.

A kernel whose loop walks a reduced index (keys, K) and leaves a grid axis free is split along
that index: kernel 1 is the same block program on a grid with one more axis, each block running
the loop over its slice of the index and writing its accumulators as partials (fp32); kernel 2
reads the partials in a loop over the slices, combines each with its accumulator's law, and runs
the original epilogue. The split count and both kernels' tiles are chosen later by the cost model
at the real shapes, like any structure's.

Combine laws (P: one slice's partial; m_i, M: a slice's running max and the combined one):
    acc_sum, acc_sum_last               -> acc_sum(P)
    acc_max, acc_max_last               -> acc_max(P)
    acc_sum[_last]_rescale(x, m)        -> acc_sum_rescale(P * exp(m_i - M), M), M = acc_max(m_i)
acc_rms_last keeps a square root of its sum, which partials cannot add: such a kernel stays whole.
"""
from __future__ import annotations

from mugraph.ir import BlockGraph, BlockInput, BlockOutput, BNode, DType, KernelGraph, Phase
from mugraph.ir.block import custom
from mugraph.ir.errors import MugraphError
from mugraph.ir.ops import (ACCUMULATORS, BOp, KOp, LAST_DIM_ACCUMULATORS, RESCALE_ACCUMULATORS,
                            RUNNING_ACCUMULATORS, TOp)

SPLITS = 2          # slices at the reduced shapes (the real count is sized by the cost model)

_SUMS = frozenset({BOp.ACC_SUM, BOp.ACC_SUM_LAST})
_COMBINABLE = _SUMS | RUNNING_ACCUMULATORS | RESCALE_ACCUMULATORS


def split_structures(graph: KernelGraph, max_kernel_ops: int, max_custom_ops: int,
                     splits: int = SPLITS) -> list[KernelGraph]:
    """Every graph made by splitting one of `graph`'s loop kernels, within the config's limits
    (the split adds one kernel op, a custom one)."""
    customs = {(bg, srcs) for bg, srcs in graph.custom_ops()}
    library = sum(1 for n in graph.nodes
                  if n.op not in (KOp.INPUT, KOp.CONSTANT, KOp.IOTA, KOp.CUSTOM))
    if len(customs) + 1 > max_custom_ops or len(customs) + library + 1 > max_kernel_ops:
        return []
    out = []
    for bg, srcs in graph.custom_ops():
        try:
            parts = split_kernel(bg, splits)
            if parts is not None:
                out.append(_replaced(graph, (bg, srcs), *parts))
        except MugraphError:       # a split the IR rejects (shapes, phases) is not made
            continue
    return out


def split_kernel(bg: BlockGraph, splits: int):
    """The pieces of `bg`'s split (kernel 1, the split axis, the slice count, the partial
    accumulators, `bg`'s phases), or None when it cannot be split."""
    axis = _free_axis(bg)
    phase = bg.phases()
    accs = [n for n in bg.nodes if phase[n] is Phase.ACCUMULATOR]
    if axis is None or bg.forloop < 2 or not accs or any(a.op not in _COMBINABLE for a in accs):
        return None
    axes = _axes(bg)
    if axes is None:
        return None
    partials = _partials(bg, phase, accs)
    first = _first_kernel(bg, axis, splits, partials, axes)
    return None if first is None else (first, axis, splits, partials, phase)


def _free_axis(bg: BlockGraph):
    """A grid axis no input or output maps (extent 1), or None."""
    for a in range(3):
        if bg.grid[a] == 1 and all(n.arg.imap[a] is None for n in bg.inputs) and \
                all(o.omap[a] is None for o in bg.outputs):
            return a
    return None


def _partials(bg, phase, accs) -> list:
    """The accumulators the epilogue or the outputs read, and the maxima their rescales use."""
    read = {s for n in bg.nodes if phase[n] is Phase.EPILOGUE for s in n.srcs}
    read |= {o.node for o in bg.outputs}
    kept = [a for a in accs if a in read]
    for a in list(kept):
        if a.op in RESCALE_ACCUMULATORS and a.srcs[1] not in kept:
            kept.append(a.srcs[1])
    return kept


# ---- which grid axes each tile dim carries ------------------------------------------------------
def _axes(bg: BlockGraph):
    """{node: per dim, the grid axes (extent > 1) whose split the dim carries}, or None."""
    out = {}
    for n in bg.nodes:
        dims = _node_axes(n, bg, out)
        if dims is None:
            return None
        out[n] = dims
    return out


def _node_axes(n: BNode, bg: BlockGraph, known):
    if n.op is BOp.INPUT:
        return tuple(frozenset(a for a, d in enumerate(n.arg.imap) if d == dim and bg.grid[a] > 1)
                     for dim in range(n.rank))
    if n.op is BOp.CONSTANT:
        return (frozenset(),) * n.rank
    if isinstance(n.op, TOp) or n.op is BOp.THREAD:
        return _broadcast_axes(n, known)
    src = known[n.srcs[0]]
    if n.op is BOp.MATMUL:
        a, b = known[n.srcs[0]], known[n.srcs[1]]
        batch = tuple(x | y for x, y in zip(a[:-2], b[:-2])) if len(a) == len(b) else a[:-2]
        return batch + (a[-2], b[-1])
    if n.op in (BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        return tuple(frozenset() if d == n.arg else s for d, s in enumerate(src))
    if n.op in LAST_DIM_ACCUMULATORS:
        return src[:-1] + (frozenset(),)
    if n.op in ACCUMULATORS or n.op is BOp.RMS_NORM:
        return src
    return None


def _broadcast_axes(n: BNode, known) -> tuple:
    dims = [frozenset()] * n.rank
    for s in n.srcs:
        for i, axes in enumerate(reversed(known[s])):
            dims[n.rank - 1 - i] = dims[n.rank - 1 - i] | axes
    return tuple(dims)


# ---- kernel 1: the loop over one slice per block ------------------------------------------------
def _first_kernel(bg, axis, splits, partials, axes):
    grid = tuple(splits if a == axis else g for a, g in enumerate(bg.grid))
    mapping = {}
    for n in bg.inputs:
        a = n.arg
        imap = tuple(a.fmap if b == axis else d for b, d in enumerate(a.imap))
        mapping[n] = BNode(BOp.INPUT, (), BlockInput(a.index, a.shape, a.dtype, imap, a.fmap,
                                                     grid, bg.forloop))
    outputs = []
    for p in partials:
        omap = _partial_omap(p, axes[p], axis, bg.grid)
        if omap is None:
            return None
        node = _copied(p, mapping)
        shape = tuple(t * (grid[omap.index(d)] if d in omap else 1)
                      for d, t in enumerate(node.shape))
        outputs.append(BlockOutput(node, omap, DType.FLOAT32, shape))
    return BlockGraph(grid, bg.threads, bg.forloop, tuple(mapping[n] for n in bg.inputs),
                      tuple(outputs))


def _partial_omap(p: BNode, dims, axis: int, grid) -> tuple | None:
    """Each used grid axis to the dim that carries it; the split axis to the last dim that
    carries none (the partials of one tile lie side by side along it)."""
    omap = [None, None, None]
    for b in range(3):
        if b != axis and grid[b] > 1:
            carrying = [d for d, s in enumerate(dims) if b in s]
            if len(carrying) != 1:
                return None
            omap[b] = carrying[0]
    free = [d for d, s in enumerate(dims) if not s and d not in omap]
    if not free:
        return None
    omap[axis] = free[-1]
    return tuple(omap)


def _copied(node, mapping):
    """`node` rebuilt over `mapping` (sources first)."""
    from mugraph.ir.node import toposort
    for n in toposort([node]):
        if n not in mapping:
            mapping[n] = BNode(n.op, tuple(mapping[s] for s in n.srcs), n.arg)
    return mapping[node]


# ---- kernel 2: combine the partials, then the original epilogue ----------------------------------
def _second_kernel(bg, axis, splits, partials, phase, partial_nodes, srcs):
    """Kernel 2 over (partial tensors, the original sources its epilogue reads)."""
    grid = bg.grid
    tiles, inputs, sources = {}, [], []
    for p, tensor, omap in partial_nodes:
        imap = tuple(None if b == axis else d for b, d in enumerate(omap))
        spec = BlockInput(len(inputs), tensor.shape, tensor.dtype, imap, omap[axis], grid, splits)
        tiles[p] = BNode(BOp.INPUT, (), spec)
        inputs.append(tiles[p])
        sources.append(tensor)
    combined = {}
    for p in partials:
        combined[p] = _combine(p, tiles, combined)
    mapping = dict(combined)
    for n in _after_the_loop(bg):
        if n.op is BOp.INPUT:
            a = n.arg
            spec = BlockInput(len(inputs), a.shape, a.dtype, a.imap, None, grid, splits)
            mapping[n] = BNode(BOp.INPUT, (), spec)
            inputs.append(mapping[n])
            sources.append(srcs[a.index])
    outputs = []
    for o in bg.outputs:
        outputs.append(BlockOutput(_copied(o.node, mapping), o.omap, o.dtype, o.shape))
    return BlockGraph(grid, bg.threads, splits, tuple(inputs), tuple(outputs)), sources


def _after_the_loop(bg) -> list:
    """The nodes the outputs need once the accumulators are known (inputs in index order)."""
    seen, stack = set(), [o.node for o in bg.outputs]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op not in ACCUMULATORS:
            stack.extend(n.srcs)
    return [n for n in bg.nodes if n in seen]


def _combine(p: BNode, tiles, combined) -> BNode:
    t = tiles[p]
    if p.op in _SUMS:
        return BNode(BOp.ACC_SUM, (t,))
    if p.op in RUNNING_ACCUMULATORS:
        return BNode(BOp.ACC_MAX, (t,))
    m = p.srcs[1]
    running = combined.get(m) or _combine(m, tiles, combined)
    combined[m] = running
    weight = BNode(TOp.EXP, (BNode(TOp.SUB, (tiles[m], running)),))
    return BNode(BOp.ACC_SUM_RESCALE, (BNode(TOp.MUL, (t, weight)), running))


# ---- the kernel graph --------------------------------------------------------------------------
def _replaced(graph, key, first, axis, splits, partials, phase) -> KernelGraph:
    bg, srcs = key
    parts = custom(first, srcs)
    partial_nodes = [(p, t, o.omap) for p, t, o in zip(partials, parts, first.outputs)]
    second, sources = _second_kernel(bg, axis, splits, partials, phase, partial_nodes, srcs)
    outs = custom(second, sources)
    mapping = {}
    for n in graph.nodes:
        if n.op is KOp.CUSTOM and (n.arg[0], n.srcs) == key:
            mapping[n] = outs[n.arg[1]]
        elif n.srcs:
            new = tuple(mapping.get(s, s) for s in n.srcs)
            mapping[n] = n if new == n.srcs else n.replace(srcs=new)
    return KernelGraph([mapping.get(o, o) for o in graph.outputs], graph.inputs,
                       graph.output_names)
