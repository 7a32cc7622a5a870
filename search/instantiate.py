"""Re-instantiating graphs at other shapes: the reduced spec for structure search, and a found
structure at the real shapes with grid extents and trip counts chosen per block graph.
"""
from __future__ import annotations

import math

import numpy as np

from mugraph.ir import BlockGraph, BlockInput, BlockOutput, BNode, DType, KernelGraph, KNode
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.ops import BOp, KOp
from mugraph.search.labels import UNIT_DIM, LabelAnalysis
from mugraph.ir.thread import map_constants
from mugraph.search.views import remember_resize, resized_view, same_extents


# Shape-derived constants: a spec constant equal to one of these functions of a label's extent
# (a mean's 1/n, attention's 1/sqrt(d)) follows the label when it is re-sized.
EXTENT_FORMS = {"n": lambda n: float(n), "1/n": lambda n: 1.0 / n,
                "sqrt(n)": lambda n: math.sqrt(n), "1/sqrt(n)": lambda n: 1.0 / math.sqrt(n)}


def _rounded(value: float, dtype: DType) -> float:
    return float(np.asarray(value, dtype.numpy))


def _scalar_constants(spec: KernelGraph) -> list[KNode]:
    return [n for n in spec.nodes if n.op is KOp.CONSTANT and all(d == 1 for d in n.shape)]


def extent_constants(spec: KernelGraph, analysis: LabelAnalysis, shrinks) -> dict:
    """{constant node: (label, form)} for the spec constants that are a function of the extent
    of a label that shrinks (`shrinks(label)`) and that the program reduces over."""
    bound = {}
    for c in _scalar_constants(spec):
        for lab in analysis.labels:
            if not shrinks(lab) or lab not in analysis.reduced:
                continue
            form = next((f for f, fn in EXTENT_FORMS.items()
                         if _rounded(fn(lab.extent), c.arg[2]) == c.arg[0]), None)
            if form is not None:
                bound[c] = (lab, form)
                break
    return bound


def _extent_values(forms, extent: int) -> list[float]:
    return [_rounded(EXTENT_FORMS[f](extent), dtype) for f, dtype in forms]


def reduced_extents(analysis: LabelAnalysis, spec: KernelGraph, limit: int) -> tuple[dict, dict]:
    """(label -> extent at the reduced instantiation, reduced -> real value of extent constants).

    Labels longer than `limit` shrink to `limit` (keeping at least two tiles for a grid split
    and a loop), whatever their extent: one of 10000 or 50257 is searched at 128 like one of
    4096, and sized back by the cost model. A label whose extent some constant depends on (an
    rms_norm's count, a spec constant 1/n or 1/sqrt(n)) gets a reduced extent whose constants no
    other constant equals, so each can be told apart and re-derived at the real shapes. A
    concat's axis is as long as its parts there too; where that cannot hold (its whole is tied
    to a constant), the concat's labels keep their extents, as do the dims a reshape splits or
    merges.
    """
    fixed = analysis.rigid             # a slice's window, a regrouping, a table keep their extents
    regrouped = reshaped_labels(spec, analysis)
    extents, rescale = _shrunk(analysis, spec, limit, fixed, regrouped)
    if not all(total == extents[out] for out, total in _concat_axes(spec, analysis, extents)):
        extents, rescale = _shrunk(analysis, spec, limit, fixed | concat_labels(spec, analysis),
                                   regrouped)
    return extents, rescale


def _shrunk(analysis, spec, limit: int, fixed: frozenset, regrouped: frozenset) -> tuple[dict, dict]:
    """`reduced_extents` with the labels in `fixed` kept at their extents; a label a reshape
    splits or merges shrinks only by a whole number of `limit`s (its parts must still divide)."""
    shrinks = lambda lab: lab.extent > limit and lab not in fixed and \
        (lab not in regrouped or lab.extent % limit == 0)  # noqa: E731
    bound = extent_constants(spec, analysis, shrinks)
    forms: dict = {}
    for n in spec.nodes:
        if n.op is KOp.RMS_NORM:
            forms.setdefault(analysis.of(n.srcs[0])[n.arg[0]].outer, set()).add(("n", DType.FLOAT32))
    for c, (lab, form) in bound.items():
        forms.setdefault(lab, set()).add((form, c.arg[2]))
    taken = {c.arg[0] for c in _scalar_constants(spec) if c not in bound}
    extents, rescale = {}, {}
    for lab in analysis.labels:
        if not shrinks(lab):
            extents[lab] = lab.extent
        elif lab in forms:
            lab_forms = sorted(forms[lab], key=lambda f: (f[0], f[1].value))
            value = next((v for v in _reduced_choices(lab.extent, limit)
                          if not taken & set(_extent_values(lab_forms, v))), lab.extent)
            extents[lab] = value
            for small, real in zip(_extent_values(lab_forms, value),
                                   _extent_values(lab_forms, lab.extent)):
                taken.add(small)
                rescale[small] = real
        else:
            extents[lab] = limit
    for out, total in _concat_axes(spec, analysis, extents):
        if out not in forms and out not in fixed:
            extents[out] = total       # the whole is its parts (in program order: nested too)
    return extents, rescale


