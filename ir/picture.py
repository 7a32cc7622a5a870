"""Pictures of the IR as plain SVG (no system binaries): the kernel graph as a layered DAG, each
custom op's block graph nested in its box (grid and threads, input tiles with imap/fmap, the
for-loop as a region, accumulators, register chains, outputs with omap) and each thread-level
op's DAG of elementwise ops nested in turn; laid out by `ir.layered`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from mugraph.ir.block import AXES, BlockGraph, Phase
from mugraph.ir.layered import Edge, Layout, layout, longest_path_ranks, sink_leaves
from mugraph.ir.ops import ACCUMULATORS, BOp, KOp, RUNNING_ACCUMULATORS
from mugraph.ir.printer import _arg, _call, _index, _out_index, _ty
from mugraph.ir.thread import Leaf, chain_links, tnodes

CHAR_W, LINE_H, PAD, MARGIN, REGION_HEAD, REGION_PAD = 7.2, 16.0, 6.0, 12.0, 24.0, 8.0
FONT = 12
STYLES = {   # kind: fill, stroke, dash
    "kernel": ("#ffffff", "#333333", ""), "input": ("#e8f1fc", "#4a7ab5", ""),
    "op": ("#f4f4f4", "#7a7a7a", ""), "constant": ("#ffffff", "#9a9a9a", "3,2"),
    "custom": ("#fff8e6", "#c08a00", ""), "tile": ("#e8f1fc", "#4a7ab5", ""),
    "acc": ("#ffecee", "#c0394b", ""), "chain": ("#e9f8ee", "#2e8b57", ""),
    "thread": ("#f1fbf4", "#2e8b57", ""), "param": ("#ffffff", "#2e8b57", "3,2"),
    "top": ("#e2f5e8", "#2e8b57", ""), "output": ("#f1ebfb", "#7b4fc0", ""),
    "loop": ("#f6f6ff", "#6a6ad0", "6,3"),
    "jax": ("#f3f3f3", "#8a8a8a", "5,3"), "program": ("#ffffff", "#333333", ""),
}
EDGE = {"kernel": ("#444444", 1.6), "block": ("#555555", 1.2), "thread": ("#2e6b47", 1.0)}


@dataclass
class Box:
    """One node of a picture: a few lines of text and maybe a nested diagram below them."""

    id: str
    kind: str
    lines: list
    inner: "Diagram | None" = None
    in_ports: dict = field(default_factory=dict)    # port -> key of the inner box it enters
    out_ports: dict = field(default_factory=dict)   # port -> key of the inner box it leaves

    @property
    def w(self) -> float:
        text = max(len(line) for line in self.lines) * CHAR_W + 2 * PAD
        return max(text, self.inner.w + 2 * PAD if self.inner else 0.0)

    @property
    def h(self) -> float:
        text = len(self.lines) * LINE_H + 2 * PAD
        return text + (self.inner.h + PAD if self.inner else 0.0)

    def inner_origin(self) -> tuple[float, float]:
        return (self.w - self.inner.w) / 2, len(self.lines) * LINE_H + 2 * PAD

    def port_dx(self, port, outgoing: bool) -> float:
        """Where an edge for `port` meets this box, from its centre: above or below the inner box
        the port names, else the centre."""
        key = (self.out_ports if outgoing else self.in_ports).get(port)
        if key is None or self.inner is None:
            return 0.0
        x0, _ = self.inner_origin()
        (bx, _), inner = self.inner.lay.xy[key], self.inner.boxes[key]
        return x0 + MARGIN + bx + inner.w / 2 - self.w / 2


@dataclass
class Region:
    """A titled band of layers drawn behind their boxes (the for-loop)."""

    title: str
    first: int
    last: int
    kind: str = "loop"


@dataclass
class Diagram:
    """Boxes on ranks with edges between them (ports name where), laid out on construction."""

    level: str
    boxes: dict
    edges: list        # (src key, dst key, src port, dst port)
    rank: dict
    regions: list = field(default_factory=list)

    def __post_init__(self):
        heads = {r.first for r in self.regions}
        tails = {r.last + 1 for r in self.regions}
        self.layout_edges = [Edge(s, d, self.boxes[s].port_dx(sp, True),
                                  self.boxes[d].port_dx(dp, False))
                             for s, d, sp, dp in self.edges]
        self.lay: Layout = layout({k: (b.w, b.h) for k, b in self.boxes.items()}, self.rank,
                                  self.layout_edges,
                                  lambda r: (REGION_HEAD if r in heads else 0.0)
                                  + (REGION_PAD if r in tails else 0.0))
        self.w = self.lay.width + 2 * MARGIN
        tail = REGION_PAD if any(r.last == len(self.lay.layer_top) - 1 for r in self.regions) \
            else 0.0
        self.h = self.lay.height + 2 * MARGIN + tail


# ---- the kernel graph ------------------------------------------------------------------------------
def kernel_diagram(graph) -> Diagram:
    """The kernel graph: inputs on top, ops and custom kernels (their block graphs inside) by
    longest path, the returned values at the bottom."""
    names, groups, boxes, edges = {}, {}, {}, []
    for i, node in enumerate(graph.nodes):
        names[node] = f"%{i}"
    for node in graph.nodes:
        key = _kernel_key(node, groups)
        if node.op is KOp.CUSTOM:
            if key not in boxes:
                boxes[key] = _custom_box(node, names, graph, groups[key[1:]])
                edges += [(_kernel_key(s, groups), key, _out_port(s), i)
                          for i, s in enumerate(node.srcs)]
            continue
        boxes[key] = _kernel_box(node, names)
        edges += [(_kernel_key(s, groups), key, _out_port(s), None) for s in dict.fromkeys(node.srcs)]
    for name, out in zip(graph.output_names, graph.outputs):
        boxes[("return", name)] = Box(f"return.{name}", "output", [f"return {name} = {names[out]}"])
        edges.append((_kernel_key(out, groups), ("return", name), _out_port(out), None))
    return Diagram("kernel", boxes, edges, _kernel_ranks(boxes, edges))


def _kernel_key(node, groups: dict):
    if node.op is not KOp.CUSTOM:
        return node
    group = (node.arg[0], node.srcs)
    groups.setdefault(group, f"k{len(groups)}")
    return ("custom",) + group


def _out_port(node):
    return node.arg[1] if node.op is KOp.CUSTOM else None


def _kernel_box(node, names) -> Box:
    if node.op is KOp.INPUT:
        return Box(names[node], "input", [f"{names[node]} = input {node.arg[0]!r}", _ty(node)])
    kind = "constant" if node.op is KOp.CONSTANT else "op"
    return Box(names[node], kind, [f"{names[node]} = {_call(node, names)}", _ty(node)])


def _custom_box(node, names, graph, label: str) -> Box:
    bg, srcs = node.arg[0], node.srcs
    outs = [n for n in graph.nodes if n.op is KOp.CUSTOM and n.arg[0] is bg and n.srcs == srcs]
    results = ", ".join(names[n] for n in sorted(outs, key=lambda n: n.arg[1]))
    gx, gy, gz = bg.grid
    inner = block_diagram(bg, [names[s] for s in srcs], label)
    return Box(label, "custom",
               [f"{results} = custom {label}({', '.join(names[s] for s in srcs)})",
                f"grid ({gx},{gy},{gz}) = {bg.num_blocks} blocks x {bg.threads} threads, "
                f"forloop {bg.forloop}"], inner,
               in_ports={n.arg.index: n for n in bg.inputs},
               out_ports={i: ("out", i) for i in range(len(bg.outputs))})


def _kernel_ranks(boxes: dict, edges) -> dict:
    """Longest-path ranks; constants sink next to their reader; the returned values at the bottom."""
    links = [Edge(s, d) for s, d, _, _ in edges]
    rank = longest_path_ranks(list(boxes), links)
    rank = sink_leaves(rank, links, [k for k, b in boxes.items() if b.kind == "constant"])
    returns = [k for k in boxes if _is_return(k)]
    bottom = 1 + max((r for k, r in rank.items() if not _is_return(k)), default=-1)
    return rank | {k: bottom for k in returns}


def _is_return(key) -> bool:
    return isinstance(key, tuple) and key[0] == "return"


# ---- block graphs ----------------------------------------------------------------------------------
_BAND = {Phase.INVARIANT: 0, Phase.LOOP: 1, Phase.ACCUMULATOR: 1, Phase.EPILOGUE: 2}


def block_diagram(g: BlockGraph, src_names, label: str) -> Diagram:
    """One block graph: input tiles, ops before the loop, the loop (a region) with its
    accumulators, the epilogue, the outputs; thread-level ops hold their own DAGs."""
    phase = g.phases()
    chained = chain_links([o.node for o in g.outputs])
    names = {n: f"t{i}" for i, n in enumerate(g.nodes)}
    boxes, edges = {}, []
    for node in g.nodes:
        boxes[node] = _block_box(node, names, src_names, phase, chained, label)
        edges += [(s, node, None, i if node.op is BOp.THREAD else None)
                  for i, s in enumerate(node.srcs)
                  if node.op is BOp.THREAD or s not in node.srcs[:i]]
    for i, out in enumerate(g.outputs):
        omap = _map(out.omap)
        boxes[("out", i)] = Box(f"{label}.out{i}", "output",
                                [f"out{i}{_out_index(out)} = {names[out.node]} as {out.dtype.short}",
                                 f"omap {{{omap}}}   {out.dtype.short}[{','.join(map(str, out.shape))}]"])
        edges.append((out.node, ("out", i), None, None))
    rank, loop = _block_ranks(g, phase, edges)
    return Diagram("block", boxes, edges, rank, [Region(f"for i in range({g.forloop})", *loop)])


def _map(m) -> str:
    return ", ".join(f"{AXES[a]}->{d}" for a, d in enumerate(m) if d is not None) or "none"


def _block_box(node, names, src_names, phase, chained, label: str) -> Box:
    name, ident = names[node], f"{label}.{names[node]}"
    if node.op is BOp.INPUT:
        spec = node.arg
        fmap = "none" if spec.fmap is None else spec.fmap
        return Box(ident, "tile", [f"{name} = {src_names[spec.index]}{_index(spec, node.shape)}",
                                   f"imap {{{_map(spec.imap)}}}  fmap {fmap}   {_ty(node)}"])
    if node.op is BOp.THREAD:
        inner = thread_diagram(node, names, ident)
        return Box(ident, "thread", [f"{name} = thread({', '.join(names[s] for s in node.srcs)})",
                                     f"in registers   {_ty(node)}"], inner,
                   in_ports={i: ("param", i) for i in range(len(node.srcs))},
                   out_ports={None: node.arg})
    line = f"{name} = {_call(node, names)}"
    if node.op in ACCUMULATORS:
        start = "-inf" if node.op in RUNNING_ACCUMULATORS else "0"
        return Box(ident, "acc", [line, f"accumulator from {start}   {_ty(node)}"])
    if node.op is BOp.CONSTANT:
        return Box(ident, "constant", [line, _ty(node)])
    if node in chained:
        return Box(ident, "chain", [line, f"register chain   {_ty(node)}"])
    return Box(ident, "op", [line, _ty(node)])


def _block_ranks(g: BlockGraph, phase, edges) -> tuple[dict, tuple[int, int]]:
    """Longest-path ranks in bands: before the loop, the loop with its accumulators, after the
    loop, the outputs. Tiles sink toward their first reader within their band; constants sink
    next to their reader. Also the loop band's first and last rank."""
    links = [Edge(s, d) for s, d, _, _ in edges]
    rank, spans, start = {}, {}, 0
    for band in range(3):
        members = [n for n in g.nodes if n.op is not BOp.CONSTANT and _BAND[phase[n]] == band]
        for n in members:
            rank[n] = max([start] + [rank[s] + 1 for s in n.srcs if s in rank])
        if members:
            spans[band] = (start, max(rank[n] for n in members))
            start = spans[band][1] + 1
        elif band == 1:
            spans[band] = (start, start)
    for n in g.nodes:
        rank.setdefault(n, 0)
    for i in range(len(g.outputs)):
        rank[("out", i)] = start
    tiles = [n for n in g.nodes if n.op is BOp.INPUT]
    rank = sink_leaves(rank, links, tiles, lambda n: spans[_BAND[phase[n]]][1])
    rank = sink_leaves(rank, links, [n for n in g.nodes if n.op is BOp.CONSTANT])
    return rank, spans[1]


