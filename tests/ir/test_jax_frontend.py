"""Tests of the JAX front end: values against JAX, exact structures, error goldens, a property.

Lifted graphs run in the float64 reference interpreter and are compared with the same function
run by JAX in float32 (tolerance relative to the output's scale). Error messages are golden
files under golden/jax_errors/ (tests/golden.py); regenerate them with MUGRAPH_UPDATE_GOLDEN=1
and review the diff.
"""
from __future__ import annotations

import collections
import functools
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from mugraph import ir
from mugraph.ir import DType, InvalidInput, KOp, TOp, UnsupportedOp
from mugraph.ir.ops import KERNEL_LAYOUT
from tests.golden import check_golden

S = jax.ShapeDtypeStruct
F32 = jnp.float32
GOLDEN = pathlib.Path(__file__).parent / "golden" / "jax_errors"


# ---- helpers -------------------------------------------------------------------------------------
def rand(*shape, seed=0, positive=False, dtype=np.float32):
    a = np.random.default_rng(seed).uniform(-1.0, 1.0, shape)
    return (np.abs(a) + 0.5 if positive else a).astype(dtype)


def check(fn, *arrays, rtol=1e-4, **kw):
    """Lift fn, run the graph in float64 and compare with JAX's float32 result; return the graph."""
    graph = ir.from_jax(fn, *arrays, **kw)
    want = jax.tree_util.tree_leaves(fn(*arrays))
    got = ir.interpret(graph, jax.tree_util.tree_leaves(arrays))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w, np.float64)
        assert g.shape == w.shape
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)
    return graph


def counts(graph) -> collections.Counter:
    return collections.Counter(n.op for n in graph.nodes)


def layout_nodes(graph) -> list:
    return [n for n in graph.nodes if n.op in KERNEL_LAYOUT]


X = rand(4, 8)
Y = rand(4, 8, seed=1)
P = rand(4, 8, seed=2, positive=True)


