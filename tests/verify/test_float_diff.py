"""The float differential test: tolerances per mode and dtype, the worst-error report, non-finite
values, and the numerical bugs the exact finite-field test cannot see."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import TOp
from mugraph.ir.ops import BINARY, TERNARY
from mugraph.verify import check, finite_field_test, float_diff
from mugraph.verify.float_diff import compare, random_inputs
from mugraph.verify.special_values import large_value, softmax_reach, special_inputs


def _x(dtype="float16", shape=(8, 64)):
    return ir.input("X", shape, dtype)


def test_equal_graphs_pass_both_modes_with_zero_float64_error():
    x = _x()
    g = ir.KernelGraph([(x * x).sum(1)])
    result = float_diff(g, ir.KernelGraph([(x * x).sum(1) * 1.0]), seed=0)  # exact: x·1 = x
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
    assert a.dtype == np.float16 and np.isfinite(a).all() and len(np.unique(a)) > 5
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
        arg = (-1.0, 1.0) if op is TOp.CLAMP else ir.DType.FLOAT16 if op is TOp.CAST else None
        srcs = (pos, pos) if op in BINARY else (pos.gt(x), pos, x) if op in TERNARY else (pos,)
        node = ir.KNode(op, srcs, arg)
        assert float_diff(ir.KernelGraph([node]), ir.KernelGraph([node])).passed, op


# ---- IEEE special values and range ---------------------------------------------------------------
def _softmax(shifted):
    e = shifted.exp()
    return e / e.sum(1)


def _masked_softmax_pair(shape=(8, 64)):
    s = ir.input("S", shape, "float16")
    m = s.amax(1)
    spec = ir.KernelGraph([_softmax(s - m)])
    redundant = ir.KernelGraph([_softmax(s - (s - (s - m)))])  # = s - m, exactly
    return spec, redundant


def test_a_redundant_shift_that_turns_masked_rows_into_nan_is_not_equivalent():
    spec, redundant = _masked_softmax_pair()
    assert finite_field_test(spec, redundant, seed=0).passed          # equal as algebra ...
    assert float_diff(spec, redundant, seed=0, cases=("random",)).passed   # ... and on random inputs
    result = float_diff(spec, redundant, seed=0, stop_at_failure=False)
    assert not result.passed and "mask" in result.special_cases
    assert {c.case for c in result.cases if not c.passed} == {"mask", "inf"}  # -inf reaches it too
    report = check(spec, redundant, seed=0, formal=False)
    assert not report.equivalent and "float differential test failed: inf" in report.reason
    assert check(spec, spec, seed=0, formal=False).equivalent


def test_the_mask_goes_where_a_softmax_reads_and_a_whole_row_is_masked():
    spec, _ = _masked_softmax_pair()
    s = spec.inputs[0]
    assert softmax_reach(spec, s) == 1
    base = random_inputs(spec, seed=0)
    inputs, detail = special_inputs(spec, "mask", base, seed=0)
    masked = np.isneginf(inputs["S"])
    assert masked.all(axis=1).sum() >= 1 and 0.1 < masked.mean() < 0.5
    q, k = ir.input("Q", (8, 16), "float16"), ir.input("K", (16, 32), "float16")
    attention = ir.KernelGraph([_softmax(q @ k - (q @ k).amax(1))])
    assert softmax_reach(attention, q) is None                         # a matmul comes first
    assert special_inputs(attention, "mask", random_inputs(attention), 0)[0] is None
    assert "mask" not in float_diff(attention, attention).special_cases


def test_a_candidate_that_absorbs_small_values_fails_element_by_element():
    """((x + 1) - 1) loses every bit of x below 2^-11 in fp16: an error of 1e-3 on an element of
    size 1e-3 is an error of 1, whatever the largest output is (the old whole-output yardstick
    passed it on random inputs, leaving it to the denormal case)."""
    x = _x("float16", (8, 64))
    spec = ir.KernelGraph([x * 4096.0])
    absorbed = ir.KernelGraph([((x + 1.0) - 1.0) * 4096.0])   # 1 + tiny rounds to 1 in fp16
    result = float_diff(spec, absorbed, seed=0)
    assert not result.passed and result.mode("own").case == "random"
    assert result.mode("own").worst.error > 3 * 1e-2   # several times the fp16 tolerance
    for case in ("denormal", "underflow", "zeros"):
        assert not float_diff(spec, absorbed, seed=0, cases=(case,)).passed, case
    assert float_diff(spec, ir.KernelGraph([(x * 2.0) * 2048.0]), seed=0).passed  # exact


def _f32_mean_spec(rows=8, n=256):
    """A mean whose sum stays in fp32 registers (one kernel), and one whose sum is stored in fp16."""
    x = ir.input("X", (rows, n), "float16")
    b = ir.BlockBuilder(grid=(rows, 1, 1), forloop=1)
    row = b.input(x, imap=(0,), fmap=1).acc_sum()
    spec = ir.KernelGraph(b.finish([(row.sum(1) / float(n), (0,))]), [x])
    narrow = ir.KernelGraph([x.sum(1) / float(n)])
    return spec, narrow


def test_a_candidate_that_loses_range_its_spec_keeps_is_not_equivalent():
    spec, narrow = _f32_mean_spec()
    assert finite_field_test(spec, narrow, seed=0).passed
    assert float_diff(spec, narrow, seed=0, cases=("random", "nan", "inf", "denormal")).passed
    result = float_diff(spec, narrow, seed=0)
    assert not result.passed and result.mode("own").case == "large"
    assert "non-finite value from the candidate" in result.mode("own").worst.message
    assert large_value(narrow, narrow.inputs[0])[0] == pytest.approx(2 * 65504 / 256)


def test_nan_propagates_through_max_min_relu_and_reductions_in_both_modes():
    x = ir.input("X", (4, 8), "float32")
    graph = ir.KernelGraph([x.relu(), x.maximum(x * 0.0), x.minimum(x * 0.0), x.amax(1),
                            x.clamp(-1.0, 1.0)])
    a = np.ones((4, 8))
    a[1, 3] = np.nan
    for mode in ("float64", "own"):
        for out in ir.interpret(graph, [a], dtype=mode):
            assert np.isnan(out[1]).any() and np.isfinite(np.delete(out, 1, axis=0)).all()


def test_results_name_every_case_and_what_was_not_compared():
    spec, narrow = _f32_mean_spec()
    result = float_diff(spec, spec, seed=0)
    assert result.passed and result.special_cases == ("zeros", "nan", "inf", "large", "denormal",
                                                      "underflow")
    text = str(result)
    assert "float float64: ok" in text and "float own: ok against spec" in text
    assert "mask not run: no input reaches exp or max" in text
    assert "8 of 8 elements compared" in text
    failed = float_diff(spec, narrow, seed=0)
    assert "denormal not run: the large case failed" in str(failed)
    with pytest.raises(ir.InvalidInput):
        float_diff(spec, spec, cases=("subnormal",))
