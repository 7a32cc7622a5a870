"""Re-instantiating graphs at other shapes: the reduced spec for structure search, and a found
structure at the real shapes with grid extents and trip counts chosen per block graph.
"""
from __future__ import annotations

from mugraph.ir import BlockGraph, BlockInput, BlockOutput, BNode, KernelGraph, KNode
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.ops import BOp, KOp
from mugraph.search.labels import UNIT_DIM, LabelAnalysis


def reduced_extents(analysis: LabelAnalysis, spec: KernelGraph, limit: int) -> tuple[dict, dict]:
    """(label -> extent at the reduced instantiation, reduced -> real value of extent constants).

    Labels longer than `limit` shrink to `limit` (keeping at least two tiles for a grid split
    and a loop). Labels an rms_norm normalises get distinct extents that no spec constant
    equals, so a constant n = extent in a decomposed norm can be told apart and rescaled.
    """
    constants = {n.arg[0] for n in spec.nodes if n.op is KOp.CONSTANT}
    normalised = {analysis.of(n.srcs[0])[n.arg[0]].outer for n in spec.nodes if n.op is KOp.RMS_NORM}
    extents, taken, rescale = {}, set(constants), {}
    for lab in analysis.labels:
        if lab.extent <= limit or lab.extent % limit:
            extents[lab] = lab.extent
            continue
        if lab in normalised:
            value = next(v for v in range(limit, lab.extent + 1, limit)
                         if float(v) not in taken and lab.extent % v == 0)
            taken.add(float(value))
            extents[lab] = value
            rescale[float(value)] = float(lab.extent)
        else:
            extents[lab] = limit
    return extents, rescale


def rescaled_shape(labels, extents) -> tuple:
    return tuple(1 if dl is UNIT_DIM else _extent(dl, extents) for dl in labels)


def _extent(dl, extents) -> int:
    n = 1
    for f in dl.factors:
        n *= extents.get(f, f.extent)
    return n


def reinstantiate_spec(spec: KernelGraph, analysis: LabelAnalysis, extents: dict) -> KernelGraph:
    """The spec with every label at its new extent (constants unchanged)."""
    mapping: dict[KNode, KNode] = {}
    for node in spec.nodes:
        shape = rescaled_shape(analysis.of(node), extents)
        mapping[node] = _rebuild_kernel_node(node, mapping, shape)
    return KernelGraph([mapping[o] for o in spec.outputs], [mapping[i] for i in spec.inputs],
                       spec.output_names)


def _rebuild_kernel_node(node: KNode, mapping, shape) -> KNode:
    srcs = tuple(mapping[s] for s in node.srcs)
    arg = node.arg
    if node.op is KOp.INPUT:
        arg = (arg[0], shape, arg[2])
    elif node.op in (KOp.RESHAPE, KOp.BROADCAST):
        arg = shape
    elif node.op is KOp.CONSTANT and any(d > 1 for d in arg[1]):
        arg = (arg[0], shape, arg[2])
    return KNode(node.op, srcs, arg)


# ---- a found structure at new shapes ---------------------------------------------------------------
def resize(graph: KernelGraph, inputs: list[KNode], choose, constants: dict) -> KernelGraph | None:
    """Rebuild `graph` over new `inputs`; `choose((block_graph, old_srcs), new_srcs)` gives
    (grid, forloop) for every custom op, or None to stop; `constants` maps reduced extent constants to real ones. None if the
    structure does not fit the new shapes.
    """
    mapping: dict[KNode, KNode] = dict(zip(graph.inputs, inputs))
    blocks: dict[tuple, BlockGraph] = {}
    try:
        for node in graph.nodes:
            if node in mapping:
                continue
            srcs = tuple(mapping[s] for s in node.srcs)
            if node.op is KOp.CUSTOM:
                key = (node.arg[0], node.srcs)
                if key not in blocks:
                    sizes = choose(key, srcs)
                    if sizes is None:
                        return None
                    blocks[key] = resize_block(node.arg[0], srcs, *sizes, constants)
                mapping[node] = KNode(KOp.CUSTOM, srcs, (blocks[key], node.arg[1]))
            elif node.op in (KOp.RESHAPE, KOp.BROADCAST):
                return None
            else:
                mapping[node] = KNode(node.op, srcs, node.arg)
        return KernelGraph([mapping[o] for o in graph.outputs], inputs, graph.output_names)
    except InvalidGraph:
        return None


def resize_block(g: BlockGraph, srcs, grid, forloop, constants: dict) -> BlockGraph:
    """The same block program over new source tensors with a new grid and trip count."""
    mapping: dict[BNode, BNode] = {}
    for node in g.inputs:
        a = node.arg
        src = srcs[a.index]
        mapping[node] = BNode(BOp.INPUT, (), BlockInput(a.index, src.shape, src.dtype, a.imap,
                                                        a.fmap, grid, forloop))
    for node in g.nodes:
        if node in mapping:
            continue
        arg = node.arg
        if node.op is BOp.CONSTANT and arg[0] in constants:
            arg = (constants[arg[0]], arg[1], arg[2])
        mapping[node] = BNode(node.op, tuple(mapping[s] for s in node.srcs), arg)
    outputs = []
    for out in g.outputs:
        new = mapping[out.node]
        shape = list(new.shape)
        for axis, dim in enumerate(out.omap):
            if dim is not None:
                shape[dim] *= grid[axis]
        outputs.append(BlockOutput(new, out.omap, out.dtype, tuple(shape)))
    return BlockGraph(grid, g.threads, forloop, tuple(mapping[n] for n in g.inputs), tuple(outputs))