# ---- elementwise primitives ----------------------------------------------------------------------
ELEMENTWISE = {
    "add": (lambda x, y: x + y, X, Y),
    "sub": (lambda x, y: x - y, X, Y),
    "mul": (lambda x, y: x * y, X, Y),
    "div": (lambda x, p: x / p, X, P),
    "neg": (lambda x: -x, X),
    "exp": (jnp.exp, X),
    "log": (jnp.log, P),
    "sqrt": (jnp.sqrt, P),
    "rsqrt": (lax.rsqrt, P),
    "square": (jnp.square, X),
    "pow_2": (lambda x: x ** 2, X),
    "pow_3": (lambda x: x ** 3, X),
    "pow_m1": (lambda x: x ** -1, P),
    "pow_m2": (lambda x: x ** -2, P),
    "pow_1": (lambda x: x ** 1 + 0.0, X),
    "pow_half": (lambda p: p ** 0.5, P),
    "pow_tensor": (lambda p, x: p ** x, P, X),
    "const_pow": (lambda x: 2.0 ** x, X),
    "max_tensors": (jnp.maximum, X, Y),
    "min_tensors": (jnp.minimum, X, Y),
    "max_const": (lambda x: jnp.maximum(x, 0.25), X),
    "min_const": (lambda x: jnp.minimum(0.25, x), X),
    "logistic": (jax.nn.sigmoid, X),
    "erf": (lax.erf, X),
    "erfc": (lax.erfc, X),
    "tanh": (jnp.tanh, X),
    "abs": (jnp.abs, X),
    "expm1": (jnp.expm1, X),
    "log1p": (jnp.log1p, P),
    "exp2": (jnp.exp2, X),
    "lax_clamp": (lambda x: lax.clamp(-0.5, x, 0.5), X),
    "lax_clamp_tensor": (lambda x, y: lax.clamp(y, x, y + 1.0), X, Y),
    "clip_one_sided": (lambda x: jnp.clip(x, None, 0.5), X),
    "relu6": (jax.nn.relu6, X),
    "stop_gradient": (lambda x: lax.stop_gradient(x) * 2.0, X),
    "convert_roundtrip": (lambda x: (x.astype(jnp.float16).astype(F32) * 0 + x), X),
    "mixed_chain": (lambda x, y: jnp.tanh(x * y - 0.5) / (1.0 + jnp.exp(-x)), X, Y),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_values(name):
    fn, *arrays = ELEMENTWISE[name]
    check(fn, *arrays)


@pytest.mark.parametrize("fn, op", [
    (lambda x: x * x, TOp.MUL), (jnp.square, TOp.SQUARE), (lambda x: x ** 2, TOp.SQUARE),
    (lambda x: x ** 3, TOp.POW), (jax.nn.sigmoid, TOp.SIGMOID), (jnp.tanh, TOp.TANH),
    (lax.erf, TOp.ERF), (jnp.exp, TOp.EXP), (lax.rsqrt, TOp.RSQRT), (jax.nn.relu, TOp.RELU),
    (jax.nn.silu, TOp.SILU), (lambda x: jnp.clip(x, -1, 1), TOp.CLAMP),
    (lambda x: lax.clamp(-1.0, x, 1.0), TOp.CLAMP), (jax.nn.relu6, TOp.CLAMP),
])
def test_elementwise_lifts_to_one_op(fn, op):
    graph = ir.from_jax(fn, S((4, 8), F32))
    ops = [n.op for n in graph.nodes if n.op not in (KOp.INPUT, KOp.CONSTANT)]
    assert ops == [op]


def test_clamp_bounds():
    (out,) = ir.from_jax(lambda x: jnp.clip(x, -1, 2), S((4, 8), F32)).outputs
    assert out.op is TOp.CLAMP and out.arg == (-1.0, 2.0)
    (out,) = ir.from_jax(lambda x: jnp.minimum(jnp.maximum(x, 0.5), 3.0), S((4, 8), F32)).outputs
    assert out.op is TOp.CLAMP and out.arg == (0.5, 3.0)
    # lo > hi is not a clamp: it stays max then min (constantly hi)
    graph = check(lambda x: jnp.minimum(jnp.maximum(x, 0.5), 0.25), X)
    assert counts(graph)[TOp.CLAMP] == 0


def test_integer_pow_forms():
    assert ir.from_jax(lambda x: x ** -1, S((4,), F32)).outputs[0].op is TOp.DIV
    out = ir.from_jax(lambda x: x ** 3, S((4,), F32)).outputs[0]
    assert out.op is TOp.POW and out.srcs[1].arg[0] == 3.0


# ---- nested jaxprs -------------------------------------------------------------------------------
@jax.jit
def _jitted_helper(x, y):
    return jnp.tanh(x) * y + 1.0


@jax.custom_vjp
def _custom_vjp_exp(x):
    return jnp.exp(x)


_custom_vjp_exp.defvjp(lambda x: (jnp.exp(x), x), lambda r, g: (g * jnp.exp(r),))


@pytest.mark.parametrize("fn", [
    jax.nn.relu, jax.nn.silu, functools.partial(jax.nn.gelu, approximate=True),
    functools.partial(jax.nn.gelu, approximate=False), lambda x: jnp.clip(x, -0.5, 0.5),
    lambda x: _jitted_helper(x, x * 2.0), _custom_vjp_exp, jax.checkpoint(lambda x: x * jnp.exp(x)),
], ids=["relu", "silu", "gelu_tanh", "gelu_erf", "clip", "jit_helper", "custom_vjp", "remat"])
def test_nested_jaxprs(fn):
    check(fn, X)


def test_jit_wrapped_function():
    graph = check(jax.jit(lambda x, y: _jitted_helper(x, y) - y), X, Y)
    assert counts(graph)[TOp.TANH] == 1


# ---- constants -----------------------------------------------------------------------------------
def test_scalar_constants():
    scale = np.float32(3.0)
    uniform = np.full((8,), 2.0, np.float32)
    graph = check(lambda x: x * scale + uniform - jnp.ones(()) * 5, X)
    consts = sorted(n.arg[0] for n in graph.nodes if n.op is KOp.CONSTANT)
    assert consts == [2.0, 3.0, 5.0]  # 5.0 was folded from ones * 5
    assert not layout_nodes(graph)


def test_constant_dtype_follows_operand():
    graph = ir.from_jax(lambda x: x * 2.0 + 1, S((4, 8), jnp.bfloat16))
    assert {n.dtype for n in graph.nodes} == {DType.BFLOAT16}


def test_constant_too_big_for_16_bits_stays_float32():
    graph = ir.from_jax(lambda x: (x.astype(F32) * 1e5).astype(jnp.float16) + x,
                        S((4, 8), jnp.float16))
    (big,) = [n for n in graph.nodes if n.op is KOp.CONSTANT]
    assert big.arg[0] == 1e5 and big.dtype is DType.FLOAT32


def test_int_literals_propagate_into_nested_jit():
    (out,) = ir.from_jax(lambda x: jnp.clip(x, -1, 1), S((4, 8), F32)).outputs
    assert out.op is TOp.CLAMP and out.arg == (-1.0, 1.0) and out.srcs[0].op is KOp.INPUT


def test_constant_matmul_operand():
    graph = check(lambda x: x @ jnp.full((8, 3), 0.5), X)
    assert counts(graph)[KOp.CONSTANT] == 1


def test_constant_output():
    graph = ir.from_jax(lambda x: (x, jnp.full((2, 3), 1.5, F32)), S((4, 8), F32))
    assert graph.outputs[1].op is KOp.CONSTANT and graph.outputs[1].shape == (2, 3)


# ---- reductions and lazy layouts -----------------------------------------------------------------
COLUMN = rand(4, 1, seed=3)
REDUCTIONS = {
    "sum_last": (lambda x: jnp.sum(x, -1), X),
    "sum_first_keepdims": (lambda x: jnp.sum(x, 0, keepdims=True), X),
    "sum_both": (lambda x: jnp.sum(x, (0, 1)).reshape(1), X),
    "max_last": (lambda x: jnp.max(x, -1, keepdims=True), X),
    "min_first": (lambda x: jnp.min(x, 0), X),
    "mean_center": (lambda x: x - jnp.mean(x, 0), X),
    "var": (lambda x: jnp.var(x, -1, keepdims=True), X),
    "sum_of_broadcast": (lambda v: jnp.sum(jnp.broadcast_to(v, (4, 8)), 1), COLUMN),
    "max_of_broadcast": (lambda v: jnp.max(jnp.broadcast_to(v, (4, 5)), 1), COLUMN),
    "sum_of_constant": (lambda x: x + jnp.sum(jnp.ones((4, 8)), 1, keepdims=True), X),
    "logsumexp": (lambda x: jnp.log(jnp.sum(jnp.exp(x - x.max(-1, keepdims=True)), -1))
                  + x.max(-1), X),
    "layernorm": (lambda x: (x - x.mean(-1, keepdims=True))
                  * lax.rsqrt(x.var(-1, keepdims=True) + 1e-5), X),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_values(name):
    fn, *arrays = REDUCTIONS[name]
    check(fn, *arrays)


def test_sum_over_broadcast_dim_is_a_multiply():
    graph = check(lambda v: jnp.sum(jnp.broadcast_to(v, (4, 8)), 1, keepdims=True), COLUMN)
    assert counts(graph)[KOp.REDUCE_SUM] == 0 and counts(graph)[TOp.MUL] == 1
    assert not layout_nodes(graph)


def test_rmsnorm_matmul_structure():
    def rmsnorm_matmul(x, w):
        return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) @ w

    x, w = rand(16, 256), rand(256, 64, seed=1)
    graph = check(rmsnorm_matmul, x, w)
    X_, W_ = ir.input("x", (16, 256), "float32"), ir.input("w", (256, 64), "float32")
    r = ((X_ * X_).sum(1) / 256.0 + float(np.float32(1e-6))).rsqrt()
    assert graph.outputs[0] is (X_ * r) @ W_
    assert counts(graph) == {KOp.INPUT: 2, TOp.MUL: 2, KOp.REDUCE_SUM: 1, KOp.CONSTANT: 2,
                             TOp.DIV: 1, TOp.ADD: 1, TOp.RSQRT: 1, KOp.MATMUL: 1}
    assert r.shape == (16, 1)


@pytest.mark.parametrize("dtype", [F32, jnp.float16])
def test_softmax_structure(dtype):
    x = rand(16, 256).astype(dtype)
    graph = check(jax.nn.softmax, x, rtol=1e-4 if dtype == F32 else 2e-3)
    X_ = ir.input("x", (16, 256), DType.parse(np.dtype(dtype).name))
    e = (X_ - X_.amax(1)).exp()
    if dtype == F32:
        assert graph.outputs[0] is e / e.sum(1)
    else:  # jnp.sum upcasts 16-bit values: the sum is in fp32, rounded to fp16 once
        assert graph.outputs[0] is e / e.cast("float32").sum(1).cast("float16")
    assert counts(graph) == {KOp.INPUT: 1, KOp.REDUCE_MAX: 1, TOp.SUB: 1, TOp.EXP: 1,
                             KOp.REDUCE_SUM: 1, TOp.DIV: 1} | ({} if dtype == F32 else {TOp.CAST: 2})


def test_broadcasts_need_no_layout_nodes():
    row, col = rand(8), rand(4, 1)
    def fn(x, row, col):
        return (x * row + col) / jnp.sum(x, 0) - jnp.max(x, 1, keepdims=True)
    graph = check(fn, X, row, col)
    assert not layout_nodes(graph)


def test_transposes_cancel_lazily():
    v = rand(4)
    graph = check(lambda x, v: ((x.T * v).T + x).T.T, X, v)
    assert counts(graph)[KOp.TRANSPOSE] == 0
    assert [n.op for n in layout_nodes(graph)] == [KOp.RESHAPE]  # v as a column [4,1]


def test_unit_reshapes_squeeze_expand_dims():
    graph = check(lambda x: jnp.squeeze(jnp.expand_dims(x, 0)[:, None], (0, 1)) * 2.0, X)
    assert not layout_nodes(graph)
    graph = check(lambda x: x.reshape(1, 4, 1, 8), X)
    assert [n.op for n in layout_nodes(graph)] == [KOp.RESHAPE]


def test_outputs_are_materialized():
    graph = check(lambda x: (jnp.sum(x, 1), jnp.broadcast_to(jnp.sum(x, 0), (3, 4, 8)), x.T), X)
    assert [o.op for o in graph.outputs] == [KOp.RESHAPE, KOp.BROADCAST, KOp.TRANSPOSE]
    assert [o.shape for o in graph.outputs] == [(4,), (3, 4, 8), (8, 4)]


def test_concatenate():
    graph = check(lambda x, y: jnp.concatenate([x, y * 2.0], axis=1), X, Y)
    assert counts(graph)[KOp.CONCAT] == 1


# ---- matmuls -------------------------------------------------------------------------------------
MATMULS = {
    "mk_kn": (lambda a, b: a @ b, rand(4, 8), rand(8, 3)),
    "batched": (lambda a, b: a @ b, rand(2, 4, 8), rand(2, 8, 3)),
    "batch_broadcast": (lambda a, b: a @ b, rand(2, 4, 8), rand(1, 8, 3)),
    "bsk_kn": (lambda a, b: a @ b, rand(2, 3, 4, 8), rand(8, 5)),
    "matvec": (lambda a, v: a @ v, rand(4, 8), rand(8)),
    "vecmat": (lambda v, b: v @ b, rand(8), rand(8, 3)),
    "batched_matvec": (lambda a, v: jnp.einsum("bmk,bk->bm", a, v), rand(2, 4, 8), rand(2, 8)),
    "q_kT": (lambda q, k: q @ k.T, rand(4, 8), rand(6, 8)),
    "xT_w": (lambda x, w: x.T @ w, rand(8, 4), rand(8, 3)),
    "einsum_bqd_bkd": (lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k), rand(2, 4, 8), rand(2, 6, 8)),
    "einsum_bqk_bkd": (lambda p, v: jnp.einsum("bqk,bkd->bqd", p, v), rand(2, 4, 6), rand(2, 6, 8)),
    "attention": (lambda q, k, v: jax.nn.softmax(q @ k.T / np.sqrt(8.0)) @ v,
                  rand(4, 8), rand(6, 8), rand(6, 5)),
    "mlp": (lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2, rand(4, 8), rand(8, 16), rand(16, 3)),
    "kn_bkn": (lambda a, b: a @ b, rand(4, 8), rand(2, 8, 3)),
    "two_free_rhs": (lambda a, b: jnp.einsum("mk,knp->mnp", a, b), rand(4, 8), rand(8, 2, 3)),
    "broadcast_contracting": (lambda v, b: jnp.broadcast_to(v, (4, 8)) @ b, rand(4, 1), rand(8, 3)),
}


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_matmul_values(name):
    fn, *arrays = MATMULS[name]
    check(fn, *arrays)


