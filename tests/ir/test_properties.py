"""Hypothesis properties (derandomised in CI): random graphs round-trip through JSON and agree with
jax.numpy; random schedules agree with the unscheduled program; fp16 runs stay near float64."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mugraph import ir
from mugraph.ir import BOp
from mugraph.testing import assert_equivalent, block_schedules, kernel_graphs, random_arrays
from tests.ir.jnp_reference import evaluate

SEEDS = st.integers(0, 2**32 - 1)
ALL_DTYPES = ("float32", "float16", "bfloat16")


@given(kernel_graphs(max_nodes=10, dtypes=ALL_DTYPES))
def test_kernel_graphs_round_trip_through_json(graph):
    assert ir.from_json(ir.to_json(graph)) is graph
    assert ir.from_json(ir.to_json(graph, indent=None)) is graph


@given(kernel_graphs(max_nodes=8, dtypes=ALL_DTYPES), SEEDS)
def test_interpreter_agrees_with_jax_numpy(graph, seed):
    arrays = random_arrays(graph, seed)
    reference = ir.interpret(graph, arrays)
    for name, exact, f32 in zip(graph.output_names, reference, evaluate(graph, arrays)):
        assert np.isfinite(exact).all(), "kernel_graphs keeps values finite"
        scale = max(1.0, float(np.abs(exact).max()))
        np.testing.assert_allclose(f32, exact, rtol=0, atol=2e-5 * scale, err_msg=name)


# (kind, shape, accumulator): every accumulator, several ranks and dims
SCHEDULE_CASES = [
    ("matmul", (4, 6, 6), BOp.ACC_SUM),
    ("matmul", (2, 4, 6, 6), BOp.ACC_SUM),
    ("rms_norm_matmul", (4, 8, 6), BOp.ACC_SUM),
    ("elementwise", (4, 6), BOp.ACC_SUM),
    ("elementwise", (2, 3, 4), BOp.ACC_MAX),
    ("reduce_sum", (4, 6), BOp.ACC_SUM_LAST),
    ("reduce_sum", (2, 3, 4), BOp.ACC_SUM),
    ("reduce_max", (4, 6), BOp.ACC_MAX_LAST),
    ("reduce_max", (6, 4), BOp.ACC_MAX),
    ("rms", (4, 6), BOp.ACC_RMS_LAST),
    ("softmax", (4, 8, 12, 6), BOp.ACC_MAX_LAST),
    ("softmax", (4, 8, 12, 6), BOp.ACC_MAX),
]


def test_schedule_cases_cover_every_accumulator():
    used = {acc for _, _, acc in SCHEDULE_CASES} | {BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE}
    assert used == ir.ops.ACCUMULATORS  # softmax uses both rescaling accumulators


@pytest.mark.parametrize("kind,shape,acc", SCHEDULE_CASES,
                         ids=[f"{k}-{'x'.join(map(str, s))}-{a.value}"
                              for k, s, a in SCHEDULE_CASES])
@given(data=st.data())
def test_schedules_agree_with_the_unscheduled_program(kind, shape, acc, data):
    case = data.draw(block_schedules(kind, shape, accumulator=acc), label="schedule")
    assert acc in {n.op for n in case.block_graph.nodes}
    arrays = random_arrays(case.reference, data.draw(SEEDS, label="seed"))
    assert_equivalent(case.reference, case.graph, arrays, rtol=1e-10, atol=1e-10)


@given(block_schedules("reduce_sum", (6, 4), dim=0), SEEDS)
def test_reductions_over_the_first_dim(case, seed):
    assert case.block_graph.inputs[0].arg.fmap == 0
    assert_equivalent(case.reference, case.graph, random_arrays(case.reference, seed),
                      rtol=1e-10, atol=1e-10)


@given(kernel_graphs(max_nodes=6, dtypes=("float16",)), SEEDS)
def test_own_dtype_stays_near_float64_for_fp16_graphs(graph, seed):
    arrays = random_arrays(graph, seed)
    exact = ir.interpret(graph, arrays)
    own = ir.interpret(graph, arrays, dtype="own")
    for node, e, o in zip(graph.outputs, exact, own):
        assert o.dtype == node.dtype.numpy
        scale = max(1.0, float(np.abs(e).max()))
        np.testing.assert_allclose(o.astype(np.float64), e, rtol=0, atol=1e-2 * scale)


@given(st.sampled_from(["matmul", "rms_norm_matmul", "softmax"]).flatmap(
    lambda kind: block_schedules(kind, {"softmax": (4, 8, 12, 6)}.get(kind, (4, 16, 6)))), SEEDS)
def test_own_dtype_stays_near_float64_for_fp16_schedules(case, seed):
    arrays = random_arrays(case.graph, seed)
    (exact,) = ir.interpret(case.graph, arrays)
    (own,) = ir.interpret(case.graph, arrays, dtype="own")
    assert own.dtype == np.float16
    scale = max(1.0, float(np.abs(exact).max()))
    np.testing.assert_allclose(own.astype(np.float64), exact, rtol=0, atol=1e-2 * scale)
