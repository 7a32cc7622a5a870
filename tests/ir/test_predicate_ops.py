"""Predicates, selects, index leaves and the new elementwise ops across their columns: the JAX
front end against `jax.jit(fn)` (NaN, +-inf, ties and signed zeros included), the structures it
lifts to, typed errors for what is still refused, and the finite-field meaning (sound: a program
that differs from the spec only on ties, on a dropped inf guard or in a blended select fails)."""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np
import pytest
from jax import lax

from mugraph import ir
from mugraph.ir import KNode, KOp, TOp, UnsupportedOp
from mugraph.ir.ops import KERNEL_LAYOUT
from mugraph.verify.finite_field import finite_field_test

S = jax.ShapeDtypeStruct


def specials(shape, seed=0, dtype=np.float32) -> np.ndarray:
    """Uniform values with NaN, +-inf, +-0, ones and repeated entries planted."""
    a = np.random.default_rng(seed).uniform(-3.0, 3.0, shape)
    flat = a.reshape(-1)
    flat[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0]
    flat[7::11] = flat[8::11][:len(flat[7::11])]  # ties with the next element
    return a.astype(dtype)


X = specials((6, 8))
Y = specials((6, 8), seed=1)
Y[2] = X[2]  # a row of exact ties


def same_values(got, want, rtol=1e-5):
    """Equal NaN positions, equal infinities, close finite values."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isinf(got), got, 0), np.where(np.isinf(want), want, 0))
    finite = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol * scale)


def lifted_agrees(fn, *arrays, rtol=1e-5):
    """Lift `fn`, run it in float64 and in its own dtypes, compare both with jax.jit(fn)."""
    graph = ir.from_jax(fn, *arrays)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*arrays))
    for dtype, tol in (("float64", rtol), ("own", max(rtol, 1e-5))):
        got = ir.interpret(graph, list(arrays), dtype=dtype)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same_values(g, w, tol)
    return graph


def ops_of(graph) -> collections.Counter:
    return collections.Counter(n.op for n in graph.nodes if n.op not in (KOp.INPUT, KOp.CONSTANT))


# ---- every new op against JAX on special values --------------------------------------------------
ELEMENTWISE = {
    "gt": lambda x, y: jnp.where(x > y, x, y), "ge": lambda x, y: jnp.where(x >= y, x, y),
    "lt": lambda x, y: jnp.where(x < y, x, y), "le": lambda x, y: jnp.where(x <= y, x, y),
    "eq": lambda x, y: jnp.where(x == y, 1.0, x), "ne": lambda x, y: jnp.where(x != y, y, 2.0),
    "mask_as_float": lambda x, y: (x > y).astype(jnp.float32) * 3.0 - (x <= 0.5),
    # XLA rewrites x * convert(mask) as select(mask, x, 0): NaN/inf of x where the mask is false
    # give 0 under jax.jit; through a broadcast it does not, and NaN * 0 stays NaN
    "mask_multiply": lambda x, y: x * (y > 0.5).astype(x.dtype) + (x < 0).astype(x.dtype) * y,
    "mask_multiply_broadcast": lambda x, y: x * (jnp.arange(8) < 3).astype(x.dtype),
    "mask_multiply_of_masks": lambda x, y: x * ((y > 0.5).astype(x.dtype) * (y < 2).astype(x.dtype)),
    "isfinite": lambda x, y: jnp.where(jnp.isfinite(x), x, -1.0),
    "isnan": lambda x, y: jnp.where(jnp.isnan(x), 0.0, x),
    "isinf": lambda x, y: jnp.where(jnp.isinf(x), 7.0, x),
    "and_or_not": lambda x, y: jnp.where(((x > 0) & (y < 1)) | ~(x < 2), x, y),
    "xor": lambda x, y: jnp.where((x > 0) ^ (y > 0), x, -y),
    "where_neg_inf": lambda x, y: jnp.where(x > y, x, -jnp.inf),
    "where_pos_inf": lambda x, y: jnp.minimum(jnp.where(x < 0.5, x, jnp.inf), y),
    "nested_where": lambda x, y: jnp.where(x > 0, jnp.where(y > 0, x, y), 0.5),
    "abs": lambda x, y: jnp.abs(x),
    "log1p": lambda x, y: jnp.log1p(jnp.abs(x)),
    "expm1": lambda x, y: jnp.expm1(x),
    "softplus": lambda x, y: jax.nn.softplus(x),
    "logaddexp_zero_first": lambda x, y: jnp.logaddexp(0.0, x),
    "logaddexp": lambda x, y: jnp.logaddexp(x, y),
    "leaky_relu": lambda x, y: jax.nn.leaky_relu(x, 0.2),
    "where_gt_leaky": lambda x, y: jnp.where(x > 0, x, 0.05 * x),
    "where_lt_leaky": lambda x, y: jnp.where(x < 0, x * 0.3, x),
    "prelu_tensor_slope": lambda x, y: jnp.where(x >= 0, x, y * x),
    "elu": lambda x, y: jax.nn.elu(x),
    "relu_by_where": lambda x, y: jnp.where(x > 0, x, 0.0),
    "isclose": lambda x, y: jnp.where(jnp.isclose(x, y, atol=1.0), x, y),
    "nan_to_num": lambda x, y: jnp.nan_to_num(x),
    "heaviside": lambda x, y: jnp.heaviside(x, 0.5),
    "softmax_where": lambda x, y: jax.nn.softmax(x, axis=-1, where=y > 0),
    "safe_log": lambda x, y: jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0),
    "leaky_relu_grad": lambda x, y: jax.grad(lambda a: jnp.sum(jax.nn.leaky_relu(a) * y))(x),
    "logsumexp_grad": lambda x, y: jax.grad(lambda a: jnp.sum(jax.nn.logsumexp(a, -1)))(x),
    "hard_tanh_select": lambda x, y: jnp.where(jnp.abs(x) > 1, jnp.sign(x), x),
    "sign": lambda x, y: jnp.sign(x) * y,
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_values_match_jax_on_special_values(name):
    lifted_agrees(ELEMENTWISE[name], X, Y)


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_masked_16_bit_programs_keep_their_dtype(dtype):
    x, y = X.astype(dtype), Y.astype(dtype)
    graph = lifted_agrees(lambda a, b: jnp.where(a > b, jax.nn.leaky_relu(a), -jnp.inf), x, y,
                          rtol=1e-2)
    assert graph.outputs[0].dtype is ir.DType.parse(np.dtype(dtype).name)


@pytest.mark.parametrize("fn", [
    lambda x: x * (jnp.arange(8) < 3).astype(x.dtype),
    lambda x: x + 0.5 * (jnp.arange(8)[None, :] - jnp.arange(6)[:, None]).astype(x.dtype),
    lambda x: x * (x > 0.5).astype(x.dtype),
    lambda x: x * (jnp.arange(8) < 3000).astype(x.dtype),   # 3000 is past fp16's exact integers
])
def test_masks_and_indices_cast_to_16_bits_keep_the_program_16_bit(fn):
    x = X.astype(np.float16)
    graph = lifted_agrees(fn, x, rtol=1e-3)
    assert graph.outputs[0].dtype is ir.DType.FLOAT16


# ---- structures ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    jax.nn.leaky_relu, lambda x: jnp.where(x > 0, x, 0.1 * x), lambda x: jnp.where(x >= 0, x, x * 0.1),
    lambda x: jnp.where(x < 0, 0.1 * x, x), lambda x: jnp.where(0 < x, x, 0.1 * x),
])
def test_leaky_relu_forms_lift_to_one_op(fn):
    graph = ir.from_jax(fn, S((4, 8), jnp.float32))
    assert ops_of(graph) == {TOp.LEAKY_RELU: 1}


def test_strict_form_with_a_tensor_slope_stays_a_select():
    # where(x > 0, x, s * x) takes s * 0 at x = 0: NaN for s = inf, so it is no leaky relu
    graph = ir.from_jax(lambda x, s: jnp.where(x > 0, x, s * x), X, Y)
    assert TOp.LEAKY_RELU not in ops_of(graph) and TOp.SELECT in ops_of(graph)
    lifted_agrees(lambda x, s: jnp.where(x > 0, x, s * x), X, np.full_like(Y, np.inf))


@pytest.mark.parametrize("fn", [jax.nn.softplus, lambda x: jnp.logaddexp(x, 0.0),
                                lambda x: jnp.logaddexp(0.0, x)])
def test_softplus_lifts_to_one_op(fn):
    assert ops_of(ir.from_jax(fn, S((4, 8), jnp.float32))) == {TOp.SOFTPLUS: 1}


@pytest.mark.parametrize("fn, keep", [
    (lambda x: jnp.tril(x), "lower"), (lambda x: jnp.triu(x, 1), "upper"),
    (lambda x: jnp.where(jnp.arange(6)[:, None] >= jnp.arange(8)[None, :], x, -jnp.inf), "lower"),
    (lambda x: jnp.where(jnp.tril(jnp.ones((6, 8), bool)), x, -jnp.inf), "lower"),
])
def test_index_masks_are_iota_leaves_a_comparison_and_a_select(fn, keep):
    graph = lifted_agrees(fn, X)
    iotas = [n for n in graph.nodes if n.op is KOp.IOTA]
    assert sorted((n.shape, n.arg[1]) for n in iotas) == [((1, 8), 1), ((6, 1), 0)]
    assert not [n for n in graph.nodes if n.op in KERNEL_LAYOUT]
    assert ops_of(graph)[TOp.SELECT] == 1 and ops_of(graph)[TOp.GE] == 1


def test_index_arithmetic_is_exact_and_layout_free():
    fn = lambda x: jnp.where(jnp.abs(jnp.arange(6)[:, None] - 2 * jnp.arange(8)[None, :] + 3) <= 4,
                             x, 0.0)
    graph = lifted_agrees(fn, X)
    assert not [n for n in graph.nodes if n.op in KERNEL_LAYOUT]


def test_float_iota_is_a_tensor():
    graph = lifted_agrees(lambda x: x * jnp.arange(8.0) + jnp.arange(6.0)[:, None], X)
    assert ops_of(graph)[KOp.IOTA] == 2


def test_where_with_neg_inf_keeps_the_branch_dtype():
    graph = ir.from_jax(lambda s: jnp.where(s > 0, s, -jnp.inf), S((4, 8), jnp.float16))
    (select,) = [n for n in graph.nodes if n.op is TOp.SELECT]
    assert select.dtype is ir.DType.FLOAT16 and select.srcs[2].arg[0] == -np.inf


# ---- realistic programs, lifted and run equal to jax.jit(fn) ---------------------------------------
def causal_softmax(s):
    rows, cols = s.shape
    mask = jnp.arange(rows)[:, None] >= jnp.arange(cols)[None, :]
    return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)


def causal_attention(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((q.shape[0], k.shape[0]), bool)), s, -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v


def softplus_mlp(x, w1, w2):
    return jax.nn.softplus(x @ w1) @ w2


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


PROGRAMS = {
    "leaky_relu_after_matmul": (lambda x, w: jax.nn.leaky_relu(x @ w, 0.1), rand(8, 16), rand(16, 8, seed=1)),
    "masked_softmax_causal": (causal_softmax, rand(8, 8)),
    "masked_softmax_fully_masked_row": (lambda s: jax.nn.softmax(
        jnp.where(jnp.arange(8)[None, :] < jnp.arange(4)[:, None], s, -jnp.inf), axis=-1), rand(4, 8)),
    "causal_attention": (causal_attention, rand(8, 4), rand(8, 4, seed=1), rand(8, 4, seed=2)),
    "logsumexp": (lambda x: jax.nn.logsumexp(x, axis=-1, keepdims=True), rand(6, 8)),
    "logsumexp_scipy_with_inf_rows": (lambda x: jss.logsumexp(x, axis=-1), X),
    "log_softmax": (lambda x: jax.nn.log_softmax(x, axis=-1), rand(6, 8)),
    "softplus_mlp": (softplus_mlp, rand(4, 8), rand(8, 16, seed=1), rand(16, 4, seed=2)),
    "where_leaky": (lambda x: jnp.where(x > 0, x, 0.3 * x), X),
    "tril": (jnp.tril, X),
    "padding_mask_softmax": (lambda x, n: jax.nn.softmax(
        jnp.where(jnp.arange(8)[None, :] < n[:, None], x, -jnp.inf), axis=-1),
        rand(6, 8), np.array([1, 3, 8, 0, 5, 2], np.float32)),
    "masked_mean": (lambda x, m: jnp.sum(jnp.where(m > 0, x, 0.0), -1) / jnp.sum(m > 0, -1, x.dtype),
                    rand(6, 8), rand(6, 8, seed=3)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_realistic_programs_agree_with_jax_jit(name):
    fn, *arrays = PROGRAMS[name]
    lifted_agrees(fn, *arrays, rtol=1e-4)


def test_logsumexp_keeps_its_inf_guard_and_drops_the_abs_of_a_sum_of_exps():
    graph = ir.from_jax(lambda x: jax.nn.logsumexp(x, axis=-1), S((4, 8), jnp.float32))
    assert ops_of(graph)[TOp.IS_FINITE] == 1 and ops_of(graph)[TOp.SELECT] == 1
    assert TOp.ABS not in ops_of(graph)


@pytest.mark.parametrize("fn", [lambda x: jnp.abs(jnp.sqrt(x)), lambda x: jnp.abs(x * x),
                                lambda x: jnp.abs(jnp.exp(x) - 1.0)])
def test_abs_stays_where_the_value_may_be_negative_or_minus_zero(fn):
    # sqrt(-0.0) is -0.0: abs turns it into +0.0
    graph = lifted_agrees(fn, np.abs(X) * np.sign(X + 0.5))
    assert TOp.ABS in ops_of(graph)


# ---- what is still refused: typed, with the primitive, equation, source line and a hint ----------
@pytest.mark.parametrize("fn, primitive", [
    (lambda x: jnp.where(x > 0, x, jnp.nan), "select_n"),
    (lambda x: x * ((x > 0).astype(jnp.int32) // 2), "div"),     # integer work on a tensor
    (lambda x: jnp.where(((x > 0).astype(jnp.int32) & 1) == 0, x, 0.0), "and"),
    (lambda x: x.astype(jnp.int32) * 1.0, "convert_element_type"),
    (lambda x: lax.select_n((x > 0).astype(jnp.int32) + (x > 1), x, 2 * x, 3 * x), "select_n"),
])
def test_unsupported_masks_and_indices_are_typed_errors(fn, primitive):
    with pytest.raises(UnsupportedOp) as info:
        ir.from_jax(fn, X)
    e = info.value
    assert e.primitive == primitive and e.equation and e.hint
    assert e.source.startswith("test_predicate_ops.py:")


def test_iota_leaves_round_trip_through_json():
    graph = ir.from_jax(causal_attention, rand(8, 4), rand(8, 4), rand(8, 4))
    assert ir.from_json(ir.to_json(graph)) is graph
    assert '"-inf"' in ir.to_json(graph)


# ---- the finite-field meaning: sound where no law applies ------------------------------------------
def _replace_op(graph, old, new):
    mapping = {}
    for node in graph.nodes:
        srcs = tuple(mapping.get(s, s) for s in node.srcs)
        op = new if node.op is old else node.op
        mapping[node] = node if (srcs, op) == (node.srcs, node.op) else KNode(op, srcs, node.arg)
    return ir.KernelGraph([mapping[o] for o in graph.outputs], graph.inputs, graph.output_names)


def _graph(fn, *shapes):
    return ir.from_jax(fn, *(S(s, jnp.float32) for s in shapes))


@pytest.mark.parametrize("old, new", [(TOp.GE, TOp.GT), (TOp.GT, TOp.GE), (TOp.LE, TOp.LT),
                                      (TOp.EQ, TOp.GE), (TOp.NE, TOp.GT)])
def test_finite_field_tells_comparisons_that_differ_only_on_ties(old, new):
    cmp = {TOp.GE: jnp.greater_equal, TOp.GT: jnp.greater, TOp.LE: jnp.less_equal,
           TOp.EQ: jnp.equal, TOp.NE: jnp.not_equal}[old]
    spec = _graph(lambda x, y: jnp.where(cmp(x, y), x, 2.0 * y), (4, 8), (4, 8))
    assert finite_field_test(spec, spec).passed
    assert not finite_field_test(spec, _replace_op(spec, old, new)).passed


def test_finite_field_rejects_a_dropped_inf_guard():
    spec = _graph(lambda x: jax.nn.logsumexp(x, axis=-1), (4, 8))
    (select,) = [n for n in spec.nodes if n.op is TOp.SELECT]
    unguarded = _substitute(spec, select, select.srcs[1])
    assert not finite_field_test(spec, unguarded).passed


def test_finite_field_rejects_a_blended_select_and_keeps_branch_algebra():
    spec = _graph(lambda x, y: jnp.where(x > y, 2.0 * x, 2.0 * y), (4, 8), (4, 8))
    x, y = spec.inputs
    mask = x.gt(y)
    blended = ir.KernelGraph([mask * (x * 2.0) + (1.0 - mask) * (y * 2.0)], spec.inputs)
    factored = ir.KernelGraph([mask.select(x, y) * 2.0], spec.inputs)
    assert not finite_field_test(spec, blended).passed
    assert finite_field_test(spec, factored).passed


def test_finite_field_identities_of_comparisons_hold():
    x, y = ir.input("x", (4, 8), "float32"), ir.input("y", (4, 8), "float32")
    pairs = [(x.lt(y), y.gt(x)), (x.ge(y), 1.0 - x.lt(y)), (x.ne(y), 1.0 - x.eq(y)),
             (x.log1p(), (x + 1.0).log()), (x.expm1(), x.exp() - 1.0),
             (x.softplus(), (x.exp() + 1.0).log()), (x.abs(), x.maximum(-x))]
    for a, b in pairs:
        assert finite_field_test(ir.KernelGraph([a]), ir.KernelGraph([b])).passed, a.op


def _substitute(graph, old, new):
    mapping = {old: new}
    for node in graph.nodes:
        if node not in mapping:
            srcs = tuple(mapping.get(s, s) for s in node.srcs)
            mapping[node] = node if srcs == node.srcs else node.replace(srcs=srcs)
    return ir.KernelGraph([mapping[o] for o in graph.outputs], graph.inputs, graph.output_names)
