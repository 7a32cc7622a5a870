"""The per-element yardstick of the float test (`verify/magnitude.py`): the magnitude M of the
terms behind each element, the program's rounding budget R, and how `element_errors` uses them."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import TOp
from mugraph.ir.ops import BINARY, TERNARY
from mugraph.verify.float_diff import element_errors, float_diff
from mugraph.verify.magnitude import MAGNITUDE, SLOPES, Triple, rounded, run


def _run(graph, **arrays):
    return run(graph, {k: np.asarray(v, np.float64) for k, v in arrays.items()})


def test_a_cancelling_sum_is_measured_against_its_terms():
    x, w = ir.input("X", (1, 4), "float32"), ir.input("W", (4, 1), "float32")
    out = _run(ir.KernelGraph([x @ w]), X=[[1.0, -1.0, 2.0, -2.0]], W=[[3.0], [3.0], [1.0], [1.0]])[0]
    assert out.v[0, 0] == 0.0 and out.magnitude()[0, 0] == 3 + 3 + 2 + 2   # |X| @ |W|


def test_products_multiply_quotients_and_functions_carry_their_slope():
    x = ir.input("X", (3,), "float32")
    a = np.array([0.5, -2.0, 3.0])
    prod, quot, exp = _run(ir.KernelGraph([(x - 1.0) * x, 1.0 / x, x.exp()]), X=a)
    np.testing.assert_allclose(prod.magnitude(), (np.abs(a) + 1) * np.abs(a))
    np.testing.assert_allclose(quot.magnitude(), 1 / a ** 2 * np.abs(a) + 1 / np.abs(a))
    np.testing.assert_allclose(exp.magnitude(), np.exp(a) * (1 + np.abs(a)))


def test_every_elementwise_op_has_a_magnitude_rule_and_m_is_at_least_the_value():
    x = ir.input("X", (4, 8), "float32")
    a = np.random.default_rng(0).standard_normal((4, 8))
    pos = x * x + 1.0
    for op in TOp:
        arg = (-1.0, 1.0) if op is TOp.CLAMP else ir.DType.FLOAT16 if op is TOp.CAST else None
        srcs = (pos, x) if op in BINARY else (pos.gt(x), pos, x) if op in TERNARY else (pos,)
        out = _run(ir.KernelGraph([ir.KNode(op, srcs, arg)]), X=a)[0]
        finite = np.isfinite(out.v)
        assert (out.magnitude()[finite] >= np.abs(out.v[finite]) * (1 - 1e-12)).all(), op
    assert set(SLOPES) <= set(TOp)


def test_a_cast_rounds_and_adds_its_worst_error_to_the_budget_but_fp32_casts_are_exact():
    x = ir.input("X", (4,), "float32")
    a = np.array([1 + 2.0 ** -12, 2.0 ** -30, 1e5, 0.5])
    to16, to32 = _run(ir.KernelGraph([x.cast("float16"), x.cast("float16").cast("float32")]), X=a)
    assert to16.v[0] == 1.0 and to16.v[1] == 0.0          # rounded, and underflowed
    assert to16.v[2] == 1e5                                # beyond fp16's range the value is kept
    assert to16.r[3] == 0.0 and to16.r[0] > 0              # representable values move nothing
    np.testing.assert_array_equal(to32.v, to16.v)          # to fp32: exact
    assert rounded(np.array([3.0]), ir.DType.FLOAT32)[0] == 3.0


def test_triples_pass_through_layout_functions():
    t = Triple(np.arange(6.0).reshape(2, 3), r=np.ones((2, 3)))
    moved = np.reshape(np.transpose(t, (1, 0)), (6,))
    assert isinstance(moved, Triple) and moved.shape == (6,) and moved.r.shape == (6,)
    assert np.shape(t) == (2, 3) and np.ndim(t) == 2 and t[0].shape == (3,)
    joined = np.concatenate([t, Triple(np.zeros((1, 3)))], axis=0)
    assert joined.shape == (3, 3) and joined.r[2].tolist() == [0, 0, 0]
    assert MAGNITUDE.max_identity((2,)).v.tolist() == [-np.inf, -np.inf]


def test_a_masked_minus_inf_does_not_make_its_rows_magnitude_unbounded():
    s = ir.input("S", (2, 4), "float32")
    e = (s - s.amax(1)).exp()
    a = np.array([[-np.inf, 0.5, 1.0, -1.0], [0.1, 0.2, 0.3, 0.4]])
    out = _run(ir.KernelGraph([e / e.sum(1)]), S=a)[0]
    assert np.isfinite(out.magnitude()).all() and out.magnitude()[0, 0] == 0.0


def test_element_errors_hold_small_elements_to_their_size_and_never_loosen_the_big_ones():
    expected = np.array([1e5, 1.0, -2.0])
    got = np.array([1e5, 0.0, -2.0])
    assert element_errors(expected, got, magnitude=np.abs(expected))[1] == 1.0
    # an exp's slope makes M several times the value: capped at the output's largest value
    big_m = np.array([5e5, 5.0, 10.0])
    assert element_errors(expected, expected * 1.02, magnitude=big_m)[0] == pytest.approx(0.02)
    # the program's own rounding (the budget) is not counted against a candidate that skips it
    assert element_errors([1.0], [1.001], magnitude=[1.0], budget=[0.0005])[0] == 0.0
    # without magnitudes: the whole output's yardstick
    assert element_errors(expected, got)[1] == pytest.approx(1e-5)


def test_a_matmul_of_cancelling_terms_passes_at_fp16_while_a_lost_small_element_does_not():
    x, w = ir.input("X", (8, 256), "float16"), ir.input("W", (256, 8), "float16")
    spec = ir.KernelGraph([x @ w])
    assert float_diff(spec, ir.KernelGraph([(x * 0.5) @ (w * 2.0)]), seed=0).passed
    y = ir.input("Y", (8, 8), "float32")
    big = ir.KernelGraph([ir.concat([y + 1e5, y], 0)])
    lost = ir.KernelGraph([ir.concat([y + 1e5, ((y + 1e5) - 1e5)], 0)])
    result = float_diff(big, lost, seed=0)
    assert not result.passed and result.mode("own").worst.index[0] >= 8


def test_a_table_of_stored_constants_is_exact():
    """A TABLE (a constant array the program closes over, e.g. a folded mask) holds exact values:
    the triple carries them with no rounding budget, as a scalar constant does."""
    table = np.linspace(-1.0, 1.0, 32).reshape(4, 8).astype(np.float32)
    graph = ir.from_jax(lambda x: x * table + 1.0, np.ones((4, 8), np.float32))
    assert any(n.op is ir.KOp.TABLE for n in graph.nodes)
    x = np.random.default_rng(0).standard_normal((4, 8))
    (out,) = run(graph, [x])
    np.testing.assert_allclose(out.v, x * table.astype(np.float64) + 1.0)
    np.testing.assert_array_less(0.0, out.magnitude() + (out.v == 0))


def test_an_error_measured_beyond_the_rounding_budget_says_so():
    """With a rounding budget the reported error is what lies beyond it: a value that differs
    within the budget reports 0, and the words say "beyond the program's own rounding budget"."""
    from mugraph.verify.float_diff import ModeResult, compare
    within = compare(np.array([81.508]), np.array([81.511]), budget=np.array([0.01]))
    assert within.error == 0.0 and within.beyond_budget
    plain = compare(np.array([81.508]), np.array([81.511]))
    assert plain.error > 0 and not plain.beyond_budget
    text = ModeResult("float64", True, within, (1e-9,), 0.0).detail()
    assert text.startswith("relative error 0 beyond the program's own rounding budget")
