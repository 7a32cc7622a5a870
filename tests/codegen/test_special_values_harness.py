"""IEEE special values through the generated CUDA on the CPU harness: every elementwise op agrees with the
interpreter on NaN, ±inf, ±0, denormals and near-overflow values; max, min, relu and max reductions propagate
NaN as XLA's do; 16-bit rows whose sum passes the fp16 maximum stay finite (fp32 accumulation)."""
from __future__ import annotations

import numpy as np

from mugraph import ir
from mugraph.codegen import run_on_cpu


def _matmul_relu(m=16, k=64, n=64):
    X, W = ir.input("X", (m, k), "float16"), ir.input("W", (k, n), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    x = b.input(X, imap=None, fmap=1)
    w = b.input(W, imap=(1,), fmap=0)
    y = (x @ w).acc_sum()
    outs = b.finish([(y.relu(), (1,)), (y.maximum(b.constant(-0.5)).minimum(b.constant(0.5)), (1,))])
    return ir.KernelGraph(outs, [X, W])


def _row_max(m=16, k=64):
    X = ir.input("X", (m, k), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    x = b.input(X, imap=None, fmap=1)
    (out,) = b.finish([(x.acc_max_last(), (None,))])
    return ir.KernelGraph([out], [X])


def test_nan_survives_relu_max_and_min_after_a_matmul_on_the_harness():
    graph = _matmul_relu()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float16)
    w = rng.standard_normal((64, 64)).astype(np.float16)
    x[3, 5] = np.nan
    for got, want in zip(run_on_cpu(graph, [x, w]), ir.interpret(graph, [x, w], dtype="own")):
        assert np.isnan(got[3]).all() and np.isnan(want[3]).all()
        others = np.delete(np.arange(16), 3)
        assert np.isfinite(got[others]).all()
        np.testing.assert_allclose(got[others].astype(np.float64), want[others], atol=2e-2, rtol=2e-2)


def test_a_max_reduction_over_a_row_holding_nan_is_nan_on_the_harness():
    graph = _row_max()
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float16)
    x[2, 40] = np.nan        # in the second loop iteration's tile
    x[7, :] = -np.inf         # a fully masked row is -inf, not NaN
    (got,) = run_on_cpu(graph, [x])
    assert np.isnan(got[2, 0]) and got[7, 0] == -np.inf
    rows = [r for r in range(16) if r not in (2, 7)]
    np.testing.assert_array_equal(got[rows, 0], x[rows].max(axis=1))


def _fused_layernorm(rows=4, n=256):
    X = ir.input("x", (rows, n), "float16")
    b = ir.BlockBuilder(grid=(rows, 1, 1), forloop=1)
    x = b.input(X, imap=(0,), fmap=1).acc_sum()   # one trip: the row tile itself, kept in fp32
    mean = x.sum(1) / float(n)
    d = x - mean
    var = (d * d).sum(1) / float(n)
    (out,) = b.finish([(d * (var + float(np.float16(1e-5))).rsqrt(), (0,))])  # eps as fp16 JAX adds it
    return ir.KernelGraph([out], [X])


def test_an_fp16_layernorm_with_row_sums_past_65504_stays_finite_on_the_harness():
    graph = _fused_layernorm()
    x = (300 + np.random.default_rng(2).standard_normal((4, 256))).astype(np.float16)
    assert (x.astype(np.float64).sum(axis=1) > 65504).all()
    (got,) = run_on_cpu(graph, [x])
    (want,) = ir.interpret(graph, [x])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-2)


SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3e38, -3e38, 1.0, -1.0, 0.5, 88.0, -88.0,
            700.0, -2.5]


def _special_tiles(seed=0, shape=(16, 64)):
    """Three fp32 tiles whose columns pair every special value with every other (and randoms)."""
    rng = np.random.default_rng(seed)
    n = len(SPECIALS)
    a = rng.standard_normal((3,) + shape).astype(np.float32)
    for i, s in enumerate(SPECIALS):
        a[0, i, :n] = s                     # row i of x: one special value
        a[1, :n, i] = s                     # column i of y: every special value against row i of x
        a[2, i, n:2 * n] = s
    return a


def _every_op_graph(shape=(16, 64)):
    """One kernel applying every elementwise op to special-value tiles: one output per op."""
    from mugraph.ir.ops import BINARY, TERNARY, UNARY
    ins = [ir.input(name, shape, "float32") for name in ("X", "Y", "Z")]
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    x, y, z = (b.input(t, imap=None, fmap=1).acc_sum() for t in ins)
    ops = sorted(UNARY | BINARY | TERNARY, key=lambda op: op.value)
    args = {ir.TOp.CLAMP: (-1.0, 1.0), ir.TOp.CAST: ir.DType.FLOAT16}
    outs = [ir.BNode(op, (x, y, z)[:1 if op in UNARY else 2 if op in BINARY else 3], args.get(op))
            for op in ops]
    return ops, ir.KernelGraph(b.finish([(o, (None,)) for o in outs]), ins)


def test_every_elementwise_op_treats_special_values_as_the_interpreter_does_on_the_harness():
    ops, graph = _every_op_graph()
    arrays = list(_special_tiles())
    with np.errstate(all="ignore"):
        want = ir.interpret(graph, arrays, dtype="own")
    got = run_on_cpu(graph, arrays)
    for op, g, w in zip(ops, got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{op.value}: NaN positions")
        finite = np.isfinite(w)
        np.testing.assert_array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)],
                                      err_msg=f"{op.value}: infinities")
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-5, atol=1e-30,
                                   err_msg=f"{op.value}: finite values")


def _fp32_matmul(m=16, k=32, n=16):
    X, W = ir.input("x", (m, k), "float32"), ir.input("w", (k, n), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    (y,) = b.finish([((b.input(X) @ b.input(W)).acc_sum(), None)])
    return ir.KernelGraph([y], [X, W])


def test_fp32_matmuls_on_tensor_cores_keep_ieee_specials_on_the_harness():
    """The bf16 split of fp32 operands (hi, lo): an inf keeps its inf (inf * 0 residuals would make NaN), a NaN
    stays NaN, inf * 0 is NaN, a finite value that rounds to bf16 inf saturates instead (FLT_MAX * 0.5 is
    finite)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 32)) * 0.25).astype(np.float32)
    w = (rng.standard_normal((32, 16)) * 0.25).astype(np.float32)
    x[0, 0], w[0, :] = np.inf, 1.0          # residual of 1.0 is 0: inf * 1 must stay inf
    w[0, 3], w[0, 4], w[0, 5] = 0.0, -2.0, 1.001
    x[1, 1] = -np.inf
    x[2, 2] = np.nan
    x[3, 3], w[3, :] = np.finfo(np.float32).max, 0.5
    x[4, 4], w[4, 6], w[4, 7] = np.inf, np.inf, -np.inf
    (got,) = run_on_cpu(_fp32_matmul(), [x, w])
    with np.errstate(invalid="ignore", over="ignore"):
        want = (x.astype(np.float64)[:, :, None] * w.astype(np.float64)[None, :, :]).sum(axis=1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0))
    np.testing.assert_array_equal(np.isinf(got) & (got < 0), np.isinf(want) & (want < 0))
    assert np.isnan(got[0, 3]) and got[0, 4] == -np.inf and got[0, 5] == np.inf and np.isfinite(got[3, :6]).all()
    finite = np.isfinite(want)
    scale = np.abs(np.where(finite, want, 0)).max(axis=1, keepdims=True) + 1
    np.testing.assert_array_less(np.abs(got[finite] - want[finite]), (1e-3 * np.broadcast_to(scale, want.shape))[finite])
