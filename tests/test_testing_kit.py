"""The testing kit for users' CI: IEEE special-value strategies that shrink to the smallest failing
case, and assert_kernel_matches running an emitted kernel (the CPU harness; the reference
interpreter) against jax.jit(fn): it passes right kernels and catches wrong ones on special
values only (a relu that maps NaN to 0, a softmax shift that turns masked rows into NaN)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, find, given, settings

from mugraph import ir
from mugraph.api import Kernel
from mugraph.ir.errors import InvalidInput, NoDevice, VerificationError
from mugraph.testing import assert_kernel_matches, ieee_arrays, kernel_inputs
from mugraph.testing_kit import Program, describe, output_mismatch, usable_scale

FIND = settings(database=None, max_examples=2000)


# ---- the strategies --------------------------------------------------------------------------------
KINDS = {
    "NaN": lambda a: np.isnan(a).any(),
    "+inf": lambda a: np.isposinf(a).any(),
    "-inf": lambda a: np.isneginf(a).any(),
    "a masked row": lambda a: np.isneginf(a).all(axis=1).any(),
    "a value near the limit": lambda a: np.max(np.abs(a[np.isfinite(a)]), initial=0) > 1e4,
    "a subnormal": lambda a: ((a != 0) & (np.abs(a) < np.finfo(np.float16).smallest_normal)).any(),
    "an exact +0": lambda a: ((a == 0) & ~np.signbit(a)).any(),
    "a zero row": lambda a: (a == 0).all(axis=1).any(),
    "tiny values over many scales": lambda a: np.ptp(np.log2(np.abs(a[np.isfinite(a) & (a != 0)]))
                                                     ) > 12 if np.isfinite(a).sum() > 1 else False,
}


def test_every_kind_of_special_value_is_drawn():
    seen = set()

    @given(ieee_arrays((4, 6), "float16"))
    @settings(max_examples=120, phases=[Phase.generate])
    def draw(a):
        assert a.shape == (4, 6) and a.dtype == np.float16
        seen.update(kind for kind, holds in KINDS.items() if holds(a))

    draw()
    assert seen == set(KINDS)


def test_a_failing_case_shrinks_to_one_special_value():
    a = find(ieee_arrays((4, 6), "float16"), KINDS["NaN"], settings=FIND)
    assert np.isnan(a).sum() == 1 and np.isfinite(a).sum() == a.size - 1
    assert np.isnan(a.reshape(-1)[0]), "at the first position"


def test_without_subnormals_none_are_drawn():
    tiny = float(np.finfo(np.float32).smallest_normal)

    @given(ieee_arrays((3, 3), "float32", subnormals=False))
    @settings(max_examples=100, phases=[Phase.generate])
    def draw(a):
        assert not ((a != 0) & (np.abs(a) < tiny)).any()

    draw()


def _softmax_graph():
    s = ir.input("s", (4, 8), "float16")
    e = (s - s.amax(-1)).exp()
    return ir.KernelGraph([e / e.sum(-1)], [s])


@given(kernel_inputs(_softmax_graph()))
@settings(max_examples=15)
def test_kernel_inputs_follow_the_graph_and_mask_along_the_softmax_dim(arrays):
    (s,) = arrays
    assert s.shape == (4, 8) and s.dtype == np.float16
    full = np.isneginf(s).all(axis=0)
    assert not full.any() or np.isneginf(s).sum() > 4, "a masked row runs along dim 1, not dim 0"


# ---- comparing and describing ----------------------------------------------------------------------
def test_output_mismatch_holds_specials_exactly_and_finite_values_by_tolerance():
    want = np.array([1.0, np.nan, np.inf, -np.inf, 1e-40], np.float32)
    assert output_mismatch(want, want.copy(), 1e-4) == ""
    assert output_mismatch(want, np.array([1.00001, np.nan, np.inf, -np.inf, 0.0]), 1e-4) == ""
    assert "non-finite" in output_mismatch(want, np.array([1.0, 0.0, np.inf, -np.inf, 0.0]), 1e-4)
    assert "non-finite" in output_mismatch(want, np.array([1.0, np.nan, -np.inf, -np.inf, 0]), 1e-4)
    assert "non-finite" in output_mismatch(np.ones(3), np.array([1.0, np.nan, 1.0]), 1e-4)
    assert "relative error" in output_mismatch(want, np.array([1.1, np.nan, np.inf, -np.inf, 0]), 1e-4)
    # a float32 kernel output is rounded to the float16 that fn returns before comparing
    assert output_mismatch(np.array([np.inf], np.float16), np.array([1e6], np.float32), 1e-2) == ""


def test_where_jax_lost_range_in_its_own_dtype_no_kernel_is_held_to_it():
    # jax.jit in fp16: x*x overflowed to inf (exact 7e4 is finite) and a silu underflowed to 0
    # that met an inf (NaN where the exact result is -inf); the third element is ordinary
    want = np.array([np.inf, np.nan, 2.0], np.float16)
    exact = np.array([7e4, -np.inf, 2.0])
    assert output_mismatch(want, np.array([7e4, -np.inf, 2.0], np.float32), 1e-2, exact) == ""
    message = output_mismatch(want, np.array([7e4, -np.inf, 3.0], np.float32), 1e-2, exact)
    assert "1 of 3 elements differ" in message and "not compared: 2 elements" in message
    # where jax.jit and the float64 run agree on a special value, it is held exactly
    assert "non-finite" in output_mismatch(np.array([np.nan, 1.0], np.float16),
                                           np.array([0.0, 1.0]), 1e-2, np.array([np.nan, 1.0]))


def test_the_inf_a_value_within_tolerance_rounds_to_is_right():
    # fp16 rounds magnitudes from 65520 up to inf: float64 says -65521.4, jax.jit's own rounding
    # kept -65440 (within 1e-2); the kernel's -inf is the correctly rounded answer
    want, exact = np.array([-65440.0, 2.0], np.float16), np.array([-65521.4, 2.0])
    assert output_mismatch(want, np.array([-np.inf, 2.0], np.float32), 1e-2, exact) == ""
    assert "non-finite" in output_mismatch(want, np.array([np.inf, 2.0]), 1e-2, exact)
    # far from the limit an inf stays wrong (the tolerance band, 655, does not reach 65520)
    far = np.array([-60000.0, 2.0])
    assert "non-finite" in output_mismatch(far.astype(np.float16), np.array([-np.inf, 2.0]), 1e-2,
                                           far)
    # fp32 outputs: the limit is fp32's, so an fp16-sized overflow is still wrong
    assert "non-finite" in output_mismatch(want.astype(np.float32), np.array([-np.inf, 2.0]),
                                           1e-2, exact)


def test_describe_names_masked_rows_and_special_positions():
    a = np.zeros((3, 4), np.float32)
    a[1, :] = -np.inf
    a[0, 2], a[2, 3] = np.nan, np.inf
    text = describe([a], ["s"])
    assert "s: float32[3, 4]" in text and "masked row [1, :] = -inf" in text
    assert "NaN at (0, 2)" in text and "+inf at (2, 3)" in text and "-inf at" not in text


# ---- the assertion on the CPU harness ----------------------------------------------------------------
def _module():
    """One custom kernel, three outputs: relu(x); relu written as select(x > 0, x, 0), which maps
    NaN to 0; and logsumexp with its max shift, m + log(sum(exp(s - m))), which is NaN on a
    masked row (-inf - -inf) where jax.nn.logsumexp gives -inf."""
    X, S = ir.input("x", (8, 16), "float32"), ir.input("s", (8, 16), "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    x, s = b.input(X, imap=(0,), fmap=None), b.input(S, imap=(0,), fmap=None)
    m = s.amax(-1)
    lse = m + (s - m).exp().sum(-1).log()
    outs = b.finish([(x.relu().acc_sum(), (0,)), (x.gt(0.0).select(x, 0.0).acc_sum(), (0,)),
                     (lse.acc_sum(), (0,))])
    return ir.KernelGraph(list(outs), [X, S], ["relu", "relu_select", "lse"])


def right(x, s):
    m = jnp.max(s, axis=-1, keepdims=True)
    return jax.nn.relu(x), jnp.where(x > 0, x, 0.0), m + jnp.log(jnp.sum(jnp.exp(s - m), -1,
                                                                          keepdims=True))


def nan_to_zero_is_wrong(x, s):
    return jax.nn.relu(x), jax.nn.relu(x), right(x, s)[2]


def masked_rows_are_wrong(x, s):
    return jax.nn.relu(x), jnp.where(x > 0, x, 0.0), jax.nn.logsumexp(s, -1, keepdims=True)


@pytest.fixture(scope="module")
def kernel():
    graph = _module()
    assert graph.custom_ops(), "the harness runs generated CUDA"
    return Kernel(graph, graph)


def test_a_kernel_that_agrees_with_jax_passes(kernel):
    assert_kernel_matches(right, kernel, "harness", examples=12)


def test_a_relu_that_maps_nan_to_zero_fails_on_the_smallest_input(kernel):
    with pytest.raises(AssertionError) as caught:
        assert_kernel_matches(nan_to_zero_is_wrong, kernel, "harness", examples=25)
    message = str(caught.value)
    assert "output 1 of the kernel (harness) differs from jax.jit(fn)" in message
    assert "kernel 0.0, jax.jit nan" in message and "1 of 128 elements differ" in message
    x_line = next(line for line in message.splitlines() if line.strip().startswith("x:"))
    assert x_line.endswith("; NaN at (0, 0)"), "shrunk to one NaN, at the first position"


def test_a_softmax_shift_that_makes_masked_rows_nan_fails(kernel):
    with pytest.raises(AssertionError) as caught:
        assert_kernel_matches(masked_rows_are_wrong, kernel, "harness", examples=25)
    message = str(caught.value)
    assert "output 2 of the kernel (harness)" in message and "non-finite value out of place" in message
    assert "kernel nan, jax.jit -inf" in message and "1 of 8 elements differ" in message
    s_line = next(line for line in message.splitlines() if line.strip().startswith("s:"))
    assert s_line.endswith("masked row [0, :] = -inf"), "shrunk to the first masked row alone"


def test_the_reference_backend_catches_the_same_kernel_without_a_compiler(kernel):
    assert_kernel_matches(right, kernel, "reference", examples=15)
    with pytest.raises(AssertionError, match="output 2 of the kernel \\(reference\\)"):
        assert_kernel_matches(masked_rows_are_wrong, kernel, "reference", examples=25)
    with pytest.raises(AssertionError, match="relative error"):
        assert_kernel_matches(lambda x, s: tuple(o * 1.5 for o in right(x, s)), kernel,
                              "reference", examples=5, specials=False, masked_rows=False)


def test_the_scale_is_halved_until_jax_holds_and_refused_when_it_never_does():
    x = ir.input("x", (4, 8), "float16")
    graph = ir.KernelGraph([(x * 20.0).exp()])
    assert usable_scale(Program(lambda x: jnp.exp(x * 20.0)), Kernel(graph, graph), 1.0) < 0.5
    assert_kernel_matches(lambda x: jnp.exp(x * 20.0), graph, "reference", examples=5)
    with pytest.raises(VerificationError, match="nothing to hold the kernel to"):
        assert_kernel_matches(lambda x: jnp.exp(x * 1e4), graph, "reference")


# ---- bad arguments ---------------------------------------------------------------------------------
def test_bad_arguments_are_typed_errors(kernel):
    with pytest.raises(InvalidInput, match="unknown backend 'gpu'"):
        assert_kernel_matches(right, kernel, "gpu")
    with pytest.raises(InvalidInput, match="takes a Kernel or a KernelGraph"):
        assert_kernel_matches(right, "kernel.json")
    with pytest.raises(InvalidInput, match="returns outputs of shapes"):
        assert_kernel_matches(lambda x, s: x, kernel, "reference")
    with pytest.raises(InvalidInput, match="cannot run on the kernel's inputs"):
        assert_kernel_matches(lambda x: x, kernel, "reference")
    with pytest.raises(InvalidInput, match="the JAX function first"):
        assert_kernel_matches(kernel.graph, right)


def test_the_gpu_backend_without_a_gpu_says_so(kernel):
    from mugraph.codegen.runtime_cupy import gpu_available
    if gpu_available():
        pytest.skip("a GPU is present (tests/gpu runs the kit there)")
    with pytest.raises(NoDevice, match="backend='harness'"):
        assert_kernel_matches(right, kernel, "cuda")


def test_fp32_matmul_kernels_keep_infinities():
    X, W = ir.input("x", (16, 32), "float32"), ir.input("w", (32, 16), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    (y,) = b.finish([((b.input(X) @ b.input(W)).acc_sum(), None)])
    x, w = np.ones((16, 32), np.float32), np.ones((32, 16), np.float32)
    x[0, 0] = np.inf
    from mugraph.codegen import run_on_cpu
    (out,) = run_on_cpu(ir.KernelGraph([y], [X, W]), [x, w])
    assert np.isposinf(out[0]).all() and (out[1:] == 32).all()
