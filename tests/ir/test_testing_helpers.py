"""`mugraph.testing` (the strategies and assertions users run in their own CI) and the golden-file
helper of this test suite."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mugraph import ir, testing
from mugraph.ir import BOp
from mugraph.verify.mutate import rewrite_block
from tests.golden import check_golden


def _graph(scale=2.0):
    x, w = ir.input("X", (2, 3), "float32"), ir.input("W", (3, 2), "float32")
    return ir.KernelGraph([(x @ w) * scale], output_names=["y"])


def test_assert_equivalent_passes_on_equal_programs():
    x, w = ir.input("X", (2, 3), "float32"), ir.input("W", (3, 2), "float32")
    testing.assert_equivalent(_graph(), ir.KernelGraph([(x * 2.0) @ w], [w, x], ["z"]))


def test_assert_equivalent_names_the_output_and_the_worst_element():
    a = _graph()
    x, w = a.inputs
    b = ir.KernelGraph([(x @ w) * 2.0 + ir.constant(1e-3, (2, 1)) * (x @ w)], output_names=["y"])
    arrays = [np.arange(6.0).reshape(2, 3), np.ones((3, 2))]
    with pytest.raises(AssertionError) as info:
        testing.assert_equivalent(a, b, arrays, rtol=1e-6, atol=1e-6)
    text = str(info.value)
    assert text.startswith("output 'y' (#0) differs in 4 of 4 elements")
    # x @ w = [[3, 3], [12, 12]]: the largest values differ most, first of them reported
    assert "worst at [1, 0]: a = 24.0, b = 24.012" in text and "allowed 2.5e-05" in text


def test_assert_equivalent_checks_shapes_counts_and_nans():
    a = _graph()
    x, w = a.inputs
    with pytest.raises(AssertionError, match=r"shapes differ, \[2, 2\] vs \[2, 1\]"):
        testing.assert_equivalent(a, ir.KernelGraph([(x @ w).sum(1)]))
    with pytest.raises(AssertionError, match="1 and 2 outputs"):
        testing.assert_equivalent(a, ir.KernelGraph([x @ w, x]))
    nan = ir.KernelGraph([(x @ w - 1e9).log()])  # NaN everywhere
    testing.assert_equivalent(nan, ir.KernelGraph([(x @ w - 2e9).sqrt()]))  # NaN where nan is
    with pytest.raises(AssertionError, match="worst at .*b = nan"):
        testing.assert_equivalent(a, nan)


def test_assert_equivalent_tolerances():
    a, b = _graph(2.0), _graph(2.0 + 1e-7)
    arrays = [np.ones((2, 3)), np.ones((3, 2))]
    testing.assert_equivalent(a, b, arrays, rtol=1e-7, atol=0)
    with pytest.raises(AssertionError):
        testing.assert_equivalent(a, b, arrays, rtol=1e-9, atol=0)
    testing.assert_equivalent(a, b, arrays, rtol=0, atol=1e-6)


@settings(max_examples=3)
@given(testing.block_schedules("matmul", (4, 6, 4)))
def test_assert_equivalent_accepts_block_graphs_and_named_inputs(case):
    arrays = dict(zip(case.reference.input_names, testing.random_arrays(case.reference, 3)))
    testing.assert_equivalent(case.reference, case.graph, arrays, rtol=1e-12)
    bg = case.block_graph
    root = bg.outputs[0].node
    shifted, _ = rewrite_block(bg, {root: root + 1.0})
    with pytest.raises(AssertionError, match="differs"):
        testing.assert_equivalent(bg, shifted, list(arrays.values()))


def test_random_arrays_follow_the_graph_inputs():
    x = ir.input("A", (2, 5), "bfloat16")
    g = ir.KernelGraph([x + ir.input("B", (5,), "float16")])
    a, b = testing.random_arrays(g, seed=1, scale=3.0)
    assert a.dtype == ml_dtypes.bfloat16 and a.shape == (2, 5)
    assert b.dtype == np.float16 and b.shape == (5,)
    assert 1.0 < np.abs(a.astype(np.float32)).max() <= 3.0
    assert all(x.dtype == np.float64 for x in testing.random_arrays(g, dtype=np.float64))
    again = testing.random_arrays(g, seed=1, scale=3.0)
    np.testing.assert_array_equal(a, again[0])


@given(testing.input_arrays(_graph(), scale=0.5))
def test_input_arrays_strategy(arrays):
    assert [a.shape for a in arrays] == [(2, 3), (3, 2)]
    assert all(np.abs(a).max() <= 0.5 for a in arrays)


def test_divisors():
    assert testing.divisors(12) == [1, 2, 3, 4, 6, 12]
    assert testing.divisors(7) == [1, 7]
    assert testing.divisors(1) == [1]


@given(testing.grid_maps((6, 4, 5)))
def test_grid_maps_split_distinct_dims_evenly(drawn):
    grid, axis_dims = drawn
    used = [d for d in axis_dims if d is not None]
    assert len(used) == len(set(used))
    for extent, dim in zip(grid, axis_dims):
        assert extent == 1 if dim is None else (6, 4, 5)[dim] % extent == 0


@given(testing.kernel_graphs(max_nodes=6, dtypes=("float16", "bfloat16")))
def test_kernel_graphs_are_well_formed(graph):
    assert isinstance(graph, ir.KernelGraph) and 1 <= len(graph.outputs) <= 2
    assert {n.dtype for n in graph.inputs} <= {ir.DType.FLOAT16, ir.DType.BFLOAT16}
    assert all(n.op is not ir.KOp.CUSTOM for n in graph.nodes)


def test_kernel_graphs_reach_every_op():
    seen = set()

    @settings(max_examples=500)  # drawing only, no interpretation: cheap
    @given(testing.kernel_graphs(max_nodes=8))
    def collect(graph):
        seen.update(n.op for n in graph.nodes)

    collect()
    wanted = set(ir.TOp) | {ir.KOp.INPUT, ir.KOp.CONSTANT, ir.KOp.MATMUL, ir.KOp.REDUCE_SUM,
                            ir.KOp.REDUCE_MAX, ir.KOp.RMS_NORM, ir.KOp.TRANSPOSE}
    assert wanted <= seen, f"never drawn: {sorted(o.value for o in wanted - seen)}"


PRIME_SHAPES = {"matmul": (5, 7, 3), "rms_norm_matmul": (5, 7, 3), "softmax": (5, 3, 7, 2)}


@pytest.mark.parametrize("kind", testing.BLOCK_KINDS)
@settings(max_examples=5)
@given(data=st.data())
def test_block_schedules_exist_for_prime_shapes(kind, data):
    shape = PRIME_SHAPES.get(kind, (5, 7))
    case = data.draw(testing.block_schedules(kind, shape))
    assert all(g in (1, 5, 7, 3, 2) for g in case.block_graph.grid)
    testing.assert_equivalent(case.reference, case.graph, rtol=1e-10, atol=1e-10)


def test_block_schedules_reject_bad_requests():
    with pytest.raises(ValueError, match="unknown block graph kind 'conv'"):
        testing.block_schedules("conv", (4, 4))
    with pytest.raises(ValueError, match="not BOp.ACC_MAX"):
        testing.block_schedules("matmul", (4, 4, 4), accumulator=BOp.ACC_MAX)
    with pytest.raises(ValueError, match="rms has no accumulator for dim 0"):
        testing.block_schedules("rms", (4, 4), dim=0)
    with pytest.raises(ValueError, match="reduce_sum over dim 0 uses one of .'acc_sum'."):
        testing.block_schedules("reduce_sum", (4, 4), dim=0, accumulator=BOp.ACC_SUM_LAST)


def test_testing_module_imports_without_pytest():
    code = "import sys; sys.modules['pytest'] = None; import mugraph.testing; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_check_golden_compares_creates_and_updates(tmp_path, monkeypatch):
    path = tmp_path / "g" / "x.txt"
    monkeypatch.delenv("MUGRAPH_UPDATE_GOLDEN", raising=False)
    with pytest.raises(AssertionError, match="missing; run the test with MUGRAPH_UPDATE_GOLDEN=1"):
        check_golden(path, "a\n")
    monkeypatch.setenv("MUGRAPH_UPDATE_GOLDEN", "1")
    check_golden(path, "a\nb")
    assert path.read_text() == "a\nb\n"
    monkeypatch.delenv("MUGRAPH_UPDATE_GOLDEN")
    check_golden(path, "a\nb\n")
    with pytest.raises(AssertionError, match=r"(?s)differs from golden file.*-b\n\+c"):
        check_golden(path, "a\nc")


def test_golden_fixture_reads_next_to_the_test_module(golden):
    golden("print_three_d_tiles", str(__import__("tests.ir.test_printer", fromlist=["x"])
                                      .three_d_tiles()))
