"""Layout views: the spec's transposes, reshapes and slices of its inputs, offered to custom
kernels for free.

A view is never a copy: a custom kernel reads a transposed, reshaped or sliced tensor through
its strides and offset (`ir.layout.strided_view`, codegen's `view_of`, the cost model's
`_root`). So `x @ w.T`, `x * s[:, None]`, a head split `q.reshape(b, s, h, d)` or RoPE's
`x[..., :half]` can be one kernel that tiles the view, without a library copy spending a kernel
op and a launch. A chain that is no strided view (a head merge after a transpose) is not offered.
"""
from __future__ import annotations

import math

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.layout import reshape_groups, strided_view, written_through
from mugraph.ir.ops import KOp

VIEW_OPS = frozenset({KOp.TRANSPOSE, KOp.RESHAPE, KOp.SLICE})


def over_inputs(node: KNode) -> bool:
    """An input, or a layout view of one (a broadcast may sit inside the chain: jnp.repeat)."""
    while node.op in VIEW_OPS or node.op is KOp.BROADCAST:
        node = node.srcs[0]
    return node.op is KOp.INPUT


def input_views(spec: KernelGraph) -> list[KNode]:
    """The spec's layout nodes (transpose, reshape, slice, chains of them) whose root is an input,
    which read it as a strided view, and which something other than a layout op reads (the
    links inside a chain, like a head split before its transpose, are no tensors of their own:
    each would multiply the search's input sets)."""
    layout = VIEW_OPS | {KOp.BROADCAST}
    read = {s for n in spec.nodes if n.op not in layout for s in n.srcs} | set(spec.outputs)
    for n in reversed(spec.nodes):    # a broadcast that a computation reads reads its source
        if n.op is KOp.BROADCAST and n in read:
            read.add(n.srcs[0])
    return [n for n in spec.nodes if n.op in VIEW_OPS and over_inputs(n) and n in read
            and strided_view(n) is not None]


def view_tensors(ctx, inputs, make) -> list:
    """`inputs` (Tensors of the spec's inputs) and a Tensor for every input view, built by
    `make(node, expr, labels)`; expressions pass through layout ops unchanged."""
    exprs = {t.node: t.expr for t in inputs}

    def expr(node):
        if node not in exprs:
            exprs[node] = ctx.pruner.kernel_expr(node, [expr(s) for s in node.srcs])
        return exprs[node]
    return list(inputs) + [make(node, expr(node), ctx.analysis.of(node))
                           for node in input_views(ctx.spec)]


def same_extents(a: tuple, b: tuple) -> bool:
    """Shapes that differ at most in unit dims: one is a reshape of the other, not a copy."""
    return tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)


def as_shape(node: KNode, shape: tuple) -> KNode:
    """`node` viewed with `shape` (a reshape view where the unit dims differ)."""
    return node if node.shape == tuple(shape) else KNode(KOp.RESHAPE, (node,), tuple(shape))


# How the spec's layout ops were re-instantiated (`remember_resize`), both ways: the labels knew
# which part of a split or merged dim shrank; a structure's views are rebuilt the same way.
_RESIZED: dict = {}
_RESIZED_LIMIT = 1 << 14


def _resize_key(op, old_src: tuple, arg, new_src: tuple) -> tuple:
    return (op, tuple(old_src), arg, tuple(new_src))


def remember_resize(old: KNode, new: KNode) -> None:
    """Record that layout node `old` became `new` when its source changed shape (and back)."""
    if old.op not in (KOp.RESHAPE, KOp.SLICE, KOp.BROADCAST) or old.arg == new.arg:
        return
    if len(_RESIZED) > _RESIZED_LIMIT:
        _RESIZED.clear()
    a, b = old.srcs[0].shape, new.srcs[0].shape
    _RESIZED[_resize_key(old.op, a, old.arg, b)] = new.arg
    _RESIZED[_resize_key(old.op, b, new.arg, a)] = old.arg


def resized_view(node: KNode, src: KNode) -> KNode:
    """A view rebuilt over a source of new extents: as the spec's own layout op of that form was
    (`remember_resize`), else by the source's extents: a reshape's dims that keep their extent
    take the source's new ones; a group it merges takes their product; a group it splits keeps
    its extents and fails to rebuild (an InvalidGraph) where the source's changed. A slice keeps
    its window in the dims it cuts."""
    known = _RESIZED.get(_resize_key(node.op, node.srcs[0].shape, node.arg, src.shape))
    if known is not None:
        return KNode(node.op, (src,), known)
    if node.op is KOp.SLICE:
        old = node.srcs[0].shape
        limits = tuple(m if (a, b) == (0, n) else b
                       for a, b, n, m in zip(*node.arg, old, src.shape))
        return KNode(KOp.SLICE, (src,), (node.arg[0], limits))
    if node.op is KOp.BROADCAST:   # the dims it expands keep their extent (a repeat's)
        old = node.srcs[0].shape
        return KNode(KOp.BROADCAST, (src,), tuple(n if o == 1 and n != 1 else s
                                                  for o, n, s in zip(old, node.arg, src.shape)))
    if node.op is not KOp.RESHAPE:
        return KNode(node.op, (src,), node.arg)
    shape = list(node.arg)
    for gi, gj in reshape_groups(node.srcs[0].shape, node.arg):
        wide_i = [i for i in gi if node.srcs[0].shape[i] != 1]
        wide_j = [j for j in gj if node.arg[j] != 1]
        if len(wide_i) == 1 and len(wide_j) == 1:
            shape[wide_j[0]] = src.shape[wide_i[0]]
        elif len(wide_j) == 1:
            shape[wide_j[0]] = math.prod(src.shape[i] for i in gi)
    return KNode(KOp.RESHAPE, (src,), tuple(shape))


def output_chain(node: KNode) -> tuple[KNode, list]:
    """(the tensor under an output's transposes and reshapes, those layout nodes from the
    output down): a kernel that computes the tensor writes the output through them
    (`ir.layout.output_views`) where they are a bijection of its elements."""
    chain = []
    while node.op in (KOp.TRANSPOSE, KOp.RESHAPE):
        chain.append(node)
        node = node.srcs[0]
    if chain and written_through(chain[::-1], node.shape) is None:
        return node, []
    return node, chain


def rebuilt_chain(chain: list, core: KNode) -> KNode:
    """The layout chain of `output_chain` applied to `core` (a tensor of the chain's core shape)."""
    node = core
    for link in reversed(chain):
        node = KNode(link.op, (node,), link.arg)
    return node