def _concat_axes(spec, analysis, extents):
    """(the label of each concat's axis, the sum of its parts' extents under `extents`)."""
    for node in spec.nodes:
        if node.op is KOp.CONCAT and node.shape[node.arg] > 1:
            parts = [analysis.of(s)[node.arg] for s in node.srcs]
            yield analysis.of(node)[node.arg].outer, sum(
                1 if p is UNIT_DIM else _extent(p, extents) for p in parts)


def concat_labels(spec: KernelGraph, analysis: LabelAnalysis) -> frozenset:
    """The labels of every concat's axis, the whole's and its parts'."""
    return frozenset(analysis.of(n)[node.arg].outer for node in spec.nodes
                     if node.op is KOp.CONCAT for n in (node, *node.srcs)
                     if n.shape[node.arg] > 1)


def reshaped_labels(spec: KernelGraph, analysis: LabelAnalysis) -> frozenset:
    """The labels of the dims a reshape splits or merges (and the dims beside them): their
    extents are tied by a product."""
    return frozenset(analysis.of(n)[d].outer for node in spec.nodes
                     if node.op is KOp.RESHAPE and not same_extents(node.shape, node.srcs[0].shape)
                     for n in (node, node.srcs[0]) for d in range(n.rank) if n.shape[d] > 1)


def _reduced_choices(extent: int, limit: int):
    """Reduced extents for a label longer than `limit`, preferred first: the multiples of `limit`
    that divide it where there are some, else `limit` and up."""
    if extent % limit == 0:
        return (v for v in range(limit, extent + 1, limit) if extent % v == 0)
    return iter(range(limit, extent + 1))


def rescaled_shape(labels, extents) -> tuple:
    return tuple(1 if dl is UNIT_DIM else _extent(dl, extents) for dl in labels)


def _extent(dl, extents) -> int:
    n = 1
    for f in dl.factors:
        n *= extents.get(f, f.extent)
    return n


def reinstantiate_spec(spec: KernelGraph, analysis: LabelAnalysis, extents: dict) -> KernelGraph:
    """The spec with every label at its new extent, and the constants that depend on an extent
    re-derived from it (1/n of a mean over a shorter dim is 1/n of the new n)."""
    bound = extent_constants(spec, analysis, lambda lab: extents.get(lab, lab.extent) != lab.extent)
    mapping: dict[KNode, KNode] = {}
    for node in spec.nodes:
        shape = rescaled_shape(analysis.of(node), extents)
        mapping[node] = _rebuild_kernel_node(node, mapping, shape)
        remember_resize(node, mapping[node])
        if node in bound:
            lab, form = bound[node]
            value = _rounded(EXTENT_FORMS[form](extents[lab]), node.arg[2])
            mapping[node] = KNode(KOp.CONSTANT, (), (value,) + node.arg[1:])
    return KernelGraph([mapping[o] for o in spec.outputs], [mapping[i] for i in spec.inputs],
                       spec.output_names)


def _rebuild_kernel_node(node: KNode, mapping, shape) -> KNode:
    srcs = tuple(mapping[s] for s in node.srcs)
    arg = node.arg
    if node.op is KOp.INPUT:
        arg = (arg[0], shape, arg[2])
    elif node.op in (KOp.RESHAPE, KOp.BROADCAST):
        arg = shape
    elif node.op is KOp.SLICE:   # its sliced dims are rigid; the others take the new extents
        starts, limits = arg
        full = [a == 0 and b == n for a, b, n in zip(starts, limits, node.srcs[0].shape)]
        arg = (starts, tuple(m if whole else b for whole, b, m in zip(full, limits, shape)))
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
            elif node.op in (KOp.RESHAPE, KOp.SLICE, KOp.BROADCAST):
                mapping[node] = resized_view(node, srcs[0])
            else:
                mapping[node] = KNode(node.op, srcs, _constant_arg(node, constants))
        return KernelGraph([mapping[o] for o in graph.outputs], inputs, graph.output_names)
    except InvalidGraph:
        return None


def _constant_arg(node, constants: dict):
    """A node's argument at the new shapes: an extent constant takes its value there."""
    arg = node.arg
    if node.op in (KOp.CONSTANT, BOp.CONSTANT) and arg[0] in constants:
        return (constants[arg[0]],) + tuple(arg[1:])
    if node.op is BOp.THREAD:
        return map_constants(arg, lambda v: constants.get(v, v))
    return arg


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
        mapping[node] = BNode(node.op, tuple(mapping[s] for s in node.srcs),
                              _constant_arg(node, constants))
    outputs = []
    for out in g.outputs:
        new = mapping[out.node]
        shape = list(new.shape)
        for axis, dim in enumerate(out.omap):
            if dim is not None:
                shape[dim] *= grid[axis]
        outputs.append(BlockOutput(new, out.omap, out.dtype, tuple(shape)))
    return BlockGraph(grid, g.threads, forloop, tuple(mapping[n] for n in g.inputs), tuple(outputs))
