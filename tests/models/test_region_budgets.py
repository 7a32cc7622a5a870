"""How a program's search budget reaches its regions: shared by ops (search.regions.region_budgets),
and no search for a region of one op (jax.jit runs it as one kernel too)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import ir
from mugraph.search import SearchConfig
from mugraph.search.regions import MIN_REGION_SECONDS, ONE_OP, region_budgets


def _chain(ops: int) -> ir.KernelGraph:
    x = ir.input("X", (8, 8), "float32")
    for _ in range(ops):
        x = x.exp()
    return ir.KernelGraph([x])


def test_the_budget_is_shared_by_ops_within_the_total():
    specs = [_chain(1), _chain(3), _chain(12)]
    one, three, twelve = region_budgets(64.0, specs, workers=1)
    assert one * 3 == pytest.approx(three) and one * 12 == pytest.approx(twelve)
    assert one + three + twelve == pytest.approx(64.0)
    # two workers search two at a time: twice the seconds in all, the same wall time
    assert sum(region_budgets(64.0, specs, workers=2)) == pytest.approx(128.0)
    assert region_budgets(0.5, specs, workers=1) == [MIN_REGION_SECONDS] * 3
    assert region_budgets(10.0, [], workers=4) == []


def test_a_region_of_one_op_is_not_searched_and_the_program_still_runs(tmp_path):
    def project_then_sort(x, w):
        return jnp.sort(x @ w, axis=-1)        # sort stays JAX: the matmul is a region alone

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 32), jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (32, 16), jnp.float32)
    fn = mugraph.jit(project_then_sort, backend="harness",
                     config=SearchConfig(budget_seconds=5, budget_states=50), cache=tmp_path)
    np.testing.assert_allclose(fn(x, w), jax.jit(project_then_sort)(x, w), rtol=1e-5, atol=1e-5)
    (program,) = fn.kernels.values()
    (outcome,) = program.outcomes
    assert not outcome.fused and outcome.reason == ONE_OP and outcome.answer is None
    assert ONE_OP in str(program.report)
    assert program.rounds[0].searched == 0


def test_a_region_whose_fused_kernels_all_lose_says_so():
    """A compute-bound GEMM with its residual: the search finds fused structures, but the spec's
    library kernels win; the reason says that, not that nothing was found."""
    from types import SimpleNamespace as NS
    from mugraph.search.regions import _no_fused_reason
    spec = NS(origin="spec", graph=NS(custom_ops=lambda: []), seconds=64.8e-6)
    fused = NS(origin="search", graph=NS(custom_ops=lambda: ["k0"]), seconds=115.7e-6)
    report = NS(stop_reason="time", states=34609, verified=21)
    lost = _no_fused_reason(NS(report=report, candidates=(spec, fused)))
    assert lost == ("the search found 21 verified fused structures, but the best fused kernel is "
                    "estimated 115.70 us, slower than the spec's own kernels (64.80 us)")
    none = _no_fused_reason(NS(report=report, candidates=(spec,)))
    assert none == "the search found no fused kernel (time after 34609 states)"
