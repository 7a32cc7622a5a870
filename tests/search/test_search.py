"""The search runner: config, results, executors, errors, and the pieces it is built from."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.errors import SearchError
from mugraph.search import SearchConfig, search
from mugraph.search.executors import InProcess, ProcessPool
from mugraph.search.labels import analyze
from mugraph.search.rules import canonicalize

QUIET = dict(progress=lambda *a: None)


def small_rmsnorm_spec():
    return workloads.get("rmsnorm_linear").small().spec()


def test_config_is_frozen_and_round_trips_through_json():
    config = SearchConfig(budget_seconds=12.5, block_ops=("matmul", "acc_sum"), seed=3)
    again = SearchConfig.from_json(config.to_json())
    assert again == config
    assert json.loads(config.to_json())["block_ops"] == ["matmul", "acc_sum"]
    with pytest.raises(AttributeError):
        config.seed = 4


@pytest.mark.parametrize("bad, needle", [
    (dict(target="v100"), "unknown target 'v100'"),
    (dict(block_ops=("conv",)), "unknown block op 'conv'"),
    (dict(max_block_ops=-1), "max_block_ops=-1"),
])
def test_bad_config_is_a_typed_error(bad, needle):
    with pytest.raises(SearchError, match=needle):
        SearchConfig(**bad)


def test_config_json_rejects_unknown_fields():
    with pytest.raises(SearchError, match="unknown SearchConfig fields"):
        SearchConfig.from_json('{"budget": 3}')


def test_search_rejects_a_function():
    with pytest.raises(SearchError, match="takes a KernelGraph"):
        search(lambda x: x, SearchConfig())


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
    result = search(spec, SearchConfig(max_kernel_ops=1, budget_seconds=120), **QUIET)
    best = result.best
    assert len(best.custom_ops()) == 1 and all(
        n.op in (ir.KOp.INPUT, ir.KOp.CUSTOM) for n in best.nodes)
    looped = [c for c in result.candidates if c.origin == "search"
              and any(bg.forloop > 1 for bg, _ in c.graph.custom_ops())]
    assert looped                        # the K loop with accumulators is among the verified
    assert result.report.stop_reason == "exhausted"
    assert result.report.verification.equivalent
    assert result.best_candidate.seconds < result.report.spec_estimate.seconds
    arrays = workloads.get("rmsnorm_linear").small().random_inputs(1)
    got, want = ir.interpret(best, arrays)[0], ir.interpret(spec, arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_report_counts_and_summary():
    result = search(small_rmsnorm_spec(), SearchConfig(max_kernel_ops=1), **QUIET)
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


def test_time_budget_stops_the_search_near_the_budget():
    # the full rmsnorm_linear space does not finish in 3 s; the enumeration stops near the
    # budget (a task checks the deadline as it goes), and the report tells search time apart
    # from the whole call, which adds the winner's check at the real shapes
    spec = workloads.get("rmsnorm_linear").small().spec()
    result = search(spec, SearchConfig(budget_seconds=3.0), **QUIET)
    rep = result.report
    assert rep.stop_reason == "time"
    assert 3.0 <= rep.search_seconds < 3.0 + 5.0
    assert rep.wall_seconds >= rep.search_seconds
    assert f"after {rep.search_seconds:.1f} s of search" in result.summary()


def test_in_process_and_process_pool_give_the_same_result():
    spec = small_rmsnorm_spec()
    config = SearchConfig(max_kernel_ops=1)
    a = search(spec, config, executor=InProcess(), **QUIET)
    pool = ProcessPool(2)
    try:
        b = search(spec, config, executor=pool, **QUIET)
    finally:
        pool.close()
    assert a.best is b.best
    assert [c.graph for c in a.candidates] == [c.graph for c in b.candidates]
    assert a.report.states == b.report.states