@pytest.mark.parametrize("name, transposes", [
    ("mk_kn", 0), ("batched", 0), ("bsk_kn", 0), ("q_kT", 1), ("xT_w", 1),
    ("einsum_bqd_bkd", 1), ("einsum_bqk_bkd", 0), ("attention", 1), ("mlp", 0), ("kn_bkn", 0),
    ("two_free_rhs", 2),
])
def test_matmul_transposes(name, transposes):
    fn, *arrays = MATMULS[name]
    graph = ir.from_jax(fn, *arrays)
    assert counts(graph)[KOp.TRANSPOSE] == transposes
    assert counts(graph)[KOp.BROADCAST] == 0


def test_einsum_bqd_bkd_transposes_k():
    fn, q, k = MATMULS["einsum_bqd_bkd"]
    (out,) = ir.from_jax(fn, q, k).outputs
    assert out.op is KOp.MATMUL and out.srcs[1].op is KOp.TRANSPOSE
    assert out.srcs[1].arg == (0, 2, 1) and out.srcs[1].srcs[0].arg[0] == "k"


def test_matvec_uses_unit_dims():
    fn, a, v = MATMULS["matvec"]
    (out,) = ir.from_jax(fn, a, v).outputs
    assert out.op is KOp.RESHAPE and out.shape == (4,)
    assert out.srcs[0].op is KOp.MATMUL and out.srcs[0].srcs[1].shape == (8, 1)


