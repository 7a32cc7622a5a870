"""Pictures of the IR as plain SVG (no system binaries): the kernel graph's ops top to bottom with
their data-flow edges, and each custom op's block graph nested in its box — grid, inputs with
their imap/fmap tiles, the for-loop with its body and accumulators, the epilogue, thread-level
chains (register epilogues) and outputs with their omap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from mugraph.ir.block import AXES, BlockGraph, Phase
from mugraph.ir.node import BNode
from mugraph.ir.ops import BOp, KOp
from mugraph.ir.printer import _call, _index, _out_index, _ty
from mugraph.ir.thread import chain_links, text as thread_text

CHAR_W, LINE_H, PAD, GAP, MARGIN = 7.2, 18, 8, 6, 60
STYLES = {   # fill, stroke, dash
    "kernel": ("#ffffff", "#333333", ""), "input": ("#eef6ff", "#4a7ab5", ""),
    "op": ("#f7f7f7", "#888888", ""), "custom": ("#fff8e6", "#c08a00", ""),
    "loop": ("#fbfbff", "#6a6ad0", "5,3"), "acc": ("#ffeef0", "#c0394b", ""),
    "thread": ("#eefaf0", "#2e8b57", ""), "output": ("#f3eefc", "#7b4fc0", ""),
    "note": ("#ffffff", "#ffffff", ""),
}


@dataclass
class Row:
    """One line of text in a box: an op, an input tile, an output."""

    text: str
    style: str = "op"
    key: object = None          # the IR node it shows (kernel rows get edges)


@dataclass
class Frame:
    """A titled box of rows and frames, stacked top to bottom."""

    title: str
    style: str
    items: list = field(default_factory=list)
    key: object = None
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0


# ---- from the IR to frames -------------------------------------------------------------------------
def kernel_frame(graph) -> tuple[Frame, dict]:
    """The kernel graph as a frame; also the name (%i) of every node."""
    names, kernels = {}, {}
    ins = ", ".join(f"{n.arg[0]}: {_ty(n)}" for n in graph.inputs)
    frame = Frame(f"kernel graph ({ins})", "kernel")
    for i, node in enumerate(graph.nodes):
        names[node] = f"%{i}"
        if node.op is KOp.INPUT:
            frame.items.append(Row(f"%{i} = input {node.arg[0]!r}   {_ty(node)}", "input", node))
        elif node.op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            label = f"%{i} = custom k{kernels.setdefault(key, len(kernels))}.out{node.arg[1]}" \
                    f"({', '.join(names[s] for s in node.srcs)})   {_ty(node)}"
            if kernels[key] == len(kernels) - 1 and not any(
                    isinstance(it, Frame) and it.key == key for it in frame.items):
                block = block_frame(node.arg[0], [names[s] for s in node.srcs],
                                    f"k{kernels[key]}")
                block.key = key
                frame.items.append(Row(label, "custom", node))
                frame.items.append(block)
            else:
                frame.items.append(Row(label, "custom", node))
        else:
            frame.items.append(Row(f"%{i} = {_call(node, names)}   {_ty(node)}", "op", node))
    outs = ", ".join(f"{name} = {names[o]}" for name, o in zip(graph.output_names, graph.outputs))
    frame.items.append(Row(f"return {outs}", "output"))
    return frame, names


def block_frame(g: BlockGraph, src_names, label: str) -> Frame:
    """One block graph: what each block reads, its loop, accumulators, epilogue and outputs."""
    gx, gy, gz = g.grid
    frame = Frame(f"{label}: grid ({gx},{gy},{gz}) = {g.num_blocks} blocks x {g.threads} threads,"
                  f" forloop {g.forloop}", "custom")
    phase = g.phases()
    chained = chain_links([o.node for o in g.outputs])
    names = {n: f"t{i}" for i, n in enumerate(g.nodes)}
    inputs = Frame("inputs (imap: grid axis -> dim split; fmap: dim the loop walks)", "input")
    for node in g.inputs:
        spec = node.arg
        imap = ", ".join(f"{AXES[a]}->{d}" for a, d in enumerate(spec.imap) if d is not None)
        inputs.items.append(Row(f"{names[node]} = {src_names[spec.index]}{_index(spec, node.shape)}"
                                f"   imap {{{imap or 'none'}}}  fmap {spec.fmap}   {_ty(node)}",
                                "input", node))
    frame.items.append(inputs)
    before = [n for n in g.nodes if phase[n] is Phase.INVARIANT and n.op is not BOp.INPUT]
    if before:
        frame.items.append(_ops_frame("before the loop", before, names, chained, "op"))
    body = [n for n in g.nodes if phase[n] in (Phase.LOOP, Phase.ACCUMULATOR)
            and n.op is not BOp.INPUT]
    frame.items.append(_ops_frame(f"for i in range({g.forloop})", body, names, chained, "loop",
                                  phase))
    after = [n for n in g.nodes if phase[n] is Phase.EPILOGUE]
    if after:
        frame.items.append(_ops_frame("epilogue (after the loop)", after, names, chained, "op"))
    outputs = Frame("outputs (omap: grid axis -> output dim)", "output")
    for i, out in enumerate(g.outputs):
        omap = ", ".join(f"{AXES[a]}->{d}" for a, d in enumerate(out.omap) if d is not None)
        outputs.items.append(Row(f"out{i}{_out_index(out)} = {names[out.node]} as "
                                 f"{out.dtype.short}   omap {{{omap or 'none'}}}   "
                                 f"{out.dtype.short}[{','.join(map(str, out.shape))}]", "output"))
    frame.items.append(outputs)
    return frame


def _ops_frame(title, nodes, names, chained, style, phase=None) -> Frame:
    frame = Frame(title, style)
    for node in nodes:
        frame.items.append(_op_item(node, names, chained, phase))
    return frame


def _op_item(node: BNode, names, chained, phase):
    line = f"{names[node]} = {_call(node, names)}   {_ty(node)}"
    if node.op is BOp.THREAD:
        inner = Frame(f"thread graph (registers): {names[node]}", "thread", key=node)
        inner.items.append(Row(f"{names[node]} = {thread_text(node.arg)}   {_ty(node)}",
                               "thread", node))
        inner.items.append(Row("params: " + ", ".join(f"p{i} = {names[s]}"
                                                        for i, s in enumerate(node.srcs)), "note"))
        return inner
    if phase is not None and phase[node] is Phase.ACCUMULATOR:
        return Row(line + "   (accumulator)", "acc", node)
    if node in chained:
        return Row(line + "   (thread-level chain)", "thread", node)
    return Row(line, "op", node)


# ---- layout ----------------------------------------------------------------------------------------
def measure(item) -> tuple[float, float]:
    if isinstance(item, Row):
        return len(item.text) * CHAR_W + 2 * PAD, LINE_H + 6
    sizes = [measure(child) for child in item.items]
    w = max([len(item.title) * CHAR_W + 2 * PAD] + [s[0] + 2 * PAD for s in sizes])
    h = LINE_H + PAD + sum(s[1] + GAP for s in sizes) + PAD
    item.w, item.h = w, h
    return w, h


def place(item, x: float, y: float, width: float, rows: dict) -> None:
    """Positions for `item` and its children; kernel rows' centres go to `rows` (for edges)."""
    if isinstance(item, Row):
        if item.key is not None:
            rows[item.key] = (x, y + (LINE_H + 6) / 2)
        item.x, item.y, item.w = x, y, width
        return
    item.x, item.y, item.w = x, y, width
    cy = y + LINE_H + PAD
    for child in item.items:
        w, h = measure(child)
        place(child, x + PAD, cy, width - 2 * PAD, rows)
        cy += h + GAP


