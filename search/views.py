"""Layout views: the spec's transposes and reshapes of its inputs, offered to custom kernels for free.

A layout op is never a copy: a custom kernel reads a transposed or reshaped tensor through its
strides (codegen's `view_of`, the cost model's `_root`). So `x @ w.T` or `x * s[:, None]` can be
one kernel that tiles the view, without a library transpose spending a kernel op and a launch.
"""
from __future__ import annotations

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.ops import KOp

VIEW_OPS = frozenset({KOp.TRANSPOSE, KOp.RESHAPE})


def over_inputs(node: KNode) -> bool:
    """An input, or a layout view of one."""
    while node.op in VIEW_OPS:
        node = node.srcs[0]
    return node.op is KOp.INPUT


def input_views(spec: KernelGraph) -> list[KNode]:
    """The spec's layout nodes (transpose, reshape, chains of them) whose root is an input."""
    return [n for n in spec.nodes if n.op in VIEW_OPS and over_inputs(n)]


def view_tensors(ctx, inputs, make) -> list:
    """`inputs` (Tensors of the spec's inputs) and a Tensor for every input view, built by
    `make(node, expr, labels)`; expressions pass through layout ops unchanged."""
    exprs = {t.node: t.expr for t in inputs}
    out = list(inputs)
    for node in input_views(ctx.spec):
        exprs[node] = ctx.pruner.kernel_expr(node, [exprs[s] for s in node.srcs])
        out.append(make(node, exprs[node], ctx.analysis.of(node)))
    return out


def same_extents(a: tuple, b: tuple) -> bool:
    """Shapes that differ at most in unit dims: one is a reshape of the other, not a copy."""
    return tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)


def as_shape(node: KNode, shape: tuple) -> KNode:
    """`node` viewed with `shape` (a reshape view where the unit dims differ)."""
    return node if node.shape == tuple(shape) else KNode(KOp.RESHAPE, (node,), tuple(shape))


def resized_view(node: KNode, src: KNode) -> KNode:
    """A view rebuilt over a source of new extents: a reshape only adds or drops unit dims, so
    its non-unit dims take the source's, in order."""
    if node.op is not KOp.RESHAPE:
        return KNode(node.op, (src,), node.arg)
    wide = iter(d for d in src.shape if d != 1)
    return KNode(KOp.RESHAPE, (src,), tuple(next(wide) if d != 1 else 1 for d in node.arg))
