"""Formal checks and pruning questions on hand-built graphs: RMSNorm+matmul, online softmax attention."""
from __future__ import annotations

import time

import pytest

from mugraph import ir
from mugraph.ir import BOp
from mugraph.verify.abstract import (STATS, ProofResult, clear_caches, expressions,
                                     is_subexpression, prove_equivalent)
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.query import output_expressions

M, K, N, TILE, EPS = 16, 256, 128, 64, 1e-6


# ---- RMSNorm + matmul ----------------------------------------------------------------------------------
def _xw():
    return ir.input("X", (M, K)), ir.input("W", (K, N))


def rmsnorm_spec() -> ir.KernelGraph:
    X, W = _xw()
    return ir.KernelGraph([(X * ((X * X).sum(-1) / float(K) + EPS).rsqrt()) @ W])


def rmsnorm_fused(mutate=None) -> ir.KernelGraph:
    """IR_API.md's fused kernel: X read once serves the norm and the GEMM."""
    X, W = _xw()
    b = ir.BlockBuilder(grid=(N // TILE, 1, 1), forloop=K // TILE)
    x, w = b.input(X, imap=None, fmap=1), b.input(W, imap=(1,), fmap=0)
    ss = (x * x).acc_sum_last()
    out = (x @ w).acc_sum() * ((ss / float(K)) + EPS).rsqrt()
    if mutate == "sqrt":
        out = (x @ w).acc_sum() * ((ss / float(K)) + EPS).sqrt()
    if mutate == "mean":
        out = (x @ w).acc_sum() * ((ss / float(TILE)) + EPS).rsqrt()
    return ir.KernelGraph(b.finish([(out, (1,))]), [X, W])


def test_rmsnorm_matmul_fused_is_proved():
    result = prove_equivalent(rmsnorm_spec(), rmsnorm_fused())
    assert isinstance(result, ProofResult)
    assert result.proved and result.method == "normaliser" and result.outputs == (True,)


def test_rms_norm_op_spec_proves_the_same_kernel():
    X, W = _xw()
    assert prove_equivalent(ir.KernelGraph([X.rms_norm(-1, EPS) @ W]), rmsnorm_fused()).proved


@pytest.mark.parametrize("mutate", ["sqrt", "mean"])
def test_wrong_rmsnorm_kernels_are_not_proved(mutate):
    result = prove_equivalent(rmsnorm_spec(), rmsnorm_fused(mutate))
    assert not result.proved and result.outputs == (False,)


def _rms_queries():
    x, w = E.var("X", (M, K)), E.var("W", (K, N))
    mean = E.reduce_sum(K, x * x) / E.const(K)
    yes = {"sum(K, x*w)": E.reduce_sum(K, x * w), "one tile's x@w": E.reduce_sum(TILE, x * w),
           "rms partial sum(K, x*x)": E.reduce_sum(K, x * x), "mean": mean,
           "rsqrt(mean + eps)": E.inv(E.sqrt(mean + E.const(EPS))), "x": x}
    no = {"exp(x)": E.exp(x), "sum(K, x*x*w)": E.reduce_sum(K, x * x * w), "x + w": x + w,
          "sum(3, x*w)": E.reduce_sum(3, x * w), "sqrt(mean)": E.sqrt(mean)}
    return yes, no


def test_rmsnorm_subexpressions():
    spec = output_expressions(rmsnorm_spec())
    yes, no = _rms_queries()
    assert [k for k, e in yes.items() if not is_subexpression(e, spec)] == []
    assert [k for k, e in no.items() if is_subexpression(e, spec)] == []


def _every_intermediate(graph: ir.KernelGraph) -> dict:
    """Every kernel tensor and every block tile of `graph`, as expressions (what the search builds)."""
    from mugraph.verify.abstract import block_expressions
    exprs = expressions(graph)
    found = dict(exprs)
    for bg, srcs in graph.custom_ops():
        found.update(block_expressions(bg, [exprs[s] for s in srcs]))
    return found


def _outside(spec: ir.KernelGraph, candidate: ir.KernelGraph) -> list:
    outputs = output_expressions(spec)
    return [n for n, e in _every_intermediate(candidate).items()
            if not is_subexpression(e, outputs)]


def test_every_tile_of_the_fused_rmsnorm_passes_pruning():
    assert _outside(rmsnorm_spec(), rmsnorm_fused()) == []


def test_negative_answers_are_cheap():
    spec = output_expressions(rmsnorm_spec())
    x, w = E.var("X", (M, K)), E.var("W", (K, N))
    is_subexpression(x, spec)  # builds the spec's index once
    probes = [E.reduce_sum(K, x * x * w * E.const(c)) for c in range(2, 52)]
    start = time.perf_counter()
    assert not any(is_subexpression(p, spec) for p in probes)
    assert (time.perf_counter() - start) / len(probes) < 5e-3   # measured ~0.1 ms


def test_answers_are_memoised():
    clear_caches()
    spec = output_expressions(rmsnorm_spec())
    e = E.reduce_sum(K, E.var("X", (M, K)) * E.var("W", (K, N)))
    assert is_subexpression(e, spec)
    assert STATS["queries"] == 1 and STATS["memo_hits"] == 0
    assert is_subexpression(e, spec)
    assert STATS["queries"] == 1 and STATS["memo_hits"] == 1


def test_z3_fallback_answers_what_the_normaliser_misses():
    x, z = E.var("x", (4,)), E.var("z", (4,))
    spec = [z * E.neg(E.neg(x))]          # the normaliser folds -1*-1; Z3 sees z*(-1) inside
    assert not is_subexpression(E.neg(z), spec)
    assert is_subexpression(E.neg(z), spec, z3_fallback=True, rlimit=400_000)
    assert STATS["z3_yes"] >= 1


def test_proofs_report_mismatched_outputs():
    X, W = _xw()
    result = prove_equivalent(rmsnorm_spec(), ir.KernelGraph([X @ W, X]))
    assert not result.proved and "outputs" in result.detail
    result = prove_equivalent(ir.KernelGraph([X]), ir.KernelGraph([X.T]))
    assert not result.proved and "shape" in result.detail


# ---- attention with online softmax -------------------------------------------------------------------
SQ, D, SK, BQ, BK = 32, 16, 64, 16, 16


def _qkv():
    return ir.input("Q", (SQ, D)), ir.input("K", (D, SK)), ir.input("V", (SK, D))


def softmax_spec() -> ir.KernelGraph:
    """softmax(Q@K - max) @ V, as a program would write it."""
    Q, Kt, V = _qkv()
    s = Q @ Kt
    e = (s - s.amax(-1)).exp()
    return ir.KernelGraph([(e / e.sum(-1)) @ V])


def online_softmax(mutate=None) -> ir.KernelGraph:
    """One kernel: a block per BQ query rows, the loop walks BK keys with a running max."""
    Q, Kt, V = _qkv()
    b = ir.BlockBuilder(grid=(SQ // BQ, 1, 1), forloop=SK // BK)
    q = b.input(Q, imap=(0,), fmap=None)
    k, v = b.input(Kt, imap=None, fmap=1), b.input(V, imap=None, fmap=0)
    s = q @ k
    m = s.acc_max_last()
    e = (s - m) if mutate == "no exp" else (s - m).exp()
    o = (e @ v).acc_sum() if mutate == "no rescale" else (e @ v).acc_sum_rescale(m)
    l = e.acc_sum_last_rescale(m)
    out = l / o if mutate == "swapped div" else o / l
    return ir.KernelGraph(b.finish([(out, (0,))]), [Q, Kt, V])


def test_online_softmax_is_proved():
    graph = online_softmax()
    ops = {n.op for bg, _ in graph.custom_ops() for n in bg.nodes}
    assert {BOp.ACC_MAX_LAST, BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE} <= ops
    result = prove_equivalent(softmax_spec(), graph)
    assert result.proved and result.method == "normaliser"


@pytest.mark.parametrize("mutate", ["swapped div", "no exp", "no rescale"])
def test_wrong_attention_kernels_are_not_proved(mutate):
    result = prove_equivalent(softmax_spec(), online_softmax(mutate))
    assert not result.proved and result.outputs == (False,)


def test_every_tile_of_online_softmax_passes_pruning():
    assert _outside(softmax_spec(), online_softmax()) == []


def test_attention_subexpressions():
    spec = output_expressions(softmax_spec())
    q, k, v = E.var("Q", (SQ, D)), E.var("K", (D, SK)), E.var("V", (SK, D))
    s = E.reduce_sum(D, q * k)
    m = E.reduce_max(SK, s)
    assert is_subexpression(E.exp(s), spec)                   # exp splits: exp(s - m) = exp(s)/exp(m)
    assert is_subexpression(E.reduce_max(BK, s), spec)        # one tile's max: maxr(BK) splits maxr(SK)
    assert is_subexpression(E.reduce_sum(BK, E.exp(s - m) * v), spec)
    assert not is_subexpression(E.exp(q * v), spec)
    assert not is_subexpression(E.reduce_sum(SK, s * v), spec)


def test_a_partial_max_passes_pruning_only_by_the_split_max_relaxation():
    """Split-KV: exp(s - m_split) is no part of exp(s - m), but the combine kernel cancels it."""
    spec = output_expressions(softmax_spec())
    q, k = E.var("Q", (SQ, D)), E.var("K", (D, SK))
    s = E.reduce_sum(D, q * k)
    partial = E.exp(s - E.reduce_max(SK // 2, s))
    assert not is_subexpression(partial, spec, split_max=False)
    assert is_subexpression(partial, spec)
    assert not is_subexpression(E.exp(s + E.reduce_max(SK // 2, s)), spec)


# ---- the workload suite -----------------------------------------------------------------------------
def _workloads():
    try:
        from mugraph import workloads
    except ImportError:
        return []
    return workloads.names()


@pytest.mark.parametrize("name", _workloads())
def test_workload_references_are_proved_and_pass_pruning(name):
    from mugraph import workloads
    w = workloads.get(name).small()
    spec, reference = w.spec(), w.reference()
    result = prove_equivalent(spec, reference)
    assert result.proved, result.detail
    assert _outside(spec, reference) == []


# ---- the index-aware check's edges ---------------------------------------------------------------------
def test_z3_judges_forms_the_normaliser_leaves_apart_within_its_rlimit():
    x, y = ir.input("X", (4, 4)), ir.input("Y", (4, 4))
    spec = ir.KernelGraph([x * y / y], [x, y])
    candidate = ir.KernelGraph([x * (y + 1.0) / (y + 1.0)], [x, y])   # no law cancels a quotient
    result = prove_equivalent(spec, candidate, rlimit=20_000)
    assert not result.proved and result.method == "z3" and "rlimit 20000" in result.detail


@pytest.fixture
def fresh_memo():
    """Element expressions are memoised across checks: a test that patches a table starts and
    ends with an empty memo."""
    clear_caches()
    yield
    clear_caches()


def test_an_op_without_index_meaning_is_not_proved(monkeypatch, fresh_memo):
    from mugraph.verify.abstract import elements
    monkeypatch.delitem(elements.KERNEL_ELEMENT, ir.KOp.TRANSPOSE)
    x = ir.input("X", (4, 4))
    result = prove_equivalent(ir.KernelGraph([x.T.T]), ir.KernelGraph([x.T.T]))
    assert not result.proved and "transpose has no index-level meaning" in result.detail


def test_an_elementwise_op_without_an_entry_is_an_uninterpreted_function(monkeypatch, fresh_memo):
    from mugraph.verify.abstract import elements
    monkeypatch.setattr(elements, "TOP_LOWER", {k: v for k, v in elements.TOP_LOWER.items()
                                                 if k is not ir.TOp.EXP})
    x, y = ir.input("X", (4, 4)), ir.input("Y", (4, 4))
    assert prove_equivalent(ir.KernelGraph([(x + y).exp()], [x, y]),
                            ir.KernelGraph([(y + x).exp()], [x, y])).proved
    assert not prove_equivalent(ir.KernelGraph([(x + y).exp()], [x, y]),
                                ir.KernelGraph([x.exp() * y.exp()], [x, y])).proved


def test_inputs_of_one_name_and_two_shapes_are_not_compared():
    a, b = ir.input("X", (4, 8)), ir.input("X", (8, 4))
    result = prove_equivalent(ir.KernelGraph([a.sum(1)]), ir.KernelGraph([b.sum(0).T]))
    assert not result.proved and "input 'X'" in result.detail


@pytest.mark.parametrize("kwargs,match", [({"rlimit": 0}, "rlimit=0"), ({"rlimit": 1.5}, "rlimit=1.5"),
                                          ({"seconds": -1}, "seconds=-1")])
def test_bad_arguments_are_typed_errors(kwargs, match):
    from mugraph.errors import InvalidInput
    graph = rmsnorm_spec()
    with pytest.raises(InvalidInput, match=match):
        prove_equivalent(graph, graph, **kwargs)
    with pytest.raises(InvalidInput, match="candidate is a str"):
        prove_equivalent(graph, "graph.json")
