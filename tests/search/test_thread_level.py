"""The thread level in the search: elementwise chains, norms before or after a matmul, bias and
activation epilogues, residuals and scalings each come back as one fused kernel.

Every program is a JAX function lifted with `from_jax` and searched at small shapes with one
kernel op and a state budget above what it needs. The winner must be one custom kernel (layout
views aside) that `verify.check` finds EQUIVALENT, whose generated CUDA runs on the CPU harness
equal to the interpreter, and whose elementwise regions are thread graphs (BOp.THREAD) rather
than one block op per elementwise op. Programs are grouped so that each group's kernels build
as one harness module (one compiler run).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import BOp, TOp
from mugraph.ir.thread import ops_of
from mugraph.search import SearchConfig, search
from mugraph.verify import check
from tests.codegen.bundle import build_bundle, generate_all, max_rel_error, run_bundled

F16, F32 = jnp.float16, jnp.float32
QUIET = dict(progress=lambda *a: None)
VIEWS = (ir.KOp.INPUT, ir.KOp.CUSTOM, ir.KOp.TRANSPOSE, ir.KOp.RESHAPE)


def layernorm(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5)


def rmsnorm(x):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def l2norm(x):
    return x / jnp.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def chain30(x):
    """30 elementwise ops: ten rounds of scale, shift and a sigmoid or tanh."""
    for i in range(10):
        y = x * (1.0 + 0.01 * i) + 0.1
        x = jnp.tanh(y) if i % 2 else jax.nn.sigmoid(y)
    return x


def polynomial(y):
    return 0.5 * y + 0.25 * y * y + 0.125 * y * y * y - 1.0


XW = [(16, 64), (64, 32)]
XWB = XW + [(32,)]
# group -> {name: (JAX function, input shapes, dtype, state budget)}
GROUPS = {
    "norms": {
        "layernorm_then_matmul": (lambda x, w: layernorm(x) @ w, XW, F32, 8_000),
        "rmsnorm_then_matmul": (lambda x, w: rmsnorm(x) @ w, XW, F16, 3_000),
        "l2norm_then_matmul": (lambda x, w: l2norm(x) @ w, XW, F32, 30_000),
        "matmul_then_layernorm": (lambda x, w: layernorm(x @ w), XW, F32, 8_000),
        "matmul_then_rmsnorm": (lambda x, w: rmsnorm(x @ w), XW, F16, 3_000),
    },
    "epilogues": {
        "bias_gelu_erf": (lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False), XWB, F16,
                          3_000),
        "bias_gelu_tanh": (lambda x, w, b: jax.nn.gelu(x @ w + b), XWB, F32, 3_000),
        "bias_silu": (lambda x, w, b: jax.nn.silu(x @ w + b), XWB, F16, 3_000),
        "bias_sigmoid": (lambda x, w, b: jax.nn.sigmoid(x @ w + b), XWB, F32, 3_000),
        "scaled_residual": (lambda x, w, r: (x @ w) * 0.5 + r, XW + [(16, 32)], F16, 3_000),
        "polynomial_after_matmul": (lambda x, w: polynomial(x @ w), XW, F32, 3_000),
        "chain_of_30": (chain30, [(32, 64)], F16, 3_000),
    },
}


def _spec(fn, shapes, dtype):
    return ir.from_jax(fn, *[jax.ShapeDtypeStruct(s, dtype) for s in shapes])


def _members(graph) -> list:
    """Every block op of the winner's kernels, thread graphs opened."""
    out = []
    for bg, _ in graph.custom_ops():
        for n in bg.nodes:
            out += [n.op] + ([t.op for t in ops_of(n.arg)] if n.op is BOp.THREAD else [])
    return out


def _run_group(group: str) -> dict:
    found = {}
    for name, (fn, shapes, dtype, states) in GROUPS[group].items():
        spec = _spec(fn, shapes, dtype)
        config = SearchConfig(max_kernel_ops=1, budget_states=states, budget_seconds=120)
        found[name] = (spec, search(spec, config, **QUIET))
    return found


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_group_fuses_into_one_kernel_each_equivalent_and_running_on_the_harness(group):
    found = _run_group(group)
    for name, (spec, result) in found.items():
        best = result.best
        assert len(best.custom_ops()) == 1 and all(n.op in VIEWS for n in best.nodes), \
            f"{name}: {result.best_candidate.structure}"
        assert check(spec, best).equivalent, name
    modules = generate_all({name: r.best for name, (_, r) in found.items()})
    cpu = build_bundle(modules)
    rng = np.random.default_rng(2)
    for name, (spec, result) in found.items():
        arrays = [(rng.standard_normal(n.shape) * 0.5).astype(n.dtype.numpy) for n in spec.inputs]
        want = ir.interpret(result.best, arrays, dtype="own")
        assert max_rel_error(run_bundled(modules[name], cpu, arrays), want) < 1e-2, name


def test_long_elementwise_chain_is_one_thread_op_not_thirty_block_ops():
    """The 30-op chain costs one op of the block (max_block_ops counts it once), and the
    whole chain is held as one thread graph."""
    spec = _spec(chain30, [(32, 64)], F16)
    result = search(spec, SearchConfig(max_kernel_ops=1, max_block_ops=2,
                                       budget_states=5_000), **QUIET)
    (bg, _), = result.best.custom_ops()
    threads = [n for n in bg.nodes if n.op is BOp.THREAD]
    # 30 ops traced; the first round's scale is x * 1.0, an identity the front end drops
    assert len(threads) == 1 and len(ops_of(threads[0].arg)) == 29
    assert [n.op for n in bg.nodes if n.op not in (BOp.INPUT, BOp.THREAD)] == [BOp.ACC_SUM]


def test_gelu_epilogue_is_a_thread_graph_after_the_accumulated_matmul():
    spec = _spec(lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=False), XWB, F16)
    result = search(spec, SearchConfig(max_kernel_ops=1, budget_states=3_000), **QUIET)
    ops = _members(result.best)
    assert ops.count(BOp.MATMUL) == 1 and BOp.THREAD in ops and TOp.ERF in ops
    (bg, _), = result.best.custom_ops()
    phase = bg.phases()
    thread = next(n for n in bg.nodes if n.op is BOp.THREAD)
    assert phase[thread].value in ("epilogue", "invariant")   # after the sum, not per partial


def test_attention_with_a_shape_derived_scale_verifies_at_the_real_shapes():
    """softmax(q @ k.T / sqrt(d)) @ v with max subtraction, fp16, k and v 4096 long: the
    structure found at the reduced shapes (keys cut to 128) is checked at the real ones."""
    def attention(q, k, v):
        s = q @ k.T / math.sqrt(q.shape[-1])
        e = jnp.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    spec = _spec(attention, [(64, 128), (4096, 128), (4096, 128)], F16)
    result = search(spec, SearchConfig(max_kernel_ops=1, budget_states=5_000), **QUIET)
    assert len(result.best.custom_ops()) == 1, result.best_candidate.structure
    assert result.report.reduced_shapes["k"] == (128, 128)
    assert result.report.verification.equivalent