# ---- outputs, names, dtypes ----------------------------------------------------------------------
def test_multiple_outputs_and_identity_output():
    graph = check(lambda x, y: (x + y, x, jnp.sum(y, 1, keepdims=True)), X, Y)
    assert graph.output_names == ("out0", "out1", "out2")
    assert graph.outputs[1] is graph.inputs[0]


def test_dict_outputs_are_named_by_key():
    graph = ir.from_jax(lambda x: {"b": x * 2.0, "a": x + 1.0}, S((4, 8), F32))
    assert graph.output_names == ("a", "b")


def test_input_names():
    def f(hidden, weight):
        return hidden @ weight
    assert ir.from_jax(f, S((4, 8), F32), S((8, 2), F32)).input_names == ("hidden", "weight")
    assert ir.from_jax(lambda *xs: xs[0] + xs[1], X, Y).input_names == ("arg0", "arg1")
    graph = ir.from_jax(f, S((4, 8), F32), S((8, 2), F32), input_names=["a", "b"],
                        output_names=["y"])
    assert graph.input_names == ("a", "b") and graph.output_names == ("y",)


def test_pytree_arguments():
    def f(params, x):
        return x @ params["w"] + params["b"]
    params = {"w": rand(8, 3), "b": rand(3)}
    graph = check(f, params, X)
    assert graph.input_names == ("params_b", "params_w", "x")  # pytree leaf order (sorted keys)
    graph = check(lambda xs: xs[0] * xs[1], (X, Y))
    assert graph.input_names == ("xs_0", "xs_1")


