"""Text pictures of the IR: kernel graphs as numbered ops, block graphs as the loop nest they run."""
from __future__ import annotations

from mugraph.ir.block import AXES, BlockGraph, Phase
from mugraph.ir.node import BNode, KNode
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.ir.thread import chain_links


def _ty(node) -> str:
    return f"{node.dtype.short}[{','.join(map(str, node.shape))}]"


def _arg(node) -> str:
    op, arg = node.op, node.arg
    if arg is None:
        return ""
    if op in (KOp.CONSTANT, BOp.CONSTANT):
        return f"{arg[0]:g}"
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, BOp.REDUCE_SUM, BOp.REDUCE_MAX, KOp.CONCAT):
        return f"dim={arg}"
    if op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return f"dim={arg[0]}, eps={arg[1]:g}"
    if op is TOp.CLAMP:
        return f"{arg[0]:g}, {arg[1]:g}"
    if op is TOp.CAST:
        return arg.short
    if op in (KOp.TRANSPOSE, KOp.RESHAPE, KOp.BROADCAST):
        return ",".join(map(str, arg))
    if op is KOp.IOTA:
        return f"dim={arg[1]}"
    if op is KOp.TABLE:
        return f"#{arg[0].digest}"
    if op is KOp.SLICE:
        return ",".join(f"{a}:{b}" for a, b in zip(*arg))
    return str(arg)


def _call(node, names) -> str:
    parts = [names[s] for s in node.srcs]
    extra = _arg(node)
    if extra:
        parts.append(extra)
    return f"{node.op.value}({', '.join(parts)})"


# ---- kernel graphs -------------------------------------------------------------------------------
def format_kernel_graph(g) -> str:
    names, kernels, lines = {}, {}, []
    ins = ", ".join(f"{n.arg[0]}: {_ty(n)}" for n in g.inputs)
    lines.append(f"kernel graph ({ins})")
    for i, node in enumerate(g.nodes):
        names[node] = f"%{i}"
        if node.op is KOp.INPUT:
            rhs = f"input {node.arg[0]!r}"
        elif node.op is KOp.CUSTOM:
            k = kernels.setdefault((node.arg[0], node.srcs), f"k{len(kernels)}")
            rhs = f"custom {k}.out{node.arg[1]}({', '.join(names[s] for s in node.srcs)})"
        else:
            rhs = _call(node, names)
        lines.append(f"  {names[node]:>4} = {rhs:<44} {_ty(node)}")
    outs = ", ".join(f"{name} = {names[o]}" for name, o in zip(g.output_names, g.outputs))
    lines.append(f"  return {outs}")
    for (bg, srcs), k in kernels.items():
        lines.append("")
        lines.append(f"{k}: " + format_block_graph(bg, [names[s] for s in srcs]))
    return "\n".join(lines)


# ---- block graphs as loop nests ------------------------------------------------------------------
def _index(spec, tile) -> str:
    """The slice expression of an input tile: which block and which iteration reads what."""
    parts = []
    for dim, (full, t) in enumerate(zip(spec.shape, tile)):
        terms = [f"{full // spec.grid[a]}*b{AXES[a]}" for a, d in enumerate(spec.imap) if d == dim]
        if spec.fmap == dim:
            terms.append(f"{t}*i")
        if not terms and t == full:
            parts.append(":")
        else:
            lo = "+".join(terms) or "0"
            parts.append(f"{lo}:{lo}+{t}" if terms else f"0:{t}")
    return "[" + ", ".join(parts) + "]"


def _out_index(out) -> str:
    parts = []
    for dim, t in enumerate(out.node.shape):
        axes = [AXES[a] for a, d in enumerate(out.omap) if d == dim]
        parts.append(f"{t}*b{axes[0]}:{t}*b{axes[0]}+{t}" if axes else ":")
    return "[" + ", ".join(parts) + "]"


def format_block_graph(g: BlockGraph, src_names=None) -> str:
    src_names = src_names or [f"in{i}" for i in range(len(g.inputs))]
    phase = g.phases()
    fused = chain_links([o.node for o in g.outputs])
    names = {n: f"t{i}" for i, n in enumerate(g.nodes)}
    gx, gy, gz = g.grid
    lines = [f"block graph, grid ({gx},{gy},{gz}) = {g.num_blocks} blocks x {g.threads} threads, "
             f"forloop {g.forloop}",
             f"  for (bx, by, bz) in grid({gx}, {gy}, {gz}):"]

    def emit(node, indent):
        if node.op is BOp.INPUT:
            spec = node.arg
            rhs = f"{src_names[spec.index]}{_index(spec, node.shape)}"
        else:
            rhs = _call(node, names)
        tag = "  # thread" if node in fused else ""
        lines.append(f"{indent}{names[node]} = {rhs:<40} {_ty(node)}{tag}")

    nodes = g.nodes
    for n in (n for n in nodes if phase[n] is Phase.INVARIANT):
        emit(n, "    ")
    accs = [n for n in nodes if phase[n] is Phase.ACCUMULATOR]
    looped = g.forloop > 1     # one iteration prints no loop: an accumulator holds its one value
    if looped and accs:
        lines.append("    " + "; ".join(f"{names[a]} = {_init(a)}" for a in accs))
    if looped:
        lines.append(f"    for i in range({g.forloop}):")
    for n in (n for n in nodes if phase[n] in (Phase.LOOP, Phase.ACCUMULATOR)):
        emit(n, "      " if looped else "    ")
    for n in (n for n in nodes if phase[n] is Phase.EPILOGUE):
        emit(n, "    ")
    for i, out in enumerate(g.outputs):
        lines.append(f"    out{i}{_out_index(out)} = {names[out.node]} as {out.dtype.short}"
                     f"    # out{i}: {out.dtype.short}[{','.join(map(str, out.shape))}]")
    return "\n".join(lines)


def _init(acc) -> str:
    return "-inf" if acc.op in (BOp.ACC_MAX, BOp.ACC_MAX_LAST) else "0"


def format_block_node(node: BNode, graph: BlockGraph) -> str:
    names = {n: f"t{i}" for i, n in enumerate(graph.nodes)}
    for s in node.srcs:
        names.setdefault(s, "?")
    names.setdefault(node, "?")
    return f"{names[node]} = {_call(node, names)}  {_ty(node)}"


def format_node(node) -> str:
    """One line for a node, with its sources' types: used in error messages."""
    if isinstance(node, KNode) and node.op is KOp.INPUT:
        return f"input {node.arg[0]!r} {_ty(node)}"
    srcs = ", ".join(_ty(s) for s in node.srcs)
    return f"{node.op.value}({srcs}) -> {_ty(node)}"