# ---- rendering -------------------------------------------------------------------------------------
def render(item, out: list) -> None:
    if isinstance(item, Row):
        fill, stroke, dash = STYLES[item.style]
        out.append(f'<g class="row {item.style}"><rect x="{item.x:.1f}" y="{item.y:.1f}" '
                   f'width="{item.w:.1f}" height="{LINE_H + 2}" rx="3" fill="{fill}" '
                   f'stroke="{stroke}"/><text xml:space="preserve" x="{item.x + PAD:.1f}" y="{item.y + LINE_H - 4:.1f}">'
                   f'{escape(item.text)}</text></g>')
        return
    fill, stroke, dash = STYLES[item.style]
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    out.append(f'<g class="frame {item.style}"><rect x="{item.x:.1f}" y="{item.y:.1f}" '
               f'width="{item.w:.1f}" height="{item.h:.1f}" rx="6" fill="{fill}" '
               f'stroke="{stroke}"{dashed}/><text class="title" x="{item.x + PAD:.1f}" '
               f'y="{item.y + LINE_H - 2:.1f}">{escape(item.title)}</text>')
    for child in item.items:
        render(child, out)
    out.append("</g>")


def _edges(graph, rows: dict) -> list[str]:
    """Kernel-level data flow: a curve in the left margin from each source to its consumer."""
    out = []
    for node in graph.nodes:
        for src in dict.fromkeys(node.srcs):
            if src in rows and node in rows:
                (x0, y0), (x1, y1) = rows[src], rows[node]
                bend = max(8.0, min(MARGIN - 6, (y1 - y0) / 6))
                out.append(f'<path class="edge" d="M {x0:.1f} {y0:.1f} C {x0 - bend:.1f} '
                           f'{y0:.1f}, {x1 - bend:.1f} {y1:.1f}, {x1:.1f} {y1:.1f}" fill="none" '
                           f'stroke="#555" marker-end="url(#arrow)"/>')
    return out


def to_svg(graph, title: str | None = None) -> str:
    """The kernel graph (a KernelGraph) as a standalone SVG document."""
    frame, _ = kernel_frame(graph)
    if title:
        frame.title = f"{title} - {frame.title}"
    w, h = measure(frame)
    rows: dict = {}
    place(frame, MARGIN, 10, w, rows)
    body: list[str] = []
    render(frame, body)
    width, height = w + MARGIN + 20, h + 20
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans Mono, Menlo, monospace"'
        f' font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker>'
        '</defs>',
        '<style>.title { font-weight: bold; } text { white-space: pre; }</style>',
        *body, *_edges(graph, rows), "</svg>"])


def to_html(graph, text: str = "", title: str = "mugraph kernel") -> str:
    """A page with the SVG picture and, below it, `text` (the loop nest and the report)."""
    return "\n".join([
        "<!DOCTYPE html>", '<html><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title></head><body>", f"<h1>{escape(title)}</h1>",
        to_svg(graph), f"<pre>{escape(text)}</pre>" if text else "", "</body></html>"])
