"""The thread level in C: a thread graph (a DAG of elementwise ops) as one register expression.

A THREAD node renders as an immediately invoked lambda over its operands' fp32 values: each op of
the graph is one `const float` local, so a value read twice (x in gelu's polynomial) is computed
once, and the whole chain stays in registers wherever the node is read or stored.
"""
from __future__ import annotations

from mugraph.codegen.snippets import elementwise, literal
from mugraph.ir.thread import Leaf, TNode, tnodes


def render_thread(root: TNode, args: list[str]) -> str:
    """The C expression of `root` applied to the fp32 expressions `args` (one per operand)."""
    names: dict = {}
    lines = []
    for t in tnodes(root):
        if t.op is Leaf.PARAM:
            names[t] = f"a{t.arg}"
        elif t.op is Leaf.CONST:
            names[t] = literal(t.arg)
        else:
            names[t] = f"t{len(lines)}"
            body = elementwise(t.op, [names[s] for s in t.srcs], t.arg)
            lines.append(f"const float {names[t]} = {body};")
    params = ", ".join(f"float a{i}" for i in range(len(args)))
    return f"[]({params}) {{ {' '.join(lines)} return {names[root]}; }}({', '.join(args)})"
