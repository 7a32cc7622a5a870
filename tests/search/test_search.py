"""The search runner: config, results, executors, errors, and the pieces it is built from."""
from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.errors import SearchError
from mugraph.search import SearchConfig, search
from mugraph.search import final_check
from mugraph.search.executors import InProcess, ProcessPool
from mugraph.verify import check
from mugraph.search.labels import analyze
from mugraph.search.rules import canonicalize

QUIET = dict(progress=lambda *a: None)
# one kernel of at most six block ops: rmsnorm_linear's space at this size is exhausted in ~2 s
SMALL_SPACE = SearchConfig(max_kernel_ops=1, max_block_ops=6)


def small_rmsnorm_spec():
    return workloads.get("rmsnorm_linear").small().spec()


def test_config_is_frozen_and_round_trips_through_json():
    config = SearchConfig(budget_seconds=12.5, block_ops=("matmul", "acc_sum"), seed=3)
    again = SearchConfig.from_json(config.to_json())
    assert again == config
    assert json.loads(config.to_json())["block_ops"] == ["acc_sum", "matmul"]   # a set, sorted
    with pytest.raises(AttributeError):
        config.seed = 4


@pytest.mark.parametrize("bad, needle", [
    (dict(target="v100"), "unknown target 'v100'"),
    (dict(block_ops=("conv",)), "unknown block op 'conv'"),
    (dict(max_block_ops=-1), "max_block_ops=-1"),
    (dict(budget_seconds=0), "budget_seconds=0 must be a positive"),
    (dict(budget_seconds=float("inf")), "budget_seconds=inf"),
    (dict(workers=0), "workers=0 must be a whole number >= 1"),
    (dict(max_kernel_ops=1.5), "max_kernel_ops=1.5"),
    (dict(budget_states=True), "budget_states=True"),
])
def test_bad_config_is_a_typed_error(bad, needle):
    with pytest.raises(SearchError, match=needle):
        SearchConfig(**bad)


def test_config_json_rejects_unknown_fields():
    with pytest.raises(SearchError, match="unknown SearchConfig fields"):
        SearchConfig.from_json('{"budget": 3}')


def test_search_rejects_a_function_and_a_bad_config_before_any_work():
    with pytest.raises(SearchError, match="takes a KernelGraph"):
        search(lambda x: x, SearchConfig())
    with pytest.raises(SearchError, match="takes a SearchConfig"):
        search(small_rmsnorm_spec(), {"budget_seconds": 3})


def test_canonicalize_lifts_rms_norm_and_keeps_the_meaning():
    spec = small_rmsnorm_spec()
    canonical, fired = canonicalize(spec)
    assert fired == ["lift-rms-norm"]
    assert any(n.op is ir.KOp.RMS_NORM for n in canonical.nodes)
    arrays = workloads.get("rmsnorm_linear").small().random_inputs(0)
    np.testing.assert_allclose(ir.interpret(canonical, arrays)[0], ir.interpret(spec, arrays)[0],
                               rtol=1e-12, atol=1e-12)


def test_labels_tie_contracted_dims_and_mark_reductions():
    spec = workloads.get("gqa").small().spec()
    a = analyze(spec)
    q, k, v = spec.inputs
    assert a.of(q)[2] == a.of(k)[1]            # Q @ K contracts the head dim
    assert a.of(k)[2] == a.of(v)[1]            # P @ V contracts the keys
    assert a.is_reduction(a.of(k)[2].outer)    # keys are summed away
    assert not a.is_reduction(a.of(q)[1].outer)  # query rows reach the output


