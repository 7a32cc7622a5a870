"""The search fuses programs built from predicates and selects like any other: a leaky-relu epilogue
into its matmul's kernel, and a causal mask (iota leaves, a comparison, a select with -inf) into one
softmax kernel; each winner verified and run on the CPU harness equal to jax.jit(fn)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mugraph import ir
from mugraph.codegen import run_on_cpu
from mugraph.ir import BOp, KOp, TOp
from mugraph.ir.thread import ops_of
from mugraph.search import SearchConfig, search

QUIET = dict(progress=lambda *a: None)


def _block_ops(graph) -> set:
    """Every op of the custom kernels, thread graphs (register epilogues) included."""
    found = set()
    for bg, _ in graph.custom_ops():
        for n in bg.nodes:
            found |= {t.op for t in ops_of(n.arg)} if n.op is BOp.THREAD else {n.op}
    return found


def _fused(result) -> None:
    """One custom kernel, reading only the inputs (and index leaves), verified at the real shapes."""
    best = result.best
    assert len(best.custom_ops()) == 1
    assert {n.op for n in best.nodes} <= {KOp.INPUT, KOp.IOTA, KOp.CUSTOM}
    assert result.report.verification.equivalent
    assert result.best_candidate.seconds < result.report.spec_estimate.seconds


def test_leaky_relu_epilogue_fuses_into_the_matmul():
    fn = lambda x, w: jnp.where(x @ w > 0, x @ w, 0.01 * (x @ w))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float16)
    w = (rng.standard_normal((256, 128)) / 16).astype(np.float16)
    spec = ir.from_jax(fn, x, w)
    result = search(spec, SearchConfig(max_kernel_ops=1, budget_seconds=60), **QUIET)
    _fused(result)
    assert {TOp.LEAKY_RELU, BOp.MATMUL} <= _block_ops(result.best)
    (got,) = run_on_cpu(result.best, [x, w])
    want = np.asarray(jax.jit(fn)(x, w), np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_causal_masked_softmax_fuses_into_one_kernel():
    rows, cols = 64, 64

    def fn(s):
        mask = jnp.arange(rows)[:, None] >= jnp.arange(cols)[None, :]
        return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)

    s = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    spec = ir.from_jax(fn, s)
    result = search(spec, SearchConfig(max_kernel_ops=1, max_block_ops=8, budget_seconds=90),
                    **QUIET)
    _fused(result)
    assert {TOp.GE, TOp.SELECT} <= _block_ops(result.best)
    assert [n.op for n in result.best.nodes].count(KOp.IOTA) == 2
    (got,) = run_on_cpu(result.best, [s])
    want = np.asarray(jax.jit(fn)(s))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[np.triu_indices(rows, 1)] == 0).all()
