"""Simplification of found μGraphs: shared values modulo algebra, sums factored out of products,
constants recognised; every rewrite is re-verified, and the runner keeps only verified ones."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mugraph import ir
from mugraph.ir.ops import BOp, TOp
from mugraph.search import SearchConfig, search
from mugraph.search.result import Candidate
from mugraph.search.runner import _rank_key
from mugraph.search.simplify import op_count, simplify
from mugraph.verify import check

QUIET = dict(progress=lambda *a: None)
ROWS = jax.ShapeDtypeStruct((8, 64), jnp.float32)


def softmax(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _block_ops(graph) -> list:
    """Every block op, the ops inside thread graphs included."""
    from mugraph.ir.thread import ops_of
    return [t.op for bg, _ in graph.custom_ops() for n in bg.nodes
            for t in (ops_of(n.arg) if n.op is BOp.THREAD else [n])]


def _row_kernel(X, body, extra=()):
    """One block per two rows, whole rows in the tile, no loop: `body(tiles...)` is written."""
    b = ir.BlockBuilder(grid=(X.shape[0] // 2, 1, 1), forloop=1)
    tiles = [b.input(t, imap=(0,), fmap=None) for t in (X, *extra)]
    return ir.KernelGraph(b.finish([(body(*tiles).acc_sum(), (0,))]), [X, *extra])


def _redundant_softmax(x):
    m = x.amax(1)
    e = (x - (x - (x - m))).exp()          # x - (x - (x - m)) is x - m
    return e / e.sum(1)


def test_the_redundant_softmax_shift_becomes_one_subtraction_and_keeps_masked_rows():
    spec = ir.from_jax(softmax, ROWS)
    redundant = _row_kernel(spec.inputs[0], _redundant_softmax)
    simpler, fired = simplify(redundant)
    assert "share-equal-values" in fired
    assert _block_ops(simpler).count(TOp.SUB) == 1 and _block_ops(redundant).count(TOp.SUB) == 3
    assert op_count(simpler) == op_count(redundant) - 2
    # a row masked with -inf: the spec (and the simplified kernel) keep it finite where the
    # redundant form computes -inf - (-inf) = NaN
    x = np.random.default_rng(0).standard_normal((8, 64))
    x[3, 5:] = -np.inf
    want = ir.interpret(spec, [x])[0]
    np.testing.assert_allclose(ir.interpret(simpler, [x])[0], want, rtol=1e-12)
    assert np.isnan(ir.interpret(redundant, [x])[0][3]).any()
    assert check(spec, simpler, seed=0).equivalent


def test_redundancy_inside_a_thread_graph_is_removed_too():
    from mugraph.ir.thread import fuse_threads
    spec = ir.from_jax(softmax, ROWS)
    redundant = _row_kernel(spec.inputs[0], _redundant_softmax)
    (bg, srcs), = redundant.custom_ops()
    threaded = ir.KernelGraph([ir.KNode(ir.KOp.CUSTOM, srcs, (fuse_threads(bg), 0))], spec.inputs)
    assert any(n.op is BOp.THREAD for n in threaded.custom_ops()[0][0].nodes)
    simpler, fired = simplify(threaded)
    assert "share-equal-values" in fired and _block_ops(simpler).count(TOp.SUB) == 1
    assert check(spec, simpler, seed=0).equivalent


def test_a_sum_of_a_scaled_product_sums_first_and_the_check_decides():
    """sum(x * s) -> sum(x) * s is proposed (the product runs on the row sums), agrees on
    finite inputs, and is rejected as IEEE-inequivalent: with s = inf and some x = 0 the spec
    makes NaN where the factored form makes inf. Only what the check accepts is kept."""
    def scaled_sum(x, s):
        return jnp.sum(x * s, axis=1, keepdims=True)
    spec = ir.from_jax(scaled_sum, ROWS, jax.ShapeDtypeStruct((8, 1), jnp.float32))
    X, S = spec.inputs
    fused = _row_kernel(X, lambda x, s: (x * s).sum(1), extra=(S,))
    simpler, fired = simplify(fused)
    assert fired == ["factor-out-of-sum"]
    mul = next(n for bg, _ in simpler.custom_ops() for n in bg.nodes if n.op is TOp.MUL)
    assert mul.shape == (2, 1) and any(s.op is BOp.REDUCE_SUM for s in mul.srcs)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((8, 64)), rng.standard_normal((8, 1))]
    np.testing.assert_allclose(ir.interpret(simpler, arrays)[0], ir.interpret(spec, arrays)[0],
                               rtol=1e-12)
    verdict = check(spec, simpler, seed=0)
    assert not verdict.equivalent and "nan" in verdict.reason.lower()


def test_a_norm_scale_moves_after_the_matmul():
    """(x * rsqrt(mean(x^2) + eps)) @ w -> (x @ w) * rsqrt(...): the scale runs on the output
    tile; special values agree (an inf in x makes the whole row NaN either way)."""
    def f(x, w):
        return (x * jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + 1e-6)) @ w
    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((16, 128), (128, 128))]
    spec = ir.from_jax(f, *shapes)
    X, W = spec.inputs
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    x, w = b.input(X, imap=None, fmap=None), b.input(W, imap=(1,), fmap=None)
    r = ((x * x).sum(1) / 128.0 + float(np.float32(1e-6))).rsqrt()
    fused = ir.KernelGraph(b.finish([((x * r @ w).acc_sum(), (1,))]), [X, W])
    assert check(spec, fused, seed=0).equivalent
    simpler, fired = simplify(fused)
    assert "factor-out-of-sum" in fired
    matmul = next(n for bg, _ in simpler.custom_ops() for n in bg.nodes if n.op is BOp.MATMUL)
    assert matmul.srcs[0].op is BOp.INPUT            # x itself, no longer x * r
    assert check(spec, simpler, seed=0).equivalent


def test_a_constant_output_is_proposed_and_the_check_decides():
    """x - x is 0 for finite x but NaN for inf: the simplifier proposes the constant, and the
    IEEE-aware check rejects it, which is why the runner re-verifies every rewrite."""
    spec = ir.from_jax(lambda x: x - x, ROWS)
    simpler, fired = simplify(spec)
    assert fired == ["constant-output"]
    assert simpler.outputs[0].op is ir.KOp.CONSTANT and simpler.outputs[0].arg[0] == 0.0
    assert not check(spec, simpler, seed=0).equivalent


def test_a_graph_with_nothing_to_simplify_is_returned_as_it_is():
    spec = ir.from_jax(softmax, ROWS)
    plain = _row_kernel(spec.inputs[0], lambda x: (x - x.amax(1)).exp())
    assert simplify(plain) == (plain, [])


def test_at_equal_estimate_fewer_ops_win():
    spec = ir.from_jax(softmax, ROWS)
    redundant = _row_kernel(spec.inputs[0], _redundant_softmax)
    simpler, _ = simplify(redundant)
    from mugraph.search.cost import estimate
    est = estimate(redundant, "h100")
    ranked = sorted([Candidate(redundant, est, "", "search"), Candidate(simpler, est, "", "search")],
                    key=_rank_key)
    assert ranked[0].graph is simpler


def test_the_softmax_winner_has_no_redundant_subtraction():
    spec = ir.from_jax(softmax, ROWS)
    result = search(spec, SearchConfig(max_kernel_ops=1, max_block_ops=7, budget_seconds=60),
                    **QUIET)
    assert result.best.custom_ops(), result.best_candidate.structure
    subs = _block_ops(result.best).count(TOp.SUB)
    assert subs == 1, result.best
    assert result.report.verification.equivalent
