"""Index leaves (IOTA) as named inputs of the structure search, and back into the sized winners.

An iota is a tensor a program computes from shapes alone (a causal mask's row and column
indices). The search sees each one as one more input, named `%iota<k>`, so dim labels, reduced
shapes, tiling (imap/fmap give every block its own slice of indices) and re-sizing treat it like
any tensor, with no rule of their own. A structure verified at reduced shapes is then verified
for every value of that tensor, the real indices included; `restore` puts the IOTA leaf back,
at the real shapes, into each sized candidate before it is ranked and checked against the spec.
"""
from __future__ import annotations

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.node import kernel_input
from mugraph.ir.ops import KOp


PREFIX = "%iota"


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
    """`spec` with every IOTA leaf read as an input, and {input name: the IOTA it stands for}."""
    iotas = [n for n in spec.nodes if n.op is KOp.IOTA]
    if not iotas:
        return spec, {}
    taken, leaves, mapping = set(spec.input_names), {}, {}
    for k, node in enumerate(iotas):
        name = f"{PREFIX}{k}"
        while name in taken:
            name += "_"
        taken.add(name)
        leaves[name] = node
        mapping[node] = kernel_input(name, node.shape, node.dtype)
    outputs = _rebuilt(spec, mapping)
    inputs = list(spec.inputs) + [mapping[n] for n in iotas]
    return KernelGraph(outputs, inputs, spec.output_names), leaves


def restore(graph: KernelGraph, leaves: dict[str, KNode], spec_inputs) -> KernelGraph:
    """`graph` (over the spec's inputs and the `%iota` inputs, at any shapes) with each `%iota`
    input replaced by the IOTA leaf of its shape; its inputs are `spec_inputs` again."""
    if not leaves:
        return graph
    mapping = {}
    for node in graph.inputs:
        iota = leaves.get(node.arg[0])
        if iota is not None:
            mapping[node] = KNode(KOp.IOTA, (), (node.shape, iota.arg[1], iota.arg[2]))
    return KernelGraph(_rebuilt(graph, mapping), list(spec_inputs), graph.output_names)
