"""bench/gpu.py where no GPU is: it says so and exits 0; its table, its checks, its CTA sweep, its row writer, its
clock reading, its calibration file and its jax.jit timing marks work here, and bench/gpu_check.sh fits 8 minutes."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mugraph import ir, workloads

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
    from mugraph.search.baseline import xla_estimate
    from mugraph.search.cost import Launch, estimate, roofline
    assert bench.main(["--model", "--workloads", "lora"]) == 0
    out = capsys.readouterr().out
    assert "launch plan" in out and "%roof" in out and "calibration.json" in out
    rows = bench.model_rows(["lora"], ("h200",))
    w = workloads.get("lora")
    r = rows[0]
    assert (r.workload, r.graph, r.target) == ("lora", "reference", "h200")
    assert r.estimate_us == pytest.approx(estimate(w.reference(), "h200").seconds * 1e6)   # jax.jit's launches
    assert r.roofline_us == pytest.approx(roofline(w.spec(), "h200").seconds * 1e6)
    assert 0 < r.fraction <= 1 and r.plan and r.inflight_kb_per_sm > 0
    assert r.speedup == pytest.approx(xla_estimate(w.spec(), "h200").seconds / estimate(w.reference(), "h200").seconds)
    assert r.eager_speedup == pytest.approx(xla_estimate(w.spec(), "h200", launch=Launch.EAGER).seconds
                                            / estimate(w.reference(), "h200", launch=Launch.EAGER).seconds)
    assert r.ctas == max(k.blocks for k in estimate(w.reference(), "h200").kernels)
    line = bench.format_model(rows).splitlines()[1]
    assert f"{100 * r.fraction:.0f}%" in line and f"{r.speedup:.2f}x" in line and f"{r.eager_speedup:.2f}x" in line


def test_too_few_reps_for_a_median_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse(["--reps", "10"])


# ---- the GPU run's logic, on the CPU ---------------------------------------------------------------------------
def test_an_output_that_disagrees_with_the_spec_is_named_and_one_within_tolerance_passes(bench):
    rng = np.random.default_rng(0)
    want = rng.standard_normal((8, 16))
    ours = want.astype(np.float16)
    assert bench.disagreement([ours], [want], ["float16"]) == (pytest.approx(0, abs=1e-3), None)
    for damage, reason in ((np.nan, "NaN at 1 of 128"), (np.inf, r"\+inf at 1 of 128"), (want[2, 3] + 0.1, "tolerance")):
        bad = ours.copy()
        bad[2, 3] = damage
        _, why = bench.disagreement([bad], [want], ["float16"])
        assert why and re.search(reason, why), why
    assert bench.disagreement([ours[:4]], [want], ["float16"])[1].startswith("output 0 has shape")
    specials = want.copy()
    specials[0, 0] = np.nan  # NaN where the spec has NaN too agrees
    assert bench.disagreement([specials.astype(np.float16)], [specials], ["float16"])[1] is None


def test_a_row_past_the_deadline_is_reported_not_measured(bench):
    now = [100.0]
    deadline = bench.Deadline(5, clock=lambda: now[0])
    ctx = bench.Context(jax="no jax", target="h200", flush=None, reps=50, sweep=False, deadline=deadline)
    assert not deadline.passed()
    now[0] = 105.0
    row = bench.measure(bench.Row("lora"), graph=None, arrays=None, want=None, theirs=None, ctx=ctx)
    assert row.error == "not run: the --deadline passed" and row.mugraph_us is None
    assert not bench.Deadline(None).passed()


def test_the_sweep_sizes_a_streaming_kernel_at_cta_counts_around_the_sm_count(bench):
    from mugraph.codegen.arch import get_arch
    w = workloads.get("gated_mlp").small()
    graph, spec = w.reference(), w.spec()
    swept = bench.sweep_graphs(graph, spec)
    counts = [c for c, _ in swept]
    assert counts == sorted(set(counts)) and bench.launch_ctas(graph) in counts and len(counts) >= 4
    assert counts[0] < get_arch("sm_90").sm_count < counts[-1]
    arrays = w.random_inputs(0)
    want = ir.interpret(graph, arrays)[0]
    for ctas, sized in swept:
        assert bench.launch_ctas(sized) == ctas
        np.testing.assert_allclose(ir.interpret(sized, arrays)[0], want, rtol=1e-9, atol=1e-9)
    assert bench.sweep_graphs(workloads.get("ntrans").small().spec(), spec) == []  # no custom kernel


def test_rows_are_written_as_they_are_measured(bench, tmp_path, capsys):
    path = tmp_path / "bench.json"
    writer = bench.RowWriter(path, {"device": "test"})
    writer.add(bench.Row("lora", mugraph_us=3.0, ctas=132))
    assert [r["ctas"] for r in json.loads(path.read_text())["rows"]] == [132]
    writer.add(bench.Row("gqa", error="boom"))
    data = json.loads(path.read_text())
    assert data["device"] == "test" and [r["workload"] for r in data["rows"]] == ["lora", "gqa"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == bench.HEADER and "132" in out[1] and "FAILED: boom" in out[2]


def test_clocks_come_from_nvidia_smi_and_a_missing_one_is_said(bench):
    def fake(argv, **kw):
        query = argv[1].split("=", 1)[1]
        if query == "clocks_event_reasons.active":  # an older driver: the older field name
            return subprocess.CompletedProcess(argv, 2, "", "Field is not a valid field to query.")
        if query == "clocks_throttle_reasons.active":
            return subprocess.CompletedProcess(argv, 0, "0x0000000000000004\n", "")
        return subprocess.CompletedProcess(argv, 0, "1980, 3201, 1980, 3201, 312.5, 41\n", "")

    clocks = bench.gpu_clocks(run=fake)
    assert clocks["clocks.sm"] == "1980" and clocks["power.draw"] == "312.5"
    assert clocks["clock_limit_reasons"] == "0x0000000000000004"

    def missing(argv, **kw):
        raise FileNotFoundError("nvidia-smi")
    assert "nvidia-smi" in bench.gpu_clocks(run=missing)["error"]
    assert "unexpected" in bench.parse_clocks("1980, 3201\n")["error"]


def test_calibrating_into_a_new_table_leaves_the_table_in_use_alone(bench, tmp_path):
    from mugraph.codegen import calibration
    before = calibration.table_path().read_bytes()
    cal = bench.Calibration(device="Test GPU", target="h200", values={"hbm_efficiency": 0.875})
    path = bench.write_calibration(cal, tmp_path / "calibration.json")
    written = json.loads(path.read_text())
    assert written["h200"]["hbm_efficiency"]["value"] == 0.875
    assert "Test GPU" in written["h200"]["hbm_efficiency"]["source"]
    assert calibration.table_path().read_bytes() == before


def test_jax_jit_is_timed_by_marks_around_its_own_work(bench):
    import jax
    from mugraph.jax_ffi import bracketed
    w = workloads.get("gated_mlp").small()
    specs = [jax.ShapeDtypeStruct(s, w.dtype.numpy) for s in w.shapes.values()]
    text = jax.jit(bracketed(w.fn, 11, 22)).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
    lines = [ln for ln in text.splitlines() if "stablehlo." in ln or "return" in ln]
    marks = [i for i, ln in enumerate(lines) if "custom_call @mugraph_record_event" in ln]
    assert len(marks) == 2 and "event = 11" in lines[marks[0]] and "event = 22" in lines[marks[1]]
    assert "(%arg0, %arg1, %arg2)" in lines[marks[0]]  # the start mark takes every input...
    work = [ln for ln in lines[marks[0] + 1:marks[1]] if "dot_general" in ln]
    assert len(work) == 2 and not any("dot_general" in ln for ln in lines[marks[1]:])  # ...the work is between
    assert all("output_operand_aliases" in lines[i] for i in marks)  # and they move no data


def test_the_gpu_check_fits_eight_minutes_with_every_step_bounded():
    script = BENCH.with_name("gpu_check.sh")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    plan = subprocess.run(["bash", str(script), "--plan"], capture_output=True, text=True, check=True).stdout
    total, budget = (int(v) for v in re.search(r"total (\d+) budget (\d+)", plan).groups())
    assert total <= budget <= 480
    runs = [ln for ln in script.read_text().splitlines() if re.search(r'"\$PY" (-m pytest|bench/gpu.py)', ln)]
    assert runs and all("timeout" in ln for ln in runs), runs