def test_unused_inputs_are_kept():
    graph = ir.from_jax(lambda x, y: x * 2.0, S((4, 8), F32), S((3,), F32))
    assert graph.input_names == ("x", "y")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_16bit_graphs_keep_their_dtype(dtype):
    def rmsnorm(x, w):
        xf = x.astype(F32)
        return (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(dtype) * w
    graph = ir.from_jax(rmsnorm, S((4, 8), dtype), S((8,), dtype))
    want = DType.parse(np.dtype(dtype).name)
    (out,) = graph.outputs
    assert out.dtype is want and out.op is TOp.MUL and out.srcs[0].op is TOp.CAST
    # the norm is computed in float32 between the two casts, as JAX computes it
    narrow = {n for n in graph.nodes if n.dtype is want}
    assert narrow == {*graph.inputs, out, out.srcs[0]}
    assert {n.dtype for n in graph.nodes} == {want, DType.FLOAT32}
    assert not layout_nodes(graph)


def test_widened_output_is_computed_in_float32():
    (out,) = ir.from_jax(lambda x: jnp.exp(x.astype(F32)), S((4, 8), jnp.float16)).outputs
    assert out.dtype is DType.FLOAT32 and out.op is TOp.EXP
    assert out.srcs[0] is ir.input("x", (4, 8), "float16").cast("float32")


def test_narrowed_output_is_rounded_by_a_cast():
    (out,) = ir.from_jax(lambda x: jnp.exp(x).astype(jnp.float16), S((4, 8), F32)).outputs
    assert out is ir.input("x", (4, 8), "float32").exp().cast("float16")


def test_mixed_input_dtypes_promote():
    graph = ir.from_jax(lambda x, w: x @ w, S((4, 8), jnp.float16), S((8, 2), F32))
    assert graph.outputs[0].dtype is DType.FLOAT32


# ---- errors (golden files) -----------------------------------------------------------------------
@jax.jit
def _jitted_sort(x):
    return jnp.sort(x) * 2.0


def _calls_jitted_sort(x):
    y = x + 1.0
    return _jitted_sort(y)


_BIG_WEIGHT = np.linspace(0.0, 1.0, 8 * 600_000, dtype=np.float32).reshape(8, 600_000)

ERROR_CASES = {
    "nested_jit_source": (_calls_jitted_sort, X),
    "sort": (lambda x: jnp.sort(x, axis=-1), X),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), X),
    "argmax": (lambda x: jnp.argmax(x, axis=1), X),
    "gather": (lambda x: x[jnp.array([0, 2])], X),
    "gather_traced_index": (lambda x, i: x[i], X, np.array([0, 1], np.int32)),
    "conv": (lambda x: lax.conv_general_dilated(x[None, None], x[None, None], (1, 1), "SAME"), X),
    "dynamic_slice": (lambda x: lax.dynamic_slice(x, (0, 0), (2, 2)), X),
    "int_tensor": (lambda x: x.astype(jnp.int32) + 1, X),
    "nan_constant": (lambda x: jnp.where(x > 0, x, jnp.nan), X),
    "select_three_cases": (lambda x: lax.select_n((x > 0).astype(jnp.int32) + (x > 1), x, 2 * x,
                                                  3 * x), X),
    "strided_slice": (lambda x: x[::2], X),
    "rank5_reshape": (lambda x: x.reshape(2, 2, 2, 2, 2) * 2.0, X),
    "rank5_of_broadcasts": (lambda x: jnp.broadcast_to(x[:, None, :, None, None], (4, 3, 8, 5, 2))
                            .reshape(12, 8, 10) * 2.0, X),
    "huge_closed_constant": (lambda x: x @ _BIG_WEIGHT, X),
    "rank5_output": (lambda x: jnp.broadcast_to(x, (2, 2, 2, 4, 8)), X),
    "unknown_primitive": (lambda x: jnp.sin(x), X),
    "int_input": (lambda x: x, np.zeros((2, 2), np.int32)),
    "float64_input": (lambda x: x, np.zeros((2, 2))),
    "python_scalar_input": (lambda x, s: x * s, X, 2.0),
    "rank5_input": (lambda x: x, S((1, 2, 1, 2, 1), F32)),
    "trace_failure": (lambda x: x @ x, X),
    "bad_input_names": (functools.partial(ir.from_jax, input_names=["a", "a"]),
                        lambda x, y: x + y, X, Y),
}


