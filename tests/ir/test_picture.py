"""The SVG picture of a μGraph, read back with xml.etree: every node and every block graph's
schedule is named, boxes nest without overlapping, edges leave their source's bottom, enter their
destination's top and cross no other box; the layered layout's parts; one golden picture."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mugraph import ir, workloads
from mugraph.ir.layered import Edge, _isotonic, _spread, layout, longest_path_ranks
from mugraph.ir.picture import to_svg
from mugraph.ir.thread import fuse_threads
from tests.golden import check_golden

NS = "{http://www.w3.org/2000/svg}"
EPS = 0.51   # coordinates are written with one decimal


# ---- reading the SVG back ----------------------------------------------------------------------------
def _rect(g) -> tuple[float, float, float, float]:
    r = g.find(f"{NS}rect")
    x, y = float(r.get("x")), float(r.get("y"))
    return x, y, x + float(r.get("width")), y + float(r.get("height"))


def _lines(g) -> list[str]:
    return [t.text or "" for t in g.findall(f"{NS}text")]


def _children(graph_g) -> list:
    return [g for g in graph_g.findall(f"{NS}g") if g.get("class", "").startswith("node ")]


def _graphs(root) -> list:
    return [g for g in root.iter(f"{NS}g") if g.get("class", "").startswith("graph ")]


def _nodes(root) -> list:
    return [g for g in root.iter(f"{NS}g") if g.get("class", "").startswith("node ")]


def _points(d: str, steps: int = 24) -> list[tuple[float, float]]:
    """Points along an SVG path made of M, L and C segments."""
    pts, here = [], None
    for cmd, args in re.findall(r"([MLC])([^MLC]*)", d):
        nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", args)]
        if cmd == "M":
            here = (nums[0], nums[1])
            pts.append(here)
        elif cmd == "L":
            (x0, y0), (x1, y1) = here, (nums[0], nums[1])
            pts += [(x0 + (x1 - x0) * t / steps, y0 + (y1 - y0) * t / steps)
                    for t in range(1, steps + 1)]
            here = (x1, y1)
        else:
            p0, p1, p2, p3 = here, nums[0:2], nums[2:4], nums[4:6]
            for k in range(1, steps + 1):
                t = k / steps
                c = [(1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t ** 3]
                pts.append(tuple(sum(w * p[i] for w, p in zip(c, (p0, p1, p2, p3)))
                                 for i in range(2)))
            here = (p3[0], p3[1])
    return pts


def _inside(p, box, margin: float = 1.0) -> bool:
    x0, y0, x1, y1 = box
    return x0 + margin < p[0] < x1 - margin and y0 + margin < p[1] < y1 - margin


def _overlap(a, b) -> bool:
    return a[0] < b[2] - EPS and b[0] < a[2] - EPS and a[1] < b[3] - EPS and b[1] < a[3] - EPS


def _check_geometry(root) -> int:
    """Boxes of one graph do not overlap and lie inside their parent's box; every edge runs from
    its source's bottom to its destination's top and through no other box of its graph.
    Returns the number of edges checked."""
    edges = 0
    for graph in _graphs(root):
        boxes = {g.get("id"): _rect(g) for g in _children(graph)}
        parent = next((g for g in root.iter(f"{NS}g") if graph in list(g)), None)
        outer = _rect(parent) if parent is not None else None
        ids = list(boxes)
        for i, a in enumerate(ids):
            if outer is not None:
                box = boxes[a]
                assert outer[0] - EPS <= box[0] and box[2] <= outer[2] + EPS and \
                    outer[1] - EPS <= box[1] and box[3] <= outer[3] + EPS, f"{a} leaves its parent"
            for b in ids[i + 1:]:
                assert not _overlap(boxes[a], boxes[b]), f"boxes {a} and {b} overlap"
        for path in graph.findall(f"{NS}path"):
            src, dst = path.get("data-from"), path.get("data-to")
            pts = _points(path.get("d"))
            s, t = boxes[src], boxes[dst]
            assert abs(pts[0][1] - s[3]) <= EPS and s[0] - EPS <= pts[0][0] <= s[2] + EPS
            assert abs(pts[-1][1] - t[1]) <= EPS and t[0] - EPS <= pts[-1][0] <= t[2] + EPS
            for other, box in boxes.items():
                if other not in (src, dst):
                    hit = [p for p in pts if _inside(p, box)]
                    assert not hit, f"edge {src} -> {dst} runs through {other} at {hit[0]}"
            edges += 1
    return edges


def _fused(graph):
    """`graph` with each custom op's elementwise regions as thread-level ops."""
    made = {}
    for n in graph.nodes:
        srcs = tuple(made.get(s, s) for s in n.srcs)
        if n.op is ir.KOp.CUSTOM:
            made[n] = ir.KNode(ir.KOp.CUSTOM, srcs, (fuse_threads(n.arg[0]), n.arg[1]))
        else:
            made[n] = n.replace(srcs=srcs) if n.srcs else n
    return ir.KernelGraph([made[o] for o in graph.outputs], graph.inputs, graph.output_names)


