"""The abstract-expression column of the op tables: every op has an entry, and lowering follows the tiling."""
from __future__ import annotations

import pytest

from mugraph import ir
from mugraph.ir import BOp, KOp, TOp
from mugraph.verify.abstract import block_expressions, expressions, node_expression
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.axioms import ENCODE
from mugraph.verify.abstract.expr import Expr, Fn, Op
from mugraph.verify.abstract.lower import (BLOCK_LOWER, KERNEL_LOWER, TOP_LOWER, check_tables,
                                           rms_norm)
from mugraph.verify.abstract.normalize import NORMALIZE, normalize
from tests.ir.samples import all_samples

LEAF_OPS = {Op.VAR, Op.CONST, Op.ACCESS}


@pytest.mark.parametrize("table,ops", [(TOP_LOWER, TOp), (KERNEL_LOWER, KOp), (BLOCK_LOWER, BOp)],
                         ids=["TOP_LOWER", "KERNEL_LOWER", "BLOCK_LOWER"])
def test_every_op_has_an_abstract_expression(table, ops):
    assert not [op for op in ops if op not in table]
    assert not check_tables()


def test_every_expression_op_normalises_and_encodes():
    assert set(NORMALIZE) == set(Op)
    assert set(ENCODE) | LEAF_OPS == set(Op)


@pytest.mark.parametrize("op,level,graph", all_samples(),
                         ids=[f"{level}-{op.name}" for op, level, _ in all_samples()])
def test_every_sample_graph_lowers(op, level, graph):
    exprs = expressions(graph)
    assert set(exprs) == set(graph.nodes)
    assert all(isinstance(e, Expr) for e in exprs.values())
    assert all(normalize(exprs[o]) is not None for o in graph.outputs)


def test_kernel_ops_lower_to_their_algebra():
    x, y = ir.input("X", (4, 8)), ir.input("Y", (8, 3))
    vx, vy = E.var("X", (4, 8)), E.var("Y", (8, 3))
    g = ir.KernelGraph([x @ y, x.sum(1), x.amax(0), x.T.reshape((1, 8, 4)), x.rms_norm(-1, 1e-5)])
    exprs = expressions(g)
    matmul, rsum, rmax, layout, rms = (exprs[o] for o in g.outputs)
    assert matmul is E.reduce_sum(8, vx * vy)
    assert rsum is E.reduce_sum(8, vx)
    assert rmax is E.reduce_max(4, vx)
    assert layout is vx
    assert rms is rms_norm(vx, 8, 1e-5)


def test_rms_norm_matches_the_form_jax_lifts():
    x = E.var("x", (2, 16))
    lifted = x * E.inv(E.sqrt(E.reduce_sum(16, x * x) / E.const(16.0) + E.const(1e-6)))
    assert rms_norm(x, 16, 1e-6) is lifted


def test_elementwise_ops_use_one_canonical_encoding():
    x, y = ir.input("X", (4,)), ir.input("Y", (4,))
    vx, vy = E.var("X", (4,)), E.var("Y", (4,))
    g = ir.KernelGraph([x - y, x / y, -x, x.square(), x.rsqrt(), x.relu(), x.silu(), x.clamp(-1, 2)])
    sub, div, neg, square, rsqrt, relu, silu, clamp = (expressions(g)[o] for o in g.outputs)
    assert sub is vx + E.const(-1) * vy
    assert div is vx * E.inv(vy)
    assert neg is E.const(-1) * vx
    assert square is vx * vx
    assert rsqrt is E.inv(E.sqrt(vx))
    assert relu is E.maximum(vx, E.const(0))
    assert silu is vx * E.fn(Fn.SIGMOID, vx)
    assert clamp is E.minimum(E.maximum(vx, E.const(-1)), E.const(2))


def test_inputs_of_equal_shape_get_distinct_variables():
    a, b = ir.input("A", (4, 4)), ir.input("B", (4, 4))
    exprs = expressions(ir.KernelGraph([a + b]))
    assert exprs[a] is not exprs[b]