def _normalize(text: str, fn) -> str:
    """Make source lines stable: this file's lines become offsets from the traced function."""
    here = os.path.basename(__file__)
    first = getattr(getattr(fn, "__code__", None), "co_firstlineno", 0)

    def repl(m):
        return f"{here}:{int(m.group(1)) - first:+d}" if first else m.group(0)
    return re.sub(re.escape(here) + r":(\d+)", repl, text)


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_error_golden(name):
    fn, *args = ERROR_CASES[name]
    lift = ir.from_jax
    if isinstance(fn, functools.partial):
        lift, fn, args = fn, args[0], args[1:]
    with pytest.raises(ir.MugraphError) as info:
        lift(fn, *args)
    assert isinstance(info.value, (UnsupportedOp, InvalidInput))
    text = f"{type(info.value).__name__}: {_normalize(str(info.value), fn)}\n"
    check_golden(GOLDEN / f"{name}.txt", text)


def test_unsupported_op_fields():
    with pytest.raises(UnsupportedOp) as info:
        ir.from_jax(lambda x: jnp.sort(x), X)
    e = info.value
    assert e.primitive == "sort" and e.equation.startswith("a:f32[4,8] = sort")
    assert e.source.startswith("test_jax_frontend.py:") and e.source.endswith("<lambda>)")
    assert e.hint


