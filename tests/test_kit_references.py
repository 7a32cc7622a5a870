"""What the testing kit holds a kernel to where jax.jit on a CPU is not a trustworthy answer, found by
the special-value sweep (bench/specials.py): XLA's CPU column max drops NaN, it reads subnormal
inputs as zero, and an overflowed fp32 product meets an inf as inf - inf or not by summation
order (so a range test carries no infinities). Each rule is paired with a wrong
kernel the kit must still catch on the same inputs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings

from mugraph import ir
from mugraph.testing import assert_kernel_matches, kernel_inputs
from mugraph.testing_kit import Program, output_mismatch, special_value


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


# ---- range tests carry no infinities ----------------------------------------------------------------
def test_no_input_list_mixes_infinities_or_nan_with_values_near_the_limit():
    """Mixed, an inf meets a product that overflowed (max * 1.5 in fp32) and the answer is inf -
    inf = NaN or the inf by summation order and FMA contraction: jax.jit happened to give -inf
    where a kernel summing in another order gave NaN. Each list is one kind, as the float test's
    cases are; both kinds are drawn."""
    graph = _lifted(lambda x, w: x @ w, (8, 16), (16, 8))
    seen = set()

    @settings(max_examples=60, phases=[Phase.generate])
    @given(kernel_inputs(graph))
    def draw(arrays):
        wide = [np.asarray(a, np.float64) for a in arrays]
        special = any((~np.isfinite(a)).any() for a in wide)
        limit = any((np.abs(a[np.isfinite(a)]) >= np.finfo(np.float32).max / 4).any() or
                    (np.abs(a[np.isfinite(a)]) > 1e10).all() for a in wide)
        assert not (special and limit)
        seen.update(kind for kind, drawn in (("special", special), ("range", limit)) if drawn)

    draw()
    assert seen == {"special", "range"}


def test_max_values_are_capped_where_the_program_reaches_its_limit_sooner():
    """±max in a matmul operand is twice the operand's large magnitude, not FLT_MAX: at FLT_MAX,
    b * g + b with b = g = FLT_MAX overflowed in the harness (two roundings) where jax.jit (an
    FMA) stayed finite, a difference of contraction, not of the program."""
    assert special_value("max", np.float32) == float(np.finfo(np.float32).max)
    assert special_value("-max", np.float32, large=1e18) == -2e18
    assert special_value("max", np.float16, large=1e9) == float(np.finfo(np.float16).max)
    graph = _lifted(lambda x, w: x @ w, (8, 16), (16, 8))

    @settings(max_examples=40, phases=[Phase.generate])
    @given(kernel_inputs(graph))
    def draw(arrays):
        for a in arrays:
            finite = np.abs(np.asarray(a, np.float64)[np.isfinite(a)])
            assert finite.max(initial=0) <= 2 * (np.finfo(np.float32).max / 32) ** 0.5

    draw()


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
