"""The float differential test: tolerances per mode and dtype, the worst-error report, non-finite
values, and the numerical bugs the exact finite-field test cannot see."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import TOp
from mugraph.ir.ops import BINARY
from mugraph.verify import finite_field_test, float_diff
from mugraph.verify.float_diff import compare, random_inputs


def _x(dtype="float16", shape=(8, 64)):
    return ir.input("X", shape, dtype)


def test_identical_graphs_pass_both_modes_with_zero_float64_error():
    x = _x()
    g = ir.KernelGraph([(x * x).sum(1)])
    result = float_diff(g, g, seed=0)
    assert result.passed and [m.mode for m in result.cases[0].modes] == ["float64", "own"]
    assert result.mode("float64").worst.error == 0.0


def test_float64_mode_is_tight_and_own_mode_is_per_dtype():
    x = _x()
    spec = ir.KernelGraph([x * 2.0])
    near = ir.KernelGraph([x * 2.000001])  # 5e-7 relative: beyond 1e-9, within fp16's 1e-2
    result = float_diff(spec, near, seed=1)
    assert not result.mode("float64").passed and result.mode("own").passed
    assert result.mode("own").tolerances == (1e-2,)
    fp32 = ir.input("X", (8, 64), "float32")
    assert float_diff(ir.KernelGraph([fp32 + 0.0]), ir.KernelGraph([fp32 + 0.0])) \
        .mode("own").tolerances == (1e-4,)


def test_the_worst_element_is_located_and_reported():
    x = _x("float32", (4, 16))
    spec = ir.KernelGraph([x])
    cand = ir.KernelGraph([x + x.square() * 1e-3])
    result = float_diff(spec, cand, seed=2, cases=("random",))
    worst = result.mode("float64").worst
    inputs = random_inputs(spec, seed=2)["X"]
    expected_index = np.unravel_index(np.argmax(inputs ** 2), inputs.shape)
    assert worst.output == 0 and worst.index == tuple(int(i) for i in expected_index)
    assert worst.spec_value == inputs[worst.index]
    assert worst.error == pytest.approx(np.max(inputs ** 2) * 1e-3 / np.max(np.abs(inputs)))
    assert "output 0 at" in str(result.mode("float64"))


def test_a_nan_in_the_candidate_where_the_spec_is_finite_fails_clearly():
    x = _x("float32")
    result = float_diff(ir.KernelGraph([x]), ir.KernelGraph([x.log()]), seed=3)
    assert not result.passed
    assert "non-finite value from the candidate" in result.mode("float64").worst.message


def test_compare_accepts_matching_non_finite_values_and_rejects_others():
    a = np.array([1.0, np.inf, np.nan])
    assert compare(a, a.copy()).error == 0.0
    assert compare(a, np.array([1.0, -np.inf, np.nan])).error == np.inf
    assert compare(np.zeros(3), np.zeros(3)).error == 0.0


def _softmax_graphs(shape=(4, 256)):
    s, v = ir.input("S", shape, "float16"), ir.input("V", (shape[1], 16), "float16")
    shifted = (s - s.amax(1)).exp()
    plain = s.exp()
    spec = ir.KernelGraph([(shifted @ v) / shifted.sum(1)])
    unsafe = ir.KernelGraph([(plain @ v) / plain.sum(1)])
    return spec, unsafe


def test_a_missing_softmax_shift_passes_the_field_test_and_fails_the_float_test():
    spec, unsafe = _softmax_graphs()
    # softmax is shift-invariant in exact arithmetic: the field test cannot see the bug ...
    assert finite_field_test(spec, unsafe, seed=0).passed
    # ... but with large scores the fp16 kernel overflows
    result = float_diff(spec, unsafe, seed=0, scale=20.0)
    assert not result.passed and not result.mode("own").passed
    assert "non-finite" in result.mode("own").worst.message


def test_random_inputs_are_rounded_to_their_dtype_and_reproducible():
    x = _x("float16", (3, 5))
    a = random_inputs(ir.KernelGraph([x]), seed=4, scale=3.0)["X"]
    assert a.dtype == np.float64 and np.array_equal(a, a.astype(np.float16).astype(np.float64))
    assert np.array_equal(a, random_inputs(ir.KernelGraph([x]), seed=4, scale=3.0)["X"])


def test_mismatched_output_counts_raise():
    x = _x()
    with pytest.raises(ir.InvalidInput):
        float_diff(ir.KernelGraph([x]), ir.KernelGraph([x, x + 1.0]))


def test_unknown_mode_raises():
    x = _x()
    with pytest.raises(ir.InvalidInput):
        float_diff(ir.KernelGraph([x]), ir.KernelGraph([x]), modes=("float128",))


def test_every_elementwise_op_runs_in_both_modes():
    x = _x("float32")
    pos = x * x + 1.0
    for op in TOp:
        arg = (-1.0, 1.0) if op is TOp.CLAMP else None
        node = ir.KNode(op, (pos, pos) if op in BINARY else (pos,), arg)
        assert float_diff(ir.KernelGraph([node]), ir.KernelGraph([node])).passed, op