# ---- thread graphs ---------------------------------------------------------------------------------
def thread_diagram(node, names, ident: str) -> Diagram:
    """A THREAD node's DAG: its operands (params) on top, each elementwise op below its operands,
    scalar constants written into the op that reads them."""
    local, boxes, edges = {}, {}, []
    for i, s in enumerate(node.srcs):
        local[("param", i)] = f"p{i}"
        boxes[("param", i)] = Box(f"{ident}.p{i}", "param", [f"p{i} = {names[s]}"])
    ops = [t for t in tnodes(node.arg) if t.op not in (Leaf.PARAM, Leaf.CONST)]
    for j, t in enumerate(ops):
        local[t] = f"r{j}"
        boxes[t] = Box(f"{ident}.r{j}", "top", [f"r{j} = {_thread_call(t, local)}"])
        for s in dict.fromkeys(t.srcs):
            if s.op is not Leaf.CONST:
                edges.append((("param", s.arg) if s.op is Leaf.PARAM else s, t, None, None))
    links = [Edge(s, d) for s, d, _, _ in edges]
    return Diagram("thread", boxes, edges, longest_path_ranks(list(boxes), links))


def _thread_call(t, local) -> str:
    parts = [local[("param", s.arg)] if s.op is Leaf.PARAM else f"{s.arg:g}"
             if s.op is Leaf.CONST else local[s] for s in t.srcs]
    extra = _arg(t)
    return f"{t.op.value}({', '.join(parts + ([extra] if extra else []))})"