def test_constants_keep_their_exact_value():
    assert E.const(0.1).param == 0.1 and E.const(0.1).param.denominator == 2 ** 55
    assert E.const(float("inf")).param == "inf"


def _fused_block(K=32, N=16, F=4):
    X, W = ir.input("X", (8, K)), ir.input("W", (K, N))
    b = ir.BlockBuilder(grid=(N // 8, 1, 1), forloop=F)
    x, w = b.input(X, imap=None, fmap=1), b.input(W, imap=(1,), fmap=0)
    return b, x, w, E.var("X", (8, K)), E.var("W", (K, N))


def test_block_accumulators_follow_the_real_tiling():
    b, x, w, vx, vw = _fused_block(K=32, N=8, F=4)  # one block; tiles: x [8, 8], w [8, 8]
    acc = {"sum": (x @ w).acc_sum(), "sum_last": x.acc_sum_last(), "rms": x.acc_rms_last(),
           "max": x.acc_max(), "max_last": x.acc_max_last()}
    graph = b.graph([(t, None) for t in acc.values()])
    exprs = block_expressions(graph, [vx, vw])
    assert exprs[acc["sum"]] is E.reduce_sum(4, E.reduce_sum(8, vx * vw))
    assert exprs[acc["sum_last"]] is E.reduce_sum(32, vx)
    assert exprs[acc["rms"]] is E.sqrt(E.reduce_sum(32, vx * vx) * E.inv(E.const(32)))
    assert exprs[acc["max"]] is E.reduce_max(4, vx)
    assert exprs[acc["max_last"]] is E.reduce_max(32, vx)
    assert normalize(exprs[acc["sum"]]) is normalize(E.reduce_sum(32, vx * vw))


def test_rescaling_accumulators_are_plain_sums_when_exact():
    b, x, w, vx, vw = _fused_block(K=32, F=4)
    m = x.acc_max_last()
    e = (x - m).exp()
    o = (e @ w).acc_sum_rescale(m)
    exprs = block_expressions(b.graph([(o, (1,))]), [vx, vw])
    m_final = E.reduce_max(32, vx)
    assert exprs[m] is m_final                      # the running value reads as the final max
    assert exprs[o] is E.reduce_sum(4, E.reduce_sum(8, E.exp(vx - m_final) * vw))


def test_rescale_without_the_exp_factor_is_opaque():
    b, x, w, vx, vw = _fused_block(K=32, F=4)
    m = x.acc_max_last()
    wrong = (x @ w).acc_sum_rescale(m)               # no exp(-m): sum_i x_i exp(m_i - M) != sum_i x_i
    plain = (w - m).acc_sum()                        # a running max read by a non-rescaling sum
    exprs = block_expressions(b.graph([(wrong, (1,)), (plain, (1,))]), [vx, vw])
    assert exprs[wrong].op is Op.FN and exprs[wrong].param[0] is Fn.RESCALED_SUM
    assert exprs[plain].op is Op.FN and exprs[plain].param[0] is Fn.RESCALED_SUM


def test_nodes_lower_one_at_a_time_like_whole_graphs():
    b, x, w, vx, vw = _fused_block(K=32, F=4)
    xw = x @ w
    acc = xw.acc_sum()
    scaled = acc * 0.5
    graph = b.graph([(scaled, (1,))])
    whole = block_expressions(graph, [vx, vw])
    ex = node_expression(x, [vx])
    ew = node_expression(w, [vw])
    exw = node_expression(xw, [ex, ew])
    eacc = node_expression(acc, [exw])              # forloop read from the input tiles
    half = node_expression(scaled.srcs[1], [])
    assert node_expression(scaled, [eacc, half]) is whole[scaled]
    partial = block_expressions([acc], [vx, vw])    # a partial block graph: its roots so far
    assert partial[acc] is whole[acc]


def test_custom_ops_lower_through_their_block_graph():
    b, x, w, vx, vw = _fused_block(K=32, F=4)
    (out,) = b.finish([((x @ w).acc_sum(), (1,))])
    assert expressions(ir.KernelGraph([out]))[out] is E.reduce_sum(4, E.reduce_sum(8, vx * vw))