def test_search_finds_the_fused_rmsnorm_kernel_and_verifies_it():
    spec = small_rmsnorm_spec()
    result = search(spec, SMALL_SPACE, **QUIET)
    best = result.best
    assert len(best.custom_ops()) == 1 and all(
        n.op in (ir.KOp.INPUT, ir.KOp.CUSTOM) for n in best.nodes)
    # (the K loop with accumulators needs eight block ops: test_quality covers it)
    assert result.report.stop_reason == "exhausted"
    assert result.report.verification.equivalent
    assert result.best_candidate.seconds < result.report.spec_estimate.seconds
    arrays = workloads.get("rmsnorm_linear").small().random_inputs(1)
    got, want = ir.interpret(best, arrays)[0], ir.interpret(spec, arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_report_counts_and_summary():
    result = search(small_rmsnorm_spec(), SMALL_SPACE, **QUIET)
    rep = result.report
    assert rep.states > 0 and rep.verified > 0 and sum(rep.pruned.values()) > 0
    text = result.summary()
    for needle in ("stop reason: exhausted", "states visited", "pruned:", "winner:",
                   "roofline bound", "estimated speedup", "against the XLA-like baseline",
                   "against the unfused program", "EQUIVALENT"):
        assert needle in text
    assert [c.seconds for c in result.candidates] == sorted(c.seconds for c in result.candidates)


def test_state_budget_stops_with_reason_states():
    result = search(small_rmsnorm_spec(), SearchConfig(budget_states=50), **QUIET)
    assert result.report.stop_reason == "states"
    assert result.report.verification.equivalent      # falls back to a verified candidate


def test_a_small_space_is_exhausted_and_one_state_fewer_is_not():
    spec = small_rmsnorm_spec()
    full = search(spec, SMALL_SPACE, **QUIET)
    assert full.report.stop_reason == "exhausted"
    # the abstract-expression test (not complete) cut subtrees: "exhausted" is what it admits
    assert full.report.pruned["expression"] > 0
    assert "visiting what the pruning rules admit" in full.summary()
    assert "the whole space at the config's limits was visited" not in full.summary()
    cut = search(spec, SMALL_SPACE.replace(budget_states=full.report.states - 1), **QUIET)
    assert cut.report.stop_reason == "states"
    assert "not exhausted" in cut.summary()


def test_the_candidate_cap_is_its_own_stop_reason():
    result = search(small_rmsnorm_spec(), SMALL_SPACE.replace(max_candidates=2), **QUIET)
    rep = result.report
    assert rep.stop_reason == "candidate cap"
    assert rep.verified == 2
    assert "max_candidates" in result.summary() and "not exhausted" in result.summary()


def test_time_budget_bounds_the_whole_call():
    # the full rmsnorm_linear space does not finish in 3 s; the enumeration stops early enough
    # that ranking and the check at the real shapes fit in the budget too
    spec = workloads.get("rmsnorm_linear").small().spec()
    result = search(spec, SearchConfig(budget_seconds=3.0), **QUIET)
    rep = result.report
    assert rep.stop_reason == "time"
    assert rep.search_seconds < 3.0
    assert rep.search_seconds <= rep.wall_seconds < 3.0 + 2.0
    assert f"after {rep.search_seconds:.1f} s of search" in result.summary()


BIG = [jax.ShapeDtypeStruct((8192, 8192), jnp.float16)] * 2


def test_a_large_program_stays_within_the_budget():
    spec = ir.from_jax(lambda x, w: jnp.exp(x @ w), *BIG)
    started = time.monotonic()
    result = search(spec, SearchConfig(budget_seconds=8.0), **QUIET)
    assert time.monotonic() - started < 8.0 + 6.0      # was 400 s and 7.9 GB before the bound
    assert result.report.verification.equivalent


def _fused_exp_matmul(X, W, epilogue):
    b = ir.BlockBuilder(grid=(X.shape[0] // 64, W.shape[1] // 64, 1), forloop=X.shape[1] // 64)
    x = b.input(X, imap=(0, None), fmap=1)
    w = b.input(W, imap=(None, 1), fmap=0)
    return ir.KernelGraph(b.finish([(epilogue((x @ w).acc_sum()), (0, 1))]), [X, W])


def test_the_final_check_samples_whole_tiles_of_a_large_winner():
    """8192^3: the whole output costs 5.5e11 multiply-adds to check; the plan cuts the
    parallel dims to leading blocks of whole tiles, then (one 64x64 tile with all of K still
    costing too much) the K loop to fewer trips, and the check still tells a right kernel from
    a wrong one."""
    spec = ir.from_jax(lambda x, w: jnp.exp(x @ w), *BIG)
    right = _fused_exp_matmul(*spec.inputs, lambda v: v.exp())
    plan = final_check.plan(spec, right)
    assert plan.sampled and "of [8192,8192]" in plan.sampled
    (real, _), (cut, _) = right.custom_ops()[0], plan.candidate.custom_ops()[0]
    assert final_check.work(plan.spec) + final_check.work(plan.candidate) <= final_check.WORK_CAP
    assert cut.num_blocks == 1 and cut.forloop < real.forloop
    assert "the loops running fewer trips: x.1" in plan.sampled
    assert [n.shape for n in cut.nodes] == [n.shape for n in real.nodes]   # same tiles
    assert check(plan.spec, plan.candidate, seed=0).equivalent
    wrong = final_check.plan(spec, _fused_exp_matmul(*spec.inputs, lambda v: v.sigmoid()))
    assert not check(wrong.spec, wrong.candidate, seed=0).equivalent


def test_in_process_and_process_pool_give_the_same_result():
    spec = small_rmsnorm_spec()
    config = SMALL_SPACE
    a = search(spec, config, executor=InProcess(), **QUIET)
    pool = ProcessPool(2)
    try:
        b = search(spec, config, executor=pool, **QUIET)
    finally:
        pool.close()
    assert a.best is b.best
    assert [c.graph for c in a.candidates] == [c.graph for c in b.candidates]
    assert a.report.states == b.report.states


def test_the_bench_rows_name_the_baselines_and_the_stop():
    from mugraph.search.bench import format_row, run_cases
    lines = []
    rows = run_cases([("rmsnorm_linear small", small_rmsnorm_spec())], SMALL_SPACE,
                     out=lines.append)
    (row,) = rows
    assert row["fused"] and row["stop"] == "exhausted" and row["equivalent"]
    assert row["vs_xla"] == pytest.approx(row["xla_us"] / row["winner_us"])
    assert row["winner_s"] is not None and row["winner_s"] <= row["stop_s"] <= row["call_s"]
    assert format_row(row) in lines and "xla-like us" in lines[1]
    assert lines[-1].startswith("1 cases: ")


def test_nothing_below_mugraph_imports_the_suites():
    """DESIGN.md: the workload and generality suites are driven from mugraph/, never imported
    by search/, verify/, codegen/ or ir/."""
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("search", "verify", "ir"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [f"{node.module}.{a.name}" for a in node.names] \
                    if isinstance(node, ast.ImportFrom) and node.module else []
                if any(n.startswith(("mugraph.workloads", "mugraph.generality")) for n in names):
                    offenders.append(str(path.relative_to(root)))
    assert offenders == []