# ---- SVG -------------------------------------------------------------------------------------------
def _rect(x, y, w, h, kind: str, rx: float) -> str:
    fill, stroke, dash = STYLES[kind]
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx:g}" '
            f'fill="{fill}" stroke="{stroke}"{dashed}/>')


def _text(x, y, line: str, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{weight} xml:space="preserve">{escape(line)}</text>'


def render_box(box: Box, x: float, y: float, out: list) -> None:
    out.append(f'<g class="node {box.kind}" id="{escape(box.id)}">')
    out.append(_rect(x, y, box.w, box.h, box.kind, 8 if box.inner else 4))
    for i, line in enumerate(box.lines):
        out.append(_text(x + PAD, y + PAD + (i + 1) * LINE_H - 4, line,
                         bold=box.inner is not None and i == 0))
    if box.inner is not None:
        dx, dy = box.inner_origin()
        render_diagram(box.inner, x + dx, y + dy, out)
    out.append("</g>")


def render_diagram(d: Diagram, x: float, y: float, out: list) -> None:
    """The diagram with its top-left corner at (x, y): regions, boxes, then edges."""
    ox, oy = x + MARGIN, y + MARGIN
    out.append(f'<g class="graph {d.level}">')
    for r in d.regions:
        top = oy + d.lay.layer_top[r.first] - REGION_HEAD + 4
        bottom = oy + d.lay.layer_bottom[r.last] + REGION_PAD
        out.append(f'<g class="region {r.kind}">')
        out.append(_rect(x + MARGIN / 2, top, d.w - MARGIN, bottom - top, r.kind, 6))
        out.append(_text(x + MARGIN / 2 + PAD, top + LINE_H - 1, r.title, bold=True))
        out.append("</g>")
    for key, box in d.boxes.items():
        bx, by = d.lay.xy[key]
        render_box(box, ox + bx, oy + by, out)
    color, width = EDGE[d.level]
    for i, (s, t, _, _) in enumerate(d.edges):
        out.append(f'<path class="edge" data-from="{escape(d.boxes[s].id)}" '
                   f'data-to="{escape(d.boxes[t].id)}" d="{d.lay.path_d(i, ox, oy)}" fill="none" '
                   f'stroke="{color}" stroke-width="{width:g}" marker-end="url(#arrow-{d.level})"/>')
    out.append("</g>")


def _markers() -> str:
    return "<defs>" + "".join(
        f'<marker id="arrow-{level}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        f'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" '
        f'fill="{color}"/></marker>' for level, (color, _) in EDGE.items()) + "</defs>"


def picture(graph, title: str | None = None) -> Box:
    """The whole picture: a frame titled with the graph's inputs around the kernel diagram."""
    ins = ", ".join(f"{n.arg[0]}: {_ty(n)}" for n in graph.inputs)
    head = f"{title} - kernel graph" if title else "kernel graph"
    return Box("graph", "kernel", [head, f"inputs {ins}"], kernel_diagram(graph))


def to_svg(graph, title: str | None = None) -> str:
    """The kernel graph (a KernelGraph) as a standalone SVG document."""
    return _document(picture(graph, title))


def to_html(graph, text: str = "", title: str = "mugraph kernel") -> str:
    """A page with the SVG picture and, below it, `text` (the loop nest and the report)."""
    return _page(to_svg(graph), text, title)


def _page(svg: str, text: str, title: str) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title></head><body>", f"<h1>{escape(title)}</h1>",
        svg, f"<pre>{escape(text)}</pre>" if text else "", "</body></html>"])


