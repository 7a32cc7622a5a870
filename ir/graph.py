"""Kernel graphs: a whole tensor program on the device, as interned nodes from inputs to outputs."""
from __future__ import annotations

import hashlib

from mugraph.ir.errors import InvalidGraph
from mugraph.ir.node import KNode, _Interned, toposort
from mugraph.ir.ops import KOp


class KernelGraph(_Interned):
    """Named inputs, output tensors (optionally named), and every node between them.

    Frozen and interned: two graphs with the same inputs and outputs are the same object.
    """

    __slots__ = ("inputs", "outputs", "output_names")

    def __new__(cls, outputs, inputs=None, output_names=None):
        outputs = (outputs,) if isinstance(outputs, KNode) else tuple(outputs)
        if inputs is None:
            inputs = [n for n in toposort(outputs) if isinstance(n, KNode) and n.op is KOp.INPUT]
        inputs = tuple(inputs)
        names = tuple(output_names) if output_names is not None else \
            tuple(f"out{i}" for i in range(len(outputs)))
        key = (inputs, outputs, names)

        def build(obj):
            for name, value in zip(cls.__slots__, key):
                object.__setattr__(obj, name, value)
            check_kernel_graph(obj)

        return cls._intern(key, build)

    def __reduce__(self):
        # the interning key is (inputs, outputs, names); the constructor takes outputs first
        return (type(self), (self.outputs, self.inputs, self.output_names))

    @property
    def nodes(self) -> list[KNode]:
        """Every node, sources first (inputs that no output uses are still listed, first)."""
        return toposort(self.inputs + self.outputs)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.arg[0] for n in self.inputs)

    def custom_ops(self) -> list[tuple]:
        """The distinct custom kernels: (block graph, sources) in program order."""
        seen = {}
        for n in self.nodes:
            if n.op is KOp.CUSTOM:
                seen.setdefault((n.arg[0], n.srcs), None)
        return list(seen)

    def digest(self) -> str:
        """A stable structural hash (the sha256 of the canonical JSON), for caches and reports."""
        from mugraph.ir.serialize import to_json
        return hashlib.sha256(to_json(self, indent=None).encode()).hexdigest()

    def __repr__(self) -> str:
        ins = ", ".join(f"{n.arg[0]}:{n.dtype.short}{list(n.shape)}" for n in self.inputs)
        return f"KernelGraph({ins} -> {len(self.outputs)} outputs, {len(self.nodes)} nodes)"

    def __str__(self) -> str:
        from mugraph.ir.printer import format_kernel_graph
        return format_kernel_graph(self)


def check_kernel_graph(g: KernelGraph) -> None:
    """Raise InvalidGraph unless inputs are named INPUT nodes covering every input used."""
    if not g.outputs:
        raise InvalidGraph("a kernel graph needs at least one output", field="outputs")
    for i, out in enumerate(g.outputs):
        if not isinstance(out, KNode):
            raise InvalidGraph(f"{out!r} is not a kernel tensor", field=f"outputs[{i}]")
    names = set()
    for i, node in enumerate(g.inputs):
        if not isinstance(node, KNode) or node.op is not KOp.INPUT:
            raise InvalidGraph(f"{node!r} is not an input node", field=f"inputs[{i}]")
        if node.arg[0] in names:
            raise InvalidGraph(f"two inputs are named {node.arg[0]!r}", field=f"inputs[{i}]",
                               hint="input names must be unique")
        names.add(node.arg[0])
    for node in toposort(g.outputs):
        if node.op is KOp.INPUT and node not in g.inputs:
            raise InvalidGraph(f"input {node.arg[0]!r} is used but not listed in the graph's inputs",
                               field="inputs")
    for i, name in enumerate(g.output_names):
        if not isinstance(name, str) or not name:
            raise InvalidGraph(f"output name {name!r} is not a non-empty string",
                               field=f"output_names[{i}]")
    if len(g.output_names) != len(g.outputs) or len(set(g.output_names)) != len(g.outputs):
        raise InvalidGraph(f"output names {g.output_names!r} must be unique, one per output",
                           field="output_names")
