"""Every workload's hand-written fused μGraph through the generator: NVRTC for sm_80 and sm_90 with no spills and
tensor-core instructions wherever there is a block matmul; the CPU harness against the float64 interpreter under
three schedules; conflict-free ldmatrix layouts."""
from __future__ import annotations

import re

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.codegen import compile_cuda, generate, plan_shared_memory
from mugraph.codegen.fragments import bank_conflicts
from mugraph.ir.ops import BOp
from tests.codegen.bundle import build_bundle, generate_all, max_rel_error, run_bundled

NAMES = workloads.names()
ARCHS = ("sm_80", "sm_90")
TOLERANCE = 1e-2  # max |diff| <= 1e-2 max |ref|: fp16 inputs, fp32 accumulation
SCHEDULES = [("rr", 0), ("warpgreedy", 1), ("warpgreedy", 2)]


def has_block_matmul(graph) -> bool:
    return any(n.op is BOp.MATMUL for bg, _ in graph.custom_ops() for n in bg.nodes)


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request):
    """arch -> {workload: (GeneratedModule, CompiledKernel)} at full shapes (NVRTC is memoised per source)."""
    arch = request.param
    out = {}
    for name in NAMES:
        module = generate(workloads.get(name).reference(), arch)
        out[name] = (module, compile_cuda(module.source, arch, name=name))
    return arch, out


@pytest.mark.parametrize("name", NAMES)
def test_full_shapes_compile_without_spills(compiled, name):
    arch, table = compiled
    module, kernel = table[name]
    customs = [k.name for k in module.plan.kernels if k.kind == "custom"]
    assert customs and set(customs) <= set(kernel.kernels)
    for k in customs:
        assert kernel.resources(k).spills == 0, (arch, k, kernel.resources(k))
    for launch in module.plan.kernels:
        if launch.kind == "custom":
            assert 0 < launch.smem_bytes <= plan_shared_memory(
                next(bg for bg, _ in workloads.get(name).reference().custom_ops()), arch).limit


@pytest.mark.parametrize("name", NAMES)
def test_nvrtc_reports_no_warnings(compiled, name):
    _, table = compiled
    assert "warning" not in table[name][1].log


@pytest.mark.parametrize("name", NAMES)
def test_tensor_cores_where_there_is_a_block_matmul(compiled, name):
    _, table = compiled
    module, kernel = table[name]
    graph = workloads.get(name).reference()
    if has_block_matmul(graph):
        assert kernel.count("HMMA") > 0
    else:
        assert kernel.count("HMMA") == 0


@pytest.fixture(scope="module", params=ARCHS)
def small(request):
    """The small references' kernels for one arch (their pipeline depths differ), all in one CPU build."""
    graphs = {name: workloads.get(name).small().reference() for name in NAMES}
    modules = generate_all(graphs, request.param)
    return graphs, modules, build_bundle(modules)


@pytest.mark.parametrize("name", NAMES)
def test_cpu_harness_matches_interpreter(small, name):
    graphs, modules, cpu = small
    w = workloads.get(name).small()
    for seed in (0, 1):
        arrays = w.random_inputs(seed)
        ref = ir.interpret(graphs[name], arrays, dtype="float64")
        for schedule, sched_seed in SCHEDULES:
            out = run_bundled(modules[name], cpu, arrays, schedule=schedule, seed=sched_seed)
            assert [o.shape for o in out] == [r.shape for r in ref]
            err = max_rel_error(out, ref)
            assert err <= TOLERANCE, (name, seed, schedule, sched_seed, err)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_ldmatrix_layouts_are_conflict_free(name, arch):
    for shapes in ("full", "small"):
        w = workloads.get(name) if shapes == "full" else workloads.get(name).small()
        for bg, _ in w.reference().custom_ops():
            plan = plan_shared_memory(bg, arch)
            for layout in plan.ldmatrix_layouts():
                assert bank_conflicts(layout, "ldmatrix") == 0, (name, bg, layout)
            assert plan.total_bytes <= plan.limit


def test_every_workload_uses_the_fast_paths():
    """Products accumulate in mma registers and the attention's P @ V reads P from registers."""
    src = generate(workloads.get("gqa_safe").reference()).source
    assert "mg_pack2(mg_f2h(" in src  # scores' C fragments reused as A fragments
    assert src.count("mg_mma_m16n8k16_f16(acc") >= 1  # P @ V accumulated in place
    assert "mg_cp_async16_zfill" in src and "mg_ldmatrix_x4_trans" in src


def test_outputs_have_the_graphs_shapes_and_dtypes():
    for name in NAMES:
        g = workloads.get(name).small().reference()
        plan = generate(g).plan
        buffers = {b.name: b for b in plan.buffers}
        assert [buffers[o].shape for o in plan.outputs] == [o.shape for o in g.outputs]
        assert [buffers[o].dtype for o in plan.outputs] == [o.dtype for o in g.outputs]
        assert plan.inputs == g.input_names
        assert np.all([buffers[i].role == "input" for i in plan.inputs])


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gated_mlp", "lora", "gqa", "gqa_safe"])
@pytest.mark.parametrize("arch", ARCHS)
def test_one_barrier_per_iteration_and_no_prologue_wait(name, arch):
    """The pipeline's only barrier is the one that publishes each iteration's tiles; the prologue issues every
    stage before it waits for anything (a wait after that is for the loop-invariant tiles whose mma fragments
    stay in registers: the one group committed before the stages)."""
    kernel = generate(workloads.get(name).reference(), arch).kernel_sources[0]
    prologue, loop = kernel.split("for (int it = 0;", 1)
    body = loop.split("the last (empty) prefetches land", 1)[0]
    waits = re.findall(r"mg_cp_async_wait_group<(\d+)>", prologue)
    assert not waits or (prologue.find("mg_cp_async_wait_group") > prologue.rfind("mg_cp_async_commit")
                         and waits == [str(prologue.count("mg_cp_async_commit") - 1)])
    assert body.count("mg_syncthreads()") == 1


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_exp_of_a_scaled_score_is_one_exp2_with_the_scale_folded(arch):
    """qknorm_gqa's exp(s * 0.125): 2^(s * 0.125 log2 e), one multiply by the folded constant and no materialised
    product (codegen/values.scaled_exp); the harness tests above check the numbers."""
    source = generate(workloads.get("qknorm_gqa").reference(), arch).source
    assert re.search(r"mg_exp2\(v\d+\[bi\]\[mi\]\[ni\]\[q\] \* 0\.180336878f\)", source)
    assert "mg_exp(" not in source and "* 0.125f" not in source
