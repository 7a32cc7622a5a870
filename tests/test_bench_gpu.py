"""bench/gpu.py where no GPU is: it says so and exits 0; its table and sizing helpers work on plain numbers."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mugraph import workloads

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_without_a_gpu_it_says_so_and_exits_0(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "gpu_available", lambda: False)
    assert bench.main(["--workloads", "lora"]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_rows_line_up_with_the_header(bench):
    full = bench.Row("gqa_safe", mugraph_us=12.5, graph_us=10.25, jax_us=25.0, roofline_us=5.0,
                     roofline_graph_us=4.0, max_error_vs_jax=3e-4, input_sets=8, loader="cubin")
    empty = bench.Row("ntrans", mugraph_us=7.0, graph_us=6.0)
    line = bench.format_row(full)
    assert "2.00x" in line and "2.44x" in line and "40%" in line and "39%" in line and "3.0e-04" in line
    widths = {len(bench.HEADER) - len("  loader"), len(line) - len("  cubin"), len(bench.format_row(empty)) - 2}
    assert len(widths) == 1, widths
    assert "FAILED: boom" in bench.format_row(bench.Row("lora", error="boom"))


@pytest.mark.parametrize("name,target", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                         ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "h100")])
def test_roofline_target_follows_the_device_name(bench, name, target):
    assert bench.roofline_target(name) == target


def test_enough_input_sets_to_overflow_the_l2(bench):
    l2 = 60 * 2**20
    assert bench.sets_needed(workloads.get("rmsnorm_linear"), l2, 8) == 3  # 50 MB per set
    assert bench.sets_needed(workloads.get("ntrans"), l2, 8) == 8          # tiny sets: capped
