"""``regenerate``: the committed-kernels folder written, re-checked and found stale, with a stand-in generator
(the hand-written module) so that the folder logic is tested apart from the generator's output."""
from __future__ import annotations

import numpy as np
import pytest

import mugraph.codegen
from mugraph import ir, workloads
from mugraph.codegen.regen import max_relative_error
from mugraph.regen import GraphSource, regenerate
from tests.codegen import handmade_plan as hp

FEW = ["lora", "ntrans"]


@pytest.fixture
def stand_in(monkeypatch):
    """generate -> the hand-written module (its sm_90 source differs when ``differ`` is set); run_on_cpu -> the
    reference interpreter, so the CPU check passes."""
    options = {"differ": False}

    def generate(graph, arch="sm_80"):
        source = hp.SOURCE + (f"// {arch}\n" if options["differ"] and arch != "sm_80" else "")
        return hp.GeneratedModule(source, hp.plan(), arch)

    monkeypatch.setattr(mugraph.codegen, "generate", generate, raising=False)
    monkeypatch.setattr(mugraph.codegen, "run_on_cpu", lambda g, arrays: ir.interpret(g, arrays), raising=False)
    return options


def test_writes_each_workload_folder_and_then_checks_clean(tmp_path, stand_in):
    written = regenerate(tmp_path, workloads=FEW)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        f"{n}/{f}" for n in FEW for f in ("graph.json", "kernel.cu", "report.md")]
    assert ir.from_json((tmp_path / "lora" / "graph.json").read_text()) is workloads.get("lora").reference()
    assert (tmp_path / "lora" / "kernel.cu").read_text() == hp.SOURCE
    assert not (tmp_path / "README.md").exists()  # a partial run leaves the index alone
    assert regenerate(tmp_path, workloads=FEW, check=True) == []


def test_check_reports_changed_missing_and_extra_files(tmp_path, stand_in):
    regenerate(tmp_path, workloads=FEW)
    (tmp_path / "lora" / "kernel.cu").write_text("// edited by hand\n")
    (tmp_path / "ntrans" / "report.md").unlink()
    (tmp_path / "ntrans" / "kernel.sm_90.cu").write_text("// left over\n")
    stale = regenerate(tmp_path, workloads=FEW, check=True)
    assert [p.relative_to(tmp_path).as_posix() for p in stale] == [
        "lora/kernel.cu", "ntrans/kernel.sm_90.cu", "ntrans/report.md"]
    assert (tmp_path / "lora" / "kernel.cu").read_text() == "// edited by hand\n"  # check never writes


def test_a_differing_arch_source_gets_its_own_file(tmp_path, stand_in):
    stand_in["differ"] = True
    regenerate(tmp_path, workloads=["lora"])
    assert (tmp_path / "lora" / "kernel.sm_90.cu").read_text().endswith("// sm_90\n")
    assert "`kernel.cu`, `kernel.sm_90.cu`" in (tmp_path / "lora" / "report.md").read_text()


def test_report_holds_only_deterministic_facts(tmp_path, stand_in):
    regenerate(tmp_path, workloads=["lora"])
    report = (tmp_path / "lora" / "report.md").read_text()
    for expected in ["# lora: X @ W + (X @ A) @ B", "| 1 | `matmul` | library (matmul) |",
                     "| sm_80 | `twice` |", "| sm_90 | `add_one` |", "| Y | (8, 64) | f16 | output |",
                     "pass: max error", "the same for sm_80, sm_90"]:
        assert expected in report
    assert "seconds" not in report and not any(line.rstrip().endswith("s)") for line in report.splitlines())


def test_the_whole_suite_gets_an_index_and_a_second_run_changes_nothing(tmp_path, stand_in):
    lines = []
    first = regenerate(tmp_path, log=lines.append)
    readme = (tmp_path / "README.md").read_text()
    assert all(f"[{n}]({n}/report.md)" in readme for n in workloads.names())
    assert any("nvrtc" in line or "nvcc" in line for line in lines)  # timings go to the log
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "kernel.cu").write_text("")
    assert regenerate(tmp_path, check=True) == [tmp_path / "stray" / "kernel.cu"]
    assert regenerate(tmp_path) == first


def test_a_graph_source_can_replace_the_reference(tmp_path, stand_in):
    spec_source = GraphSource("the spec (`Workload.spec()`)", lambda w: w.spec())
    regenerate(tmp_path, workloads=["ntrans"], source=spec_source)
    assert ir.from_json((tmp_path / "ntrans" / "graph.json").read_text()) is workloads.get("ntrans").spec()
    assert "Graph: the spec (`Workload.spec()`)" in (tmp_path / "ntrans" / "report.md").read_text()


def test_a_failing_cpu_check_is_recorded_not_raised(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr(mugraph.codegen, "run_on_cpu",
                        lambda g, arrays: [np.zeros(o.shape) for o in g.outputs], raising=False)
    regenerate(tmp_path, workloads=["ntrans"])
    assert "FAIL: max error 1.0e+00" in (tmp_path / "ntrans" / "report.md").read_text()


def test_max_relative_error_treats_nan_as_infinite():
    assert max_relative_error([np.array([np.nan, 1.0])], [np.array([1.0, 1.0])]) == float("inf")


def _fake_search(w, log):
    summary = {"config": {"seed": 0, "budget_states": 10, "budget_seconds": 1.0, "max_kernel_ops": 1,
                          "target": "h100"}, "stop_reason": "states", "states": 10, "verified": 1,
               "winner": "one kernel", "estimate_us": 1.5, "spec_estimate_us": 9.0, "equivalent": True}
    return w.reference(), summary


def test_the_searched_winner_sits_beside_the_reference(tmp_path, stand_in, monkeypatch):
    import mugraph.regen as regen
    monkeypatch.setattr(regen, "run_search", _fake_search)
    monkeypatch.setattr(regen, "sampled_check", lambda w, g, log: "sampled: pass: max error 0.0e+00")
    written = regenerate(tmp_path, workloads=["ntrans"], search=True)
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert names == ["ntrans/graph.json", "ntrans/kernel.cu", "ntrans/report.md", "ntrans/searched/graph.json",
                     "ntrans/searched/kernel.cu", "ntrans/searched/report.md", "ntrans/searched/search.json"]
    report = (tmp_path / "ntrans" / "searched" / "report.md").read_text()
    assert "## Search" in report and "stop reason states" in report and "sampled: pass" in report
    monkeypatch.setattr(regen, "run_search", lambda w, log: pytest.fail("a check or plain regen never searches"))
    assert regenerate(tmp_path, workloads=["ntrans"], check=True) == []
    assert regenerate(tmp_path, workloads=["ntrans"]) == written


def test_the_sampled_check_runs_the_full_shape_kernels():
    import mugraph.regen as regen
    w = workloads.get("ntrans")
    line = regen.sampled_check(w, w.reference(), lambda s: None)
    assert ": pass: max error" in line and "mg_kernel0 3 of 8 blocks" in line  # corners 0 and 7, one at random
    assert "not run: no custom kernels" in regen.sampled_check(w, w.spec(), lambda s: None)