def _document(root: Box) -> str:
    body: list[str] = []
    render_box(root, MARGIN, MARGIN, body)
    width, height = root.w + 2 * MARGIN, root.h + 2 * MARGIN
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans Mono, Menlo, Consolas, '
        f'monospace" font-size="{FONT}">', _markers(),
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>', *body, "</svg>"])


# ---- a program of regions ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramRow:
    """One row of a program of regions: a fused region (with its kernel graph), a region kept as
    JAX, or a stretch of JAX steps; `reads` are the keys of the rows whose results it reads."""

    key: str
    kind: str                      # "custom" (fused) | "jax"
    lines: tuple
    graph: object = None           # the fused region's KernelGraph
    reads: tuple = ()


def program_diagram(rows) -> Diagram:
    """The rows top to bottom in run order, each fused one with its kernel graph inside, and an
    edge wherever a row reads another's results."""
    boxes = {r.key: Box(f"row.{r.key}", r.kind, list(r.lines),
                        kernel_diagram(r.graph) if r.graph is not None else None) for r in rows}
    edges = [(src, r.key, None, None) for r in rows for src in r.reads if src in boxes]
    return Diagram("kernel", boxes, edges, {r.key: i for i, r in enumerate(rows)})


def program_svg(rows, title: str = "program of regions") -> str:
    """A program of regions (`ProgramRow`s) as a standalone SVG document."""
    return _document(Box("program", "program", [title], program_diagram(rows)))


def program_html(rows, text: str = "", title: str = "mugraph program of regions") -> str:
    return _page(program_svg(rows), text, title)
