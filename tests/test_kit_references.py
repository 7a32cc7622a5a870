"""What the testing kit holds a kernel to where jax.jit on a CPU is not a trustworthy answer, found by
the special-value sweep (bench/specials.py): XLA's CPU column max drops NaN, it reads subnormal
inputs as zero, an overflowed fp32 product meets an inf as inf - inf or not by summation order,
and a value within tolerance of the exact one may round to inf. Each rule is paired with a wrong
kernel the kit must still catch on the same inputs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir
from mugraph.testing import assert_kernel_matches
from mugraph.testing_kit import Program, output_mismatch


def column_max(X, W):
    return jnp.max(X @ W, axis=0)


def _lifted(fn, *shapes, dtype="float32"):
    return ir.from_jax(fn, *(jax.ShapeDtypeStruct(s, dtype) for s in shapes))


# ---- XLA on a CPU drops NaN in a max over axis 0 --------------------------------------------------
def test_jax_jit_on_a_cpu_drops_the_nan_of_a_column_max_that_numpy_keeps():
    """The premise: a W column of -inf makes X @ W's column NaN (inf - inf); jax.jit's column
    max is -inf here, in float32 and in float64, while NumPy (and the IEEE rule) say NaN."""
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    w[:, 0] = -np.inf
    own, exact = Program(column_max)([x, w])
    assert np.isnan(np.max(x @ w, axis=0)[0])
    if not np.isnan(own[0][0]):   # where XLA keeps the NaN, there is nothing to leave out
        assert not np.isnan(exact[0][0])
        spec = _lifted(column_max, (64, 64), (64, 64))
        numpy = Program(column_max, spec).numpy([x, w])[0]
        assert np.isnan(numpy[0])
        nan_kernel = np.asarray(numpy, np.float32)
        assert "non-finite" in output_mismatch(own[0], nan_kernel, 1e-4, exact[0])
        assert output_mismatch(own[0], nan_kernel, 1e-4, exact[0], numpy=numpy) == ""


def test_a_kernel_that_keeps_the_nan_of_a_column_max_passes_and_a_wrong_one_fails():
    graph = _lifted(column_max, (64, 64), (64, 64))
    options = dict(examples=12, specials=False, regimes=("normal",))
    assert_kernel_matches(column_max, graph, "reference", **options)
    with pytest.raises(AssertionError, match="output 0 of the kernel"):
        assert_kernel_matches(lambda x, w: jnp.min(x @ w, axis=0), graph, "reference", **options)


def test_the_numpy_referee_leaves_out_only_nan_that_jax_drops():
    want, exact = np.array([-np.inf, 1.0, np.nan], np.float32), np.array([-np.inf, 1.0, np.nan])
    numpy = np.array([np.nan, np.nan, np.nan])
    got = np.array([np.nan, np.nan, np.nan], np.float32)
    assert output_mismatch(want, got, 1e-4, exact, numpy=numpy) == ""
    # a finite element is still held where NumPy agrees with jax.jit, NaN or not
    assert "non-finite" in output_mismatch(want, got, 1e-4, exact, numpy=np.array([np.nan, 1.0,
                                                                                   np.nan]))
    assert "non-finite" in output_mismatch(want, np.array([np.nan, 1.0, 0.0]), 1e-4, exact,
                                           numpy=numpy)


# ---- subnormal inputs: XLA on a CPU reads them as zero ---------------------------------------------
def rms(X):
    """As the generality suite's bf16 RMSNorm: statistics in fp32, so the float64 run of `fn`
    passes through fp32 too, where XLA on a CPU flushes."""
    xf = X.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(X.dtype)


def test_jax_jit_on_a_cpu_reads_subnormal_inputs_as_zero():
    x = np.full((1, 4), 1e-39, jnp.bfloat16)   # IEEE: x * rsqrt(0 + 1e-6) = 1e-36
    own, exact = Program(rms)([x])
    assert (own[0] == 0).all() and (exact[0] == 0).all()


def test_a_kernel_that_keeps_subnormals_passes_and_a_wrong_one_fails():
    graph = _lifted(rms, (4, 64), dtype=jnp.bfloat16)
    assert_kernel_matches(rms, graph, "reference", examples=10, regimes=("subnormal",),
                          specials=False, masked_rows=False)
    # subnormals among ordinary values: flushing them cannot hide a wrong kernel
    with pytest.raises(AssertionError, match="relative error"):
        assert_kernel_matches(lambda x: rms(x) * 1.5, graph, "reference", examples=10,
                              regimes=("normal",), masked_rows=False)


# ---- range tests: an overflowed product meets an inf in the kernel's own order --------------------
def test_in_a_range_test_a_nan_where_jax_has_inf_is_summation_order():
    want, exact = np.array([-np.inf, 0.5], np.float32), np.array([-np.inf, 0.5])
    got = np.array([np.nan, 0.5], np.float32)
    assert "non-finite" in output_mismatch(want, got, 1e-4, exact)
    assert output_mismatch(want, got, 1e-4, exact, near_limit=True) == ""
    # only that: a finite value, or the other infinity, is still wrong
    assert "non-finite" in output_mismatch(want, np.array([0.0, 0.5]), 1e-4, exact, near_limit=True)
    assert "non-finite" in output_mismatch(want, np.array([np.inf, 0.5]), 1e-4, exact,
                                           near_limit=True)
    nan_want = np.array([np.nan, 0.5], np.float32)
    assert "non-finite" in output_mismatch(nan_want, np.array([0.0, 0.5]), 1e-4,
                                           np.array([np.nan, 0.5]), near_limit=True)


# ---- inputs placed by the program, for a bare fused graph ------------------------------------------
def _fused_linear(m=16, k=64, n=32):
    X, W = ir.input("X", (m, k), "float32"), ir.input("W", (k, n), "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    x, w = b.input(X, imap=None, fmap=None), b.input(W, imap=(1,), fmap=None)
    (y,) = b.finish([((x @ w).acc_sum(), (1,))])
    return ir.KernelGraph([y], [X, W], ["Y"])


def test_a_bare_fused_graph_gets_large_values_sized_by_the_programs_matmul():
    """The large regime of a matmul operand is sqrt(max / 2K), read from fn's lifted spec: placed
    by the fused graph alone (the matmul hides in a custom kernel), X and W would both be max/2,
    every product would overflow, jax.jit would be off its float64 run everywhere and a kernel
    off by half would pass."""
    graph = _fused_linear()
    options = dict(examples=6, regimes=("large",), specials=False, masked_rows=False)
    assert_kernel_matches(lambda x, w: x @ w, graph, "reference", **options)
    with pytest.raises(AssertionError, match="relative error"):
        assert_kernel_matches(lambda x, w: (x @ w) * 1.5, graph, "reference", **options)
