"""Pictures of μGraphs: plain SVG that parses, with the kernel graph's edges and every block graph
nested (grid, imap/fmap tiles, the loop, accumulators, thread-level chains and thread graphs,
omap); Kernel.show(format=...) and `mugraph show/search --svg`."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mugraph import ir, workloads
from mugraph.api import Kernel
from mugraph.errors import InvalidInput
from mugraph.ir.picture import to_svg
from mugraph.ir.thread import fuse_threads

NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg" and float(root.get("width")) > 0
    return [t.text or "" for t in root.iter(f"{NS}text")]


@pytest.mark.parametrize("name", workloads.names())
def test_every_block_graph_is_drawn_inside_the_kernel_graph(name):
    graph = workloads.get(name).reference()
    svg = to_svg(graph)
    root = ET.fromstring(svg)
    texts = _texts(svg)
    blocks = graph.custom_ops()
    frames = [t for t in texts if t.startswith("k") and ": grid (" in t]
    assert len(frames) == len(blocks)
    for (bg, _), frame in zip(blocks, frames):
        assert f"forloop {bg.forloop}" in frame and f"{bg.threads} threads" in frame
        assert sum(t.startswith(f"for i in range({bg.forloop})") for t in texts) >= 1
    assert sum("imap {" in t and "fmap" in t for t in texts) == sum(len(bg.inputs) for bg, _ in blocks)
    assert sum("omap {" in t for t in texts) == sum(len(bg.outputs) for bg, _ in blocks)
    assert any("(accumulator)" in t for t in texts)
    pairs = {(s, n) for n in graph.nodes for s in n.srcs}
    assert len([p for p in root.iter(f"{NS}path") if p.get("class") == "edge"]) == len(pairs)
    # the frames nest: each block frame's box lies inside the kernel graph's box
    outer = next(g for g in root.iter(f"{NS}g") if g.get("class") == "frame kernel")
    inner = [g for g in outer.iter(f"{NS}g") if g.get("class") == "frame custom"]
    assert len(inner) == len(blocks)


def test_thread_graphs_and_register_chains_are_drawn():
    w = workloads.get("gated_mlp").reference()
    (bg, srcs), = w.custom_ops()
    fused = fuse_threads(bg)
    node = ir.KNode(ir.KOp.CUSTOM, srcs, (fused, 0))
    texts = _texts(to_svg(ir.KernelGraph([node], w.inputs)))
    assert any(t.startswith("thread graph (registers)") for t in texts)
    assert any("silu(p0)" in t or "silu" in t and "p1" in t for t in texts)
    plain = _texts(to_svg(w))
    assert any("(thread-level chain)" in t for t in plain)


def test_text_needing_escapes_stays_well_formed():
    x = ir.input("a<b>&'q\"", (4, 4), "float32")
    graph = ir.KernelGraph([x * x])
    assert any("a<b>&" in t for t in _texts(to_svg(graph)))


def test_kernel_show_formats_and_files(tmp_path, capsys):
    w = workloads.get("lora").small()
    kernel = Kernel(w.reference(), w.spec())
    svg = kernel.show("svg", path=tmp_path / "k.svg")
    assert (tmp_path / "k.svg").read_text() == svg and capsys.readouterr().out == ""
    html = kernel.show("html")
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "block graph" in html
    assert "for i in range" in kernel.show("text")
    assert kernel._repr_svg_() == svg
    with pytest.raises(InvalidInput, match="unknown picture format"):
        kernel.show("png")


def test_cli_show_svg_writes_a_picture(tmp_path, capsys):
    from mugraph.cli import main
    path = tmp_path / "lora.svg"
    assert main(["show", "lora", "--svg", str(path)]) == 0
    texts = _texts(path.read_text())
    assert texts[0].startswith("lora - kernel graph")
    assert main(["show", "lora", "--svg", str(tmp_path / "no" / "dir.svg")]) == 2
    assert "cannot write the picture" in capsys.readouterr().err
