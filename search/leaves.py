"""Constant leaves (IOTA, TABLE) as named inputs of the structure search, and back into the sized
winners.

An iota is a tensor a program computes from shapes alone (a causal mask's row and column
indices); a table one it holds (RoPE's cos and sin). The search sees each one as one more
input, named `%iota<k>` / `%table<k>`, so dim labels, reduced shapes, tiling (imap/fmap give
every block its own slice) and re-sizing treat it like any tensor, with no rule of their own. A
structure verified at reduced shapes is then verified for every value of that tensor, the real
one included; `restore` puts the leaf back, at the real shapes, into each sized candidate before
it is ranked and checked against the spec. A table's values fix its shape: its dims are rigid
(`labels.analyze`), so the reduced instantiation keeps them.
"""
from __future__ import annotations

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.node import kernel_input
from mugraph.ir.ops import KOp


PREFIX = "%iota"
TABLE_PREFIX = "%table"
_PREFIXES = {KOp.IOTA: PREFIX, KOp.TABLE: TABLE_PREFIX}


def is_index_leaf(node: KNode) -> bool:
    """Whether `node` is an input standing for an iota (see `index_inputs`)."""
    return node.op is KOp.INPUT and node.arg[0].startswith(PREFIX)


def _rebuilt(graph: KernelGraph, mapping: dict) -> list:
    """The outputs of `graph` with nodes replaced as `mapping` says (sources first)."""
    for node in graph.nodes:
        if node in mapping:
            continue
        srcs = tuple(mapping.get(s, s) for s in node.srcs)
        mapping[node] = node if srcs == node.srcs else node.replace(srcs=srcs)
    return [mapping[o] for o in graph.outputs]


def index_inputs(spec: KernelGraph) -> tuple[KernelGraph, dict[str, KNode]]:
    """`spec` with every IOTA and TABLE leaf read as an input, and {input name: the leaf}."""
    found = [n for n in spec.nodes if n.op in _PREFIXES]
    if not found:
        return spec, {}
    taken, leaves, mapping, counts = set(spec.input_names), {}, {}, {}
    for node in found:
        prefix = _PREFIXES[node.op]
        name = f"{prefix}{counts.setdefault(prefix, 0)}"
        counts[prefix] += 1
        while name in taken:
            name += "_"
        taken.add(name)
        leaves[name] = node
        mapping[node] = kernel_input(name, node.shape, node.dtype)
    outputs = _rebuilt(spec, mapping)
    inputs = list(spec.inputs) + [mapping[n] for n in found]
    return KernelGraph(outputs, inputs, spec.output_names), leaves


def leaves_as_inputs(graph: KernelGraph, leaves: dict[str, KNode], indexed: KernelGraph):
    """`graph` (a sized winner, its leaves in place) over `indexed`'s inputs, the inverse of
    `restore`: each IOTA or TABLE read as the input the spec's same leaf became (`leaves` and
    `indexed` from `index_inputs` of the spec); None when it holds a leaf the spec does not."""
    if not leaves:
        return graph
    named = {leaf: name for name, leaf in leaves.items()}
    by_name = {n.arg[0]: n for n in indexed.inputs}
    mapping = {}
    for node in graph.nodes:
        if node.op in _PREFIXES:
            if node not in named:
                return None
            mapping[node] = by_name[named[node]]
    return KernelGraph(_rebuilt(graph, mapping), list(graph.inputs) + [by_name[n] for n in leaves],
                       graph.output_names)


def restore(graph: KernelGraph, leaves: dict[str, KNode], spec_inputs) -> KernelGraph:
    """`graph` (over the spec's inputs and the leaf inputs, at any shapes) with each `%iota`
    input replaced by the IOTA leaf of its shape and each `%table` input by its TABLE; its
    inputs are `spec_inputs` again."""
    if not leaves:
        return graph
    mapping = {}
    for node in graph.inputs:
        leaf = leaves.get(node.arg[0])
        if leaf is not None and leaf.op is KOp.IOTA:
            mapping[node] = KNode(KOp.IOTA, (), (node.shape, leaf.arg[1], leaf.arg[2]))
        elif leaf is not None:
            mapping[node] = leaf    # rigid dims: the same shape at every instantiation
    return KernelGraph(_rebuilt(graph, mapping), list(spec_inputs), graph.output_names)
