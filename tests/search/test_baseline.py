"""The XLA-like baseline on programs whose XLA GPU fusions are known: launches, what each kernel reads
and writes, and its time under the cost model against the unfused program."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from mugraph import ir, workloads
from mugraph.search.baseline import xla_estimate, xla_fusions
from mugraph.search.cost import estimate, fused_kernel


def _lift(fn, *shapes, dtype=jnp.float16):
    return ir.from_jax(fn, *(jax.ShapeDtypeStruct(s, dtype) for s in shapes))


def _kinds(graph):
    return [f.kind for f in xla_fusions(graph)]


def _chain(x):
    for i in range(10):
        x = jax.nn.sigmoid(x * 1.01 + 0.1) - x * 0.5    # three elementwise ops per step
    return x


def test_a_chain_of_30_elementwise_ops_is_one_launch_reading_and_writing_once():
    g = _lift(_chain, (64, 256))
    assert len([n for n in g.nodes if n.op.value not in ("input", "constant")]) >= 30
    (f,) = xla_fusions(g)
    assert f.kind == "loop" and f.roots == tuple(g.outputs)
    est = xla_estimate(g)
    assert est.launches == 1 and est.hbm_bytes == 2 * 64 * 256 * 2
    assert estimate(g).launches >= 30 and est.seconds < estimate(g).seconds / 10


def test_matmul_bias_gelu_is_a_gemm_and_one_fusion():
    g = _lift(lambda x, w, b: jax.nn.gelu(x @ w + b), (16, 64), (64, 128), (128,))
    assert _kinds(g) == ["gemm", "loop"]
    gemm, loop = xla_fusions(g)
    assert gemm.roots[0].op is ir.KOp.MATMUL and gemm.roots[0] in loop.reads


def test_gemm_rewriting_folds_a_scalar_scale_and_a_full_residual():
    g = _lift(lambda x, w, r: (x @ w) * 0.5 + r, (16, 64), (64, 128), (16, 128))
    (gemm,) = xla_fusions(g)
    assert gemm.kind == "gemm" and [m.op.value for m in gemm.members] == ["matmul", "mul", "add"]
    lora = xla_fusions(workloads.get("lora").small().spec())   # X@W + (X@A)@B: three GEMMs
    assert [f.kind for f in lora] == ["gemm"] * 3


def _softmax(s):
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def test_softmax_is_two_reduction_kernels_and_one_loop_fusion():
    g = _lift(_softmax, (32, 256))
    fusions = xla_fusions(g)
    assert [f.kind for f in fusions] == ["reduction", "reduction", "loop"]
    _, sums, last = fusions
    assert {m.op.value for m in sums.members} >= {"sub", "exp", "reduce_sum"}   # input fusion
    assert {m.op.value for m in last.members} >= {"sub", "exp", "div"}          # recomputed exp


def _layernorm(x):
    m = jnp.mean(x, axis=-1, keepdims=True)
    d = x - m
    return d * jax.lax.rsqrt(jnp.mean(d * d, axis=-1, keepdims=True) + 1e-5)


def test_norms_are_their_reductions_and_one_loop_fusion():
    assert _kinds(_lift(_layernorm, (16, 256))) == ["reduction", "reduction", "loop"]
    rms = workloads.get("rmsnorm_linear").small().spec()
    assert _kinds(rms) == ["reduction", "loop", "gemm"]
    x = ir.input("X", (16, 256), "float16")
    assert _kinds(ir.KernelGraph([x.rms_norm(1, 1e-6).exp()])) == ["reduction", "loop"]


def test_sibling_reductions_of_one_tensor_are_one_kernel_and_dependent_ones_are_not():
    x = ir.input("X", (16, 256), "float32")
    siblings = ir.KernelGraph([x.sum(1), (x * x).sum(1)])
    (f,) = xla_fusions(siblings)
    assert f.kind == "reduction" and len(f.roots) == 2 and f.reads == (x,)
    mean = x.sum(1) / 256.0
    dependent = ir.KernelGraph([mean, ((x - mean) * (x - mean)).sum(1)])
    assert len(xla_fusions(dependent)) == 3     # sum; the variance; the mean itself (an output)


def test_each_kernel_is_costed_by_the_cost_model_formula():
    spec = workloads.get("rmsnorm_linear").spec()
    est = xla_estimate(spec, "h100")
    fusions = xla_fusions(spec)
    assert est.launches == len(fusions) == 3
    gemm = fusions[-1]
    want = fused_kernel("gemm", gemm.reads, gemm.write_bytes, est.kernels[-1].tc_flops,
                        est.kernels[-1].simt_flops, "h100")
    assert est.kernels[-1].seconds == pytest.approx(want.seconds)
    x, w = spec.inputs
    assert est.kernels[-1].hbm_bytes == math.prod(w.shape) * 2 + math.prod(x.shape) * 2 + \
        x.shape[0] * w.shape[1] * 2    # W, the normalised X (written by the loop fusion), the output


@pytest.mark.parametrize("name", workloads.names())
def test_the_xla_like_baseline_is_never_slower_than_the_unfused_program(name):
    from mugraph.search.cost import Launch
    spec = workloads.get(name).spec()
    # the same charge per kernel on both sides (jax.jit's command-buffer threshold can favour more kernels)
    xla, unfused = xla_estimate(spec, launch=Launch.GRAPH), estimate(spec, launch=Launch.GRAPH)
    assert xla.launches <= unfused.launches and xla.seconds <= unfused.seconds * (1 + 1e-9)


def test_bad_input_is_a_typed_error():
    with pytest.raises(ir.InvalidInput):
        xla_fusions("not a graph")


def test_a_search_summary_heads_with_the_xla_like_speedup_and_names_both_baselines():
    from types import SimpleNamespace
    from mugraph.search.cost import roofline
    from mugraph.search.result import Candidate, SearchResult
    w = workloads.get("rmsnorm_linear")
    spec, fused = w.spec(), w.reference()
    report = SimpleNamespace(target="h100", spec_estimate=estimate(spec), roofline=roofline(spec),
                             verification=None)
    result = SearchResult(fused, (Candidate(fused, estimate(fused), "1 custom kernel", "search"),),
                          report, spec)
    best = estimate(fused).seconds
    assert result.speedup == pytest.approx(xla_estimate(spec, "h100").seconds / best)
    assert result.speedup_vs_unfused == pytest.approx(estimate(spec, "h100").seconds / best)
    assert result.speedup < result.speedup_vs_unfused     # jax.jit fuses; the unfused program does not
    text = result.summary()
    assert text.index("estimated speedup") < text.index("against the XLA-like baseline") \
        < text.index("against the unfused program")


# ---- the launches jax.jit pays (cost.launch_charges): the headline's, on both sides -------------------------
def test_the_baseline_is_charged_the_launches_jax_jit_pays_not_eager_ones():
    from mugraph.search.cost import Launch
    from mugraph.search.targets import get_target
    t = get_target("h200")
    assert (t.jit_launch_s, t.graph_launch_s, t.launch_s, t.command_buffer_min_kernels) == (1e-6, 0.5e-6, 4e-6, 5)
    three = workloads.get("rmsnorm_linear").spec()        # reduction, loop, gemm: under XLA's run of 5
    jit, eager = xla_estimate(three, "h200"), xla_estimate(three, "h200", launch=Launch.EAGER)
    assert jit.launches == eager.launches == 3
    assert eager.seconds - jit.seconds == pytest.approx(3 * (4e-6 - 1e-6))
    eight = workloads.get("qknorm_gqa").spec()            # 8 fusions: one command buffer
    jit, eager = xla_estimate(eight, "h200"), xla_estimate(eight, "h200", launch=Launch.EAGER)
    assert jit.launches == 8 and eager.seconds - jit.seconds == pytest.approx(8 * (4e-6 - 0.5e-6))


def test_runs_of_capturable_kernels_below_xlas_threshold_and_uncapturable_ones_launch_from_cpp():
    from mugraph.search.cost import Launch, launch_charges
    us = [round(c * 1e6, 3) for c in launch_charges("h100", [True] * 5 + [False] + [True] * 4)]
    assert us == [0.5] * 5 + [1.0] * 5
    assert launch_charges("h100", [True, False], Launch.EAGER) == [4e-6, 4e-6]
    assert launch_charges("h100", [False], Launch.GRAPH) == [0.5e-6]


def test_mugraphs_kernels_are_charged_as_the_baseline_on_the_same_path():
    from mugraph.search.cost import Launch
    w = workloads.get("gqa")
    split = estimate(w.reference(), "h200")               # split-KV: its FFI handler (workspace) is not capturable
    assert split.kernels[0].splits > 1
    eager = estimate(w.reference(), "h200", launch=Launch.EAGER)
    assert eager.seconds - split.seconds == pytest.approx(4e-6 - 1e-6)
    whole = estimate(workloads.get("lora").reference(), "h200")
    assert whole.kernels[0].splits == 1 and whole.seconds - estimate(
        workloads.get("lora").reference(), "h200", launch=Launch.GRAPH).seconds == pytest.approx(1e-6 - 0.5e-6)
