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
    full = bench.Row("gqa_safe", "searched", mugraph_us=12.5, graph_us=10.25, jax_us=25.0, roofline_us=4.0,
                     model_us=9.0, max_error_vs_jax=3e-4, loader="cubin")
    empty = bench.Row("ntrans", mugraph_us=7.0, graph_us=6.0)
    line = bench.format_row(full)
    assert "2.00x" in line and "2.44x" in line and "39%" in line and "3.0e-04" in line and "searched" in line
    widths = {len(bench.HEADER) - len("  loader"), len(line) - len("  cubin"), len(bench.format_row(empty)) - 2}
    assert len(widths) == 1, widths
    assert "FAILED: boom" in bench.format_row(bench.Row("lora", error="boom"))


@pytest.mark.parametrize("name,target", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                         ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "h100")])
def test_roofline_target_follows_the_device_name(bench, name, target):
    assert bench.roofline_target(name) == target


def test_the_model_table_is_the_cost_models(bench, capsys):
    from mugraph.search.cost import estimate, roofline
    assert bench.main(["--model", "--workloads", "lora"]) == 0
    out = capsys.readouterr().out
    assert "launch plan" in out and "%roof" in out and "calibration.json" in out
    rows = bench.model_rows(["lora"], ("h200",))
    w = workloads.get("lora")
    r = rows[0]
    assert (r.workload, r.graph, r.target) == ("lora", "reference", "h200")
    assert r.estimate_us == pytest.approx(estimate(w.reference(), "h200", cuda_graph=True).seconds * 1e6)
    assert r.roofline_us == pytest.approx(roofline(w.spec(), "h200", cuda_graph=True).seconds * 1e6)
    assert 0 < r.fraction <= 1 and r.plan and r.inflight_kb_per_sm > 0
    assert f"{100 * r.fraction:.0f}%" in bench.format_model(rows)


def test_too_few_reps_for_a_median_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse(["--reps", "10"])