# ---- property: random programs agree with JAX ----------------------------------------------------
UNARY_STEPS = {
    "neg": lambda v: -v, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu,
    "silu": jax.nn.silu, "gelu": jax.nn.gelu, "square": jnp.square, "abs": jnp.abs,
    "exp_tanh": lambda v: jnp.exp(jnp.tanh(v)), "rsqrt": lambda v: lax.rsqrt(v * v + 1.0),
    "log": lambda v: jnp.log(v * v + 1.0), "erf": lax.erf, "clip": lambda v: jnp.clip(v, -0.5, 0.5),
    "affine": lambda v: v * 0.5 + 0.25,
}
BINARY_STEPS = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
    "min": jnp.minimum, "div": lambda a, b: a / (b * b + 1.0),
}
REDUCE_STEPS = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "mean": jnp.mean}


def _partner(env, kind):
    return {"y": env["y"], "row": env["row"], "col": env["col"], "const": 0.75}[kind]


def _apply_step(step, v, env):
    kind, *a = step
    if kind == "unary":
        return UNARY_STEPS[a[0]](v)
    if kind == "binary":
        return BINARY_STEPS[a[0]](v, _partner(env, a[1]))
    if kind == "reduce":
        name, axis, keep, combine = a
        r = REDUCE_STEPS[name](v, axis=axis, keepdims=keep)
        r = r if keep else jnp.expand_dims(r, axis)
        return BINARY_STEPS[combine](v, r)
    if kind == "transposed":
        t = jnp.swapaxes(v, -1, -2)
        return jnp.swapaxes(BINARY_STEPS[a[0]](t, jnp.swapaxes(env["y"], -1, -2)), -1, -2)
    rows, cols = v.shape[-2], v.shape[-1]
    return {"right": lambda: v @ env["w"] / cols,
            "left": lambda: env["u"] @ v / rows,
            "right_t": lambda: jnp.einsum("...ab,cb->...ac", v, env["w"]) / cols,
            "gram": lambda: (v @ jnp.swapaxes(v, -1, -2)) @ v / (rows * cols)}[a[0]]()


steps = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY_STEPS))),
    st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY_STEPS)),
              st.sampled_from(["y", "row", "col", "const"])),
    st.tuples(st.just("reduce"), st.sampled_from(sorted(REDUCE_STEPS)), st.sampled_from([-1, -2]),
              st.booleans(), st.sampled_from(["sub", "mul", "add"])),
    st.tuples(st.just("transposed"), st.sampled_from(["add", "mul", "max"])),
    st.tuples(st.just("matmul"), st.sampled_from(["right", "left", "right_t", "gram"])),
)


@settings(max_examples=40)  # derandomised, no deadline: the "ci" profile in tests/conftest.py
@given(batch=st.sampled_from([(), (2,)]), rows=st.sampled_from([1, 3, 4]),
       cols=st.sampled_from([1, 2, 5]), program=st.lists(steps, min_size=1, max_size=5),
       seed=st.integers(0, 2 ** 16))
def test_random_programs_agree_with_jax(batch, rows, cols, program, seed):
    names = ("x", "y", "w", "u", "row", "col")
    shapes = ((*batch, rows, cols), (*batch, rows, cols), (cols, cols), (rows, rows), (cols,),
              (rows, 1))
    arrays = [rand(*s, seed=seed + i) for i, s in enumerate(shapes)]

    def fn(x, y, w, u, row, col):
        env = dict(zip(names, (x, y, w, u, row, col)))
        v = x
        for step in program:
            v = _apply_step(step, v, env)
        return v, jnp.sum(v, -1)

    check(fn, *arrays)


def test_a_decode_step_s_probs_go_on_the_left_of_v():
    """jnp.einsum emits a decode step's probs @ V as dot_general(V, probs) (one query row): the
    front end lifts it as probs [1, T] @ V [T, d], the form the search's attention structures take,
    not V^T @ probs^T."""
    def pv(p, v):
        return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(p, axis=-1), v)
    graph = ir.from_jax(pv, S((1, 8, 1, 64), F32), S((1, 64, 8, 16), F32))
    (mm,) = [n for n in graph.nodes if n.op is KOp.MATMUL]
    assert mm.shape == (1, 8, 1, 16) and mm.srcs[0].op is ir.TOp.DIV
    rng = np.random.default_rng(0)
    check(pv, rng.standard_normal((1, 8, 1, 64)).astype(np.float32),
          rng.standard_normal((1, 64, 8, 16)).astype(np.float32))
