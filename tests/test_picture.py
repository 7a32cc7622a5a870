"""Pictures of μGraphs from the user's side: Kernel.show(format=...) and `mugraph show --svg`
(the picture itself is tested in tests/ir/test_picture.py)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mugraph import workloads
from mugraph.api import Kernel
from mugraph.errors import InvalidInput

NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg" and float(root.get("width")) > 0
    return [t.text or "" for t in root.iter(f"{NS}text")]


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