def _small_graph():
    """An RMSNorm-linear kernel with its epilogue as a thread graph, and a kernel op after it."""
    X, W = ir.input("X", (16, 64), "float16"), ir.input("W", (64, 32), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    x, w = b.input(X, imap=None, fmap=1), b.input(W, imap=(1,), fmap=0)
    out = (x @ w).acc_sum() * ((x * x).acc_sum_last() / 64.0 + 1e-6).rsqrt()
    (y,) = b.finish([(out, (1,))])
    y = ir.KNode(ir.KOp.CUSTOM, (X, W), (fuse_threads(y.arg[0]), 0))
    return ir.KernelGraph([y * 2.0], [X, W], ["out"])


def _cases():
    for name in workloads.names():
        yield pytest.param(lambda name=name: workloads.get(name).reference(), id=f"{name}-ref")
    yield pytest.param(lambda: _fused(workloads.get("gated_mlp").reference()), id="gated_mlp-thread")
    yield pytest.param(lambda: _fused(workloads.get("ntrans").reference()), id="ntrans-thread")
    yield pytest.param(lambda: workloads.get("qknorm_gqa").spec(), id="qknorm_gqa-spec")
    yield pytest.param(_small_graph, id="small")


# ---- what the picture says -----------------------------------------------------------------------
@pytest.mark.parametrize("make", list(_cases()))
def test_the_picture_names_every_node_and_every_schedule(make):
    graph = make()
    root = ET.fromstring(to_svg(graph))
    nodes = _nodes(root)
    first = [_lines(g)[0] for g in nodes]
    for i, node in enumerate(graph.nodes):
        if node.op is not ir.KOp.CUSTOM:
            assert sum(line.startswith(f"%{i} = ") for line in first) == 1, f"%{i} is not drawn"
    customs = [g for g in nodes if g.get("class") == "node custom"]
    assert len(customs) == len(graph.custom_ops())
    for g, (bg, _) in zip(customs, graph.custom_ops()):
        gx, gy, gz = bg.grid
        assert f"grid ({gx},{gy},{gz}) = {bg.num_blocks} blocks x {bg.threads} threads, " \
               f"forloop {bg.forloop}" in _lines(g)[1]
        _check_block(g, bg)
    outputs = [g for g in nodes if g.get("id", "").startswith("return.")]
    assert [_lines(g)[0] for g in outputs] == \
        [f"return {n} = %{graph.nodes.index(o)}" for n, o in zip(graph.output_names, graph.outputs)]


def _check_block(g, bg) -> None:
    block = next(x for x in g.findall(f"{NS}g") if x.get("class") == "graph block")
    inner = _children(block)
    heads = [_lines(x)[0] for x in inner]
    for i, node in enumerate(bg.nodes):
        assert sum(h.startswith(f"t{i} = ") for h in heads) == 1, f"t{i} is not drawn"
    tiles = [_lines(x)[1] for x in inner if x.get("class") == "node tile"]
    expect = [f"imap {{{_map(n.arg.imap)}}}  fmap {'none' if n.arg.fmap is None else n.arg.fmap}"
              for n in bg.inputs]
    assert sorted(t.split("   ")[0] for t in tiles) == sorted(expect)
    omaps = [_lines(x)[1] for x in inner if x.get("class") == "node output"]
    assert sorted(o.split("   ")[0] for o in omaps) == sorted(f"omap {{{_map(o.omap)}}}"
                                                          for o in bg.outputs)
    accs = [x for x in inner if x.get("class") == "node acc"]
    assert len(accs) == sum(n.op in ir.ops.ACCUMULATORS for n in bg.nodes)
    loops = [x for x in block.findall(f"{NS}g") if x.get("class") == "region loop"]
    assert [_lines(x)[0] for x in loops] == [f"for i in range({bg.forloop})"]
    for x in inner:
        if x.get("class") == "node thread":
            node = bg.nodes[int(_lines(x)[0].split(" ")[0][1:])]
            _check_thread(x, node)


def _check_thread(g, node) -> None:
    """Its params name the thread op's operands in order; its ops are the thread graph's."""
    from mugraph.ir.thread import ops_of
    operands = _lines(g)[0].split("thread(")[1].rstrip(")").split(", ")
    assert len(operands) == len(node.srcs)
    inner = _children(next(x for x in g.findall(f"{NS}g") if x.get("class") == "graph thread"))
    params = [_lines(x)[0] for x in inner if x.get("class") == "node param"]
    assert sorted(params) == sorted(f"p{i} = {name}" for i, name in enumerate(operands))
    ops = [_lines(x)[0] for x in inner if x.get("class") == "node top"]
    assert sorted(o.split(" = ")[1].split("(")[0] for o in ops) == \
        sorted(t.op.value for t in ops_of(node.arg))


def _map(m) -> str:
    return ", ".join(f"{'xyz'[a]}->{d}" for a, d in enumerate(m) if d is not None) or "none"


@pytest.mark.parametrize("make", list(_cases()))
def test_boxes_nest_without_overlap_and_edges_avoid_boxes(make):
    graph = make()
    root = ET.fromstring(to_svg(graph))
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    drawn = _check_geometry(root)
    kernel_edges = len({(s, n) for n in graph.nodes if n.op is not ir.KOp.CUSTOM
                        for s in n.srcs}) + len(graph.outputs) \
        + sum(len(srcs) for _, srcs in graph.custom_ops())
    block_edges = sum(len({(s, n) for n in bg.nodes for s in n.srcs}) + len(bg.outputs)
                      for bg, _ in graph.custom_ops())
    assert drawn >= kernel_edges + block_edges


def test_thread_graphs_show_their_ops_and_operands():
    graph = _fused(workloads.get("gated_mlp").reference())
    root = ET.fromstring(to_svg(graph))
    thread = next(g for g in _nodes(root) if g.get("class") == "node thread")
    assert _lines(thread)[0] == "t7 = thread(t3, t6)"
    inner = [_lines(g)[0] for g in _nodes(thread)]
    assert {"p0 = t3", "p1 = t6", "r0 = silu(p0)", "r1 = mul(r0, p1)"} <= set(inner)


def test_register_chains_are_marked_in_unfused_block_graphs():
    root = ET.fromstring(to_svg(workloads.get("gated_mlp").reference()))
    chain = [_lines(g) for g in _nodes(root) if g.get("class") == "node chain"]
    assert chain and all(lines[1].startswith("register chain") for lines in chain)


def test_text_needing_escapes_stays_well_formed():
    x = ir.input("a<b>&'q\"", (4, 4), "float32")
    texts = [t.text for t in ET.fromstring(to_svg(ir.KernelGraph([x * x]))).iter(f"{NS}text")]
    assert any("a<b>&'q\"" in (t or "") for t in texts)


def test_a_small_picture_matches_its_golden_file():
    svg = to_svg(_small_graph(), "rmsnorm-linear")
    assert "node thread" in svg and "node constant" in svg
    check_golden(Path(__file__).parent / "golden" / "picture_small.svg", svg)


# ---- the layout ------------------------------------------------------------------------------------
def test_ranks_are_longest_paths():
    edges = [Edge("a", "b"), Edge("b", "c"), Edge("a", "c"), Edge("d", "c")]
    assert longest_path_ranks(["a", "b", "d", "c"], edges) == {"a": 0, "b": 1, "d": 0, "c": 2}


def test_crossing_reduction_untangles_a_drawing_that_has_no_crossing():
    # a0 -> b1, a1 -> b0 in the given order crosses; swapping one layer removes it
    sizes = {k: (40.0, 20.0) for k in ("a0", "a1", "b0", "b1", "c0", "c1")}
    edges = [Edge("a0", "b1"), Edge("a1", "b0"), Edge("b1", "c0"), Edge("b0", "c1")]
    rank = {"a0": 0, "a1": 0, "b0": 1, "b1": 1, "c0": 2, "c1": 2}
    lay = layout(sizes, rank, edges)
    x = {k: v[0] for k, v in lay.xy.items()}
    for e1 in edges:
        for e2 in edges:
            if rank[e1.src] == rank[e2.src] and e1 != e2:
                assert (x[e1.src] - x[e2.src]) * (x[e1.dst] - x[e2.dst]) > 0, "edges cross"


def test_positions_keep_order_and_separation_and_stay_near_their_targets():
    assert _isotonic([3.0, 1.0, 2.0]) == [2.0, 2.0, 2.0]
    xs = _spread([0.0, 0.0, 10.0], [5.0, 5.0])
    assert xs[1] - xs[0] >= 5.0 - 1e-9 and xs[2] - xs[1] >= 5.0 - 1e-9
    assert _spread([0.0, 100.0], [5.0]) == [0.0, 100.0]


def test_long_edges_pass_between_boxes_not_through_them():
    # a feeds d three layers down; b and c sit in the layers between, right under a
    sizes = {"a": (60.0, 20.0), "b": (200.0, 20.0), "c": (200.0, 20.0), "d": (60.0, 20.0)}
    edges = [Edge("a", "b"), Edge("b", "c"), Edge("c", "d"), Edge("a", "d")]
    lay = layout(sizes, {"a": 0, "b": 1, "c": 2, "d": 3}, edges)
    boxes = {k: (x, y, x + sizes[k][0], y + sizes[k][1]) for k, (x, y) in lay.xy.items()}
    for p in _points(lay.path_d(3)):
        assert not any(_inside(p, boxes[k]) for k in ("b", "c"))
