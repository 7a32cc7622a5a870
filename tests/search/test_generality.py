"""The quality tier of the generality suite: every program, at its small shapes, searched with a
small budget, comes back lifted, fused into custom kernels with no library kernel left, verified
EQUIVALENT by an independent check, and estimated faster than the XLA-like baseline.

The search (one kernel per candidate; a state budget per program, so the outcome does not
depend on the machine's speed, with a time cap as a safety net) filters its winner with
`check(..., seed=config.seed)`; the verdict asserted here is a fresh `check` with another seed
and the program's own input scale. Programs that miss a property today are strict xfails whose
reason is the root cause (see bench/generality.py for the table): they flip when it is fixed.
"""
from __future__ import annotations

import pytest

from mugraph import generality
from mugraph.search import SearchConfig
from mugraph.verify import check

# States per program: the smallest of 1500, 2500, 4000, 6000, 9000, 13500, 20000, 30000, 45000 with
# which the search (as of this file's last update) returns a winner that passes every assertion
# below; the budget also sets each root task's share, so a larger one is not always as good.
# Programs whose one-kernel space is smaller than DEFAULT_STATES are searched to exhaustion.
DEFAULT_STATES = 1_500
STATES = {
    "layernorm_linear": 20_000,
    "l2norm_linear": 45_000,
    "linear_rmsnorm": 4_000,
    "residual_rmsnorm": 20_000,
    "attention_scaled": 6_000,
    "attention_causal": 13_500,
    "attention_gqa_grouped": 9_000,
    "column_mean_scale": 2_500,
    "linear_scale_residual": 4_000,
    "attention_4d_causal": 2_500,
    "mha_head_split_causal": 6_000,
    "gqa_repeat_causal": 9_000,
}
SAFETY_SECONDS = 120.0
CHECK_SEED = 20261203          # not the search's seed (0): the verdict is not the search's filter

_ONE_KERNEL_TIE = (
    "XLA emits this program as one kernel too ({}), so fusion cannot win: the cost model charges "
    "both one launch and one first load (hbm_latency_s), and the custom kernel's loop "
    "instructions and per-SM fill (cost._custom_kernel) come on top of the bytes at the bandwidth "
    "the fusion is charged (cost.fused_kernel): at best a tie")
XFAIL = {
    "elementwise_chain_30": _ONE_KERNEL_TIE.format("a loop fusion"),
    "threshold_select_f32": _ONE_KERNEL_TIE.format("a loop fusion"),
    "linear_scale_residual": _ONE_KERNEL_TIE.format(
        "a GEMM: XLA's GEMM rewriting folds the 0.5 (alpha) and the residual (the C operand, "
        "beta = 1) into the cuBLAS call"),
}


def _config(name: str) -> SearchConfig:
    return SearchConfig(max_kernel_ops=1, budget_states=STATES.get(name, DEFAULT_STATES),
                        budget_seconds=SAFETY_SECONDS)


def _cases() -> list:
    return [pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, reason=XFAIL[name])]
                         if name in XFAIL else []) for name in generality.names()]


@pytest.mark.parametrize("name", _cases())
def test_program_is_fused_verified_and_faster_than_the_xla_like_baseline(name):
    program = generality.get(name).small()
    o = generality.evaluate(program, _config(name))
    assert o.lifted, o.lift_error
    assert o.search_error is None, o.search_error
    assert o.fused, f"{name}: the winner is {o.structure} after {o.states} states ({o.stop_reason})"
    assert not o.library_ops, f"{name}: library kernels left: {o.library_ops}"
    report = check(o.spec, o.winner, seed=CHECK_SEED, scale=program.input_scale, formal=False)
    assert report.equivalent, str(report)
    assert o.beats_xla, (f"{name}: {o.winner_us:.2f} us against the XLA-like baseline's "
                         f"{o.xla_us:.2f} us ({o.structure})")
