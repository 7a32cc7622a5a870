"""The search with the spec's casts: it rounds where the program rounds (normalised operands cast to fp16
feed one fp16 MMA, not three bf16 ones), and a fused kernel writes each output in the spec's dtype (an fp32
result of fp16 inputs is one kernel, not a widening copy plus a kernel)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mugraph import ir
from mugraph.codegen import generate
from mugraph.ir import BOp, DType, TOp
from mugraph.ir.thread import ops_of
from mugraph.search import SearchConfig, search
from mugraph.search.casts import spec_casts

QUIET = dict(progress=lambda *a: None)
F16 = jnp.float16


def _rms_norm(x, axis=-1):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=axis, keepdims=True) + 1e-6)).astype(x.dtype)


def _casts_in(graph) -> list:
    """(dtype, what reads the cast) of every block-level cast, thread units included."""
    found = []
    for bg, _ in graph.custom_ops():
        for n in bg.nodes:
            if n.op is TOp.CAST or n.op is BOp.THREAD and n.arg.op is TOp.CAST:
                readers = [m.op for m in bg.nodes if n in m.srcs]
                found.append((n.dtype, readers))
            elif n.op is BOp.THREAD:
                assert all(t.op is not TOp.CAST for t in ops_of(n.arg)), "a cast inside a unit"
    return found


def test_normalised_operands_are_rounded_to_fp16_before_the_product_as_the_program_does():
    def scores(q, k):
        return _rms_norm(q) @ _rms_norm(k, axis=0)
    spec = ir.from_jax(scores, jax.ShapeDtypeStruct((64, 64), F16), jax.ShapeDtypeStruct((64, 128), F16),
                       input_names=["Q", "K"])
    assert {d for _, d in spec_casts(spec)} == {DType.FLOAT16, DType.FLOAT32}
    result = search(spec, SearchConfig(max_kernel_ops=1, budget_states=6000), **QUIET)
    assert len(result.best.custom_ops()) == 1 and result.report.verification.equivalent
    casts = _casts_in(result.best)
    assert casts and all(d is DType.FLOAT16 and readers == [BOp.MATMUL] for d, readers in casts)
    source = generate(result.best, "sm_80").source
    assert "on tensor cores" in source and "3 bf16 products" not in source


def test_a_float32_result_of_fp16_inputs_is_one_kernel_writing_float32():
    def sum_of_squares(x):
        xf = x.astype(jnp.float32)
        return jnp.sum(xf * xf, axis=1, keepdims=True)
    spec = ir.from_jax(sum_of_squares, jax.ShapeDtypeStruct((64, 256), F16), input_names=["X"])
    assert spec.outputs[0].dtype is DType.FLOAT32
    result = search(spec, SearchConfig(max_kernel_ops=2, budget_states=4000), **QUIET)
    best = result.best
    assert [n.op for n in best.nodes] == [ir.KOp.INPUT, ir.KOp.CUSTOM]   # no widening copy first
    assert best.outputs[0].dtype is DType.FLOAT32 and result.report.verification.equivalent
