"""The predicate and select ops in generated kernels: every new elementwise op on tiles holding NaN,
+-inf and signed zeros, and a causal mask built from iota leaves that a gridded kernel tiles, each on
the CPU harness against the interpreter (and JAX), and compiled with NVRTC for sm_80 and sm_90. Index
tiles are computed in the kernel (no launch fills them, no parameter carries them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir
from mugraph.codegen import compile_cuda
from mugraph.ir import TOp
from mugraph.ir.ops import COMPARISONS
from tests.codegen.bundle import build_bundle, bundle_source, custom_names, generate_all, run_bundled

ROWS, COLS = 16, 64


def _specials(seed: int) -> np.ndarray:
    """Random values with NaN, +-inf, +-0 and exact ties planted."""
    a = np.random.default_rng(seed).uniform(-3.0, 3.0, (ROWS, COLS)).astype(np.float32)
    a[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    a[1::3, 7] = np.nan
    a[2::5, 9] = -np.inf
    return a


X, Y = _specials(0), _specials(1)
Y[3, :] = X[3, :]          # ties: eq / ge / le are true there


def _one_op(op, build):
    """A gridded kernel (two blocks of rows) applying `build(x, y)` to input tiles."""
    Xn, Yn = ir.input("X", X.shape, "float32"), ir.input("Y", Y.shape, "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    x = b.input(Xn, imap=(0,))
    y = b.input(Yn, imap=(0,)) if op in TWO_INPUTS else None
    (out,) = b.finish([(build(x, y).acc_sum(), (0,), "float32")])
    return ir.KernelGraph([out], [Xn, Yn])


TWO_INPUTS = COMPARISONS | {TOp.SELECT}


OPS = {
    TOp.ABS: lambda x, y: x.abs(),
    TOp.LOG1P: lambda x, y: x.abs().log1p(),
    TOp.EXPM1: lambda x, y: x.expm1(),
    TOp.SOFTPLUS: lambda x, y: x.softplus(),
    TOp.LEAKY_RELU: lambda x, y: x.leaky_relu(0.125),
    TOp.GT: lambda x, y: x.gt(y),
    TOp.GE: lambda x, y: x.ge(y),
    TOp.LT: lambda x, y: x.lt(y),
    TOp.LE: lambda x, y: x.le(y),
    TOp.EQ: lambda x, y: x.eq(y),
    TOp.NE: lambda x, y: x.ne(y),
    TOp.IS_FINITE: lambda x, y: x.is_finite(),
    TOp.SELECT: lambda x, y: x.gt(y).select(y, float("-inf")),
}
# what XLA computes for each op, on the same values (the reference semantics, independently)
JAX = {
    TOp.ABS: lambda x, y: jnp.abs(x), TOp.LOG1P: lambda x, y: jnp.log1p(jnp.abs(x)),
    TOp.EXPM1: lambda x, y: jnp.expm1(x), TOp.SOFTPLUS: lambda x, y: jax.nn.softplus(x),
    TOp.LEAKY_RELU: lambda x, y: jax.nn.leaky_relu(x, 0.125),
    TOp.GT: lambda x, y: x > y, TOp.GE: lambda x, y: x >= y, TOp.LT: lambda x, y: x < y,
    TOp.LE: lambda x, y: x <= y, TOp.EQ: lambda x, y: x == y, TOp.NE: lambda x, y: x != y,
    TOp.IS_FINITE: lambda x, y: jnp.isfinite(x), TOp.SELECT: lambda x, y: jnp.where(x > y, y, -jnp.inf),
}


def _causal_softmax():
    """softmax(where(row >= col, s, -inf)) with the indices as iota leaves; rows split over the grid,
    so block 1 must see rows 16..31 of the row iota (its tile, not its own 0..15)."""
    rows, cols = 32, 64
    S = ir.input("S", (rows, cols), "float32")
    r, c = ir.iota((rows, 1), 0), ir.iota((1, cols), 1)
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    s, tr, tc = b.input(S, imap=(0,)), b.input(r, imap=(0,)), b.input(c)
    masked = tr.ge(tc).select(s, float("-inf"))
    e = (masked - masked.amax(1)).exp()
    (out,) = b.finish([((e / e.sum(1)).acc_sum(), (0,), "float32")])
    return ir.KernelGraph([out], [S])


def _masked_row_sums():
    """sum over j <= i of s[i, j], the columns walked by a loop of 4: the column iota (float16) is tiled
    by the loop too, and the row iota is read transposed from a [1, 32] iota."""
    S = ir.input("S", (32, 64), "float32")
    r, c = ir.iota((1, 32), 1).transpose((1, 0)), ir.iota((1, 64), 1, "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    s, tr, tc = b.input(S, imap=(0,), fmap=1), b.input(r, imap=(0,)), b.input(c, fmap=1)
    (out,) = b.finish([(tc.le(tr).select(s, 0.0).acc_sum_last(), (0,), "float32")])
    return ir.KernelGraph([out], [S])


@pytest.fixture(scope="module")
def bundle():
    graphs = {op.value: _one_op(op, build) for op, build in OPS.items()}
    graphs["causal_softmax"] = _causal_softmax()
    graphs["masked_row_sums"] = _masked_row_sums()
    modules = generate_all(graphs)
    return graphs, modules, build_bundle(modules)


@pytest.mark.parametrize("op", list(OPS), ids=lambda op: op.value)
def test_op_on_special_values_matches_interpreter_and_jax(bundle, op):
    graphs, modules, cpu = bundle
    (got,) = run_bundled(modules[op.value], cpu, [X, Y])
    (want,) = ir.interpret(graphs[op.value], [X, Y], dtype="own")
    xla = np.asarray(JAX[op](jnp.asarray(X), jnp.asarray(Y)), np.float32)
    for ref in (want, xla):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(ref) * np.sign(ref))
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6, equal_nan=True)


def test_causal_mask_from_iota_tiles_matches_jax(bundle):
    graphs, modules, cpu = bundle
    s = np.random.default_rng(2).standard_normal((32, 64)).astype(np.float32)
    (got,) = run_bundled(modules["causal_softmax"], cpu, [s])
    mask = jnp.arange(32)[:, None] >= jnp.arange(64)[None, :]
    want = np.asarray(jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[np.asarray(~mask)] == 0).all() and (got[16, :17] > 0).all()


def test_iota_tiles_follow_the_loop_and_transposes(bundle):
    graphs, modules, cpu = bundle
    s = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    (got,) = run_bundled(modules["masked_row_sums"], cpu, [s])
    want = np.tril(s).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plan = modules["masked_row_sums"].plan
    assert [k.kind for k in plan.kernels] == ["custom"] and plan.kernels[0].args == ("S", "out0")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_with_nvrtc(bundle, arch):
    _, modules, _ = bundle
    kernel = compile_cuda(bundle_source(modules, arch), arch, name="select_ops")
    for name in custom_names(modules):
        assert kernel.resources(name).spills == 0, name
