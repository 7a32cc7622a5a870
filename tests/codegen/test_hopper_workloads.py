"""Every workload's sm_90a kernel: the path the model chose (TMA pipeline, wgmma where a product fits), NVRTC for
sm_90a with no spills and Hopper's instructions in the SASS, the CPU harness against the float64 interpreter under
several schedules and in the checking build, and the checking build catching each async-proxy bug injected into a
generated kernel (a missing mbarrier wait, a stage released too early, an unfenced generic write before wgmma...)."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from mugraph import ir, workloads
from mugraph.codegen import compile_cuda, generate
from mugraph.codegen.arch import get_arch
from mugraph.codegen.cpu import CHECK_DEFINE, KernelFault, build_cpu
from mugraph.codegen.generate import GeneratedModule
from mugraph.codegen.schedule import kernel_schedule
from tests.codegen.bundle import build_bundle, generate_all, max_rel_error, run_bundled

ARCH = "sm_90a"
NAMES = workloads.names()
TOLERANCE = 1e-2
SCHEDULES = [("rr", 0), ("warpgreedy", 1), ("random", 2)]


def schedules_of(graph):
    return [kernel_schedule(bg, ARCH) for bg, _ in graph.custom_ops()]


@pytest.fixture(scope="module")
def full():
    """name -> (graph, GeneratedModule, CompiledKernel) at full shapes."""
    out = {}
    for name in NAMES:
        graph = workloads.get(name).reference()
        module = generate(graph, ARCH)
        out[name] = (graph, module, compile_cuda(module.source, ARCH, name=name))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_full_shapes_compile_for_sm_90a_without_spills(full, name):
    graph, module, kernel = full[name]
    customs = [k.name for k in module.plan.kernels if k.kind == "custom"]
    assert customs and all(kernel.resources(k).spills == 0 for k in customs), kernel.kernels
    assert "warning" not in kernel.log
    for launch, s in zip([k for k in module.plan.kernels if k.kind == "custom"], schedules_of(graph)):
        assert launch.block == (s.threads, 1, 1) and len(launch.tensor_maps) == (len(
            [n for n in graph.custom_ops()[0][0].inputs if n.arg.fmap is not None]) if s.tma else 0)


@pytest.mark.parametrize("name", NAMES)
def test_hoppers_instructions_where_the_model_chose_them(full, name):
    graph, module, kernel = full[name]
    (s,) = schedules_of(graph)
    assert kernel.count("HGMMA") > 0 if s.wgmma else kernel.count("HGMMA") == 0
    assert kernel.count("UTMALDG") > 0 if s.tma else kernel.count("UTMALDG") == 0
    if s.tma:  # the producer warpgroup gives its registers back; mbarriers pace the stages; no __syncthreads
        assert "mg_setmaxnreg_dec<" in module.source and kernel.count("SYNCS") > 0  # mbarrier operations
        loop = module.source.split("for (int it = 0;")[-1]
        assert "mg_syncthreads()" not in loop
    if any(n.op.value == "matmul" for bg, _ in graph.custom_ops() for n in bg.nodes) and not s.wgmma:
        assert kernel.count("HMMA") > 0


def test_the_model_takes_wgmma_for_attention_and_tma_for_streaming_loops():
    paths = {name: schedules_of(workloads.get(name).reference())[0] for name in NAMES}
    for name in ("gqa", "gqa_safe", "qknorm_gqa"):
        assert paths[name].path == "hopper" and paths[name].wgmma and paths[name].tma, name
    for name in ("rmsnorm_linear", "gated_mlp", "lora"):  # M = 8 or 16 rows: mma.sync, but the tiles by TMA
        assert paths[name].tma and not paths[name].wgmma, name
    assert paths["ntrans"].path == "sync"  # no loop: nothing for a pipeline to stream


@pytest.fixture(scope="module")
def small():
    graphs = {name: workloads.get(name).small().reference() for name in NAMES}
    modules = generate_all(graphs, ARCH)
    return graphs, modules, build_bundle(modules), build_bundle(modules, defines=[CHECK_DEFINE])


@pytest.mark.parametrize("name", NAMES)
def test_cpu_harness_matches_interpreter_on_sm_90a(small, name):
    graphs, modules, cpu, checked = small
    w = workloads.get(name).small()
    arrays = w.random_inputs(0)
    ref = ir.interpret(graphs[name], arrays, dtype="float64")
    for schedule, seed in SCHEDULES:
        err = max_rel_error(run_bundled(modules[name], cpu, arrays, schedule=schedule, seed=seed), ref)
        assert err <= TOLERANCE, (name, schedule, seed, err)
    err = max_rel_error(run_bundled(modules[name], checked, arrays, schedule="warpgreedy", seed=3), ref)
    assert err <= TOLERANCE, (name, "check", err)


# ---- injected bugs: the checking build catches each -----------------------------------------------------------------

# Longer loops than the small shapes, unsplit, through 3 stages: every stage is refilled (10 times).
LONG = {"rmsnorm_linear": {"X": (16, 2048), "W": (2048, 64)},
        "gated_mlp": {"X": (8, 2048), "W1": (2048, 64), "W2": (2048, 64)}}
REFILLING = replace(get_arch(ARCH), split_loops=False, max_stages=3)


def _workload(name: str):
    w = workloads.get(name).small()
    return replace(w, shapes=LONG[name]) if name in LONG else w


def _mutant(name: str, edit) -> tuple:
    w = _workload(name)
    module = generate(w.reference(), REFILLING)
    source = edit(module.source)
    assert source != module.source, "the edit changed nothing"
    customs = [k.name for k in module.plan.kernels if k.kind == "custom"]
    cpu = build_cpu(source, customs, defines=[CHECK_DEFINE])
    return GeneratedModule(source, module.plan, ARCH, module.kernel_sources), cpu, w


def _run(name: str, edit, **launch):
    module, cpu, w = _mutant(name, edit)
    arrays = w.random_inputs(0)
    return run_bundled(module, cpu, arrays, **launch), ir.interpret(w.reference(), arrays, dtype="float64")


MUTANTS = {
    # consumers read a stage before its TMA copies landed
    "no_full_wait": ("gqa", lambda s: re.sub(r"\n\s*mg_mbar_wait\(sm\d+ \+ it % \d+, \(it / \d+\) & 1\);[^\n]*", "", s),
                     "TMA copy in flight"),
    # the producer refills a stage the consumers still read (or arrives on its full barrier twice in a phase)
    "no_empty_wait": ("rmsnorm_linear", lambda s: re.sub(r"\n\s*mg_mbar_wait\(sm\d+ \+ \d+ \+ s_,[^\n]*", "", s),
                      "overwritten by a TMA copy|more arrivals than the mbarrier's count"),
    # the consumers release a stage before they are done with it
    "early_release": ("gated_mlp", lambda s: _release_first(s), "overwritten by a TMA copy"),
    # a staged operand written by the generic proxy, read by wgmma without fence.proxy.async
    "no_proxy_fence": ("qknorm_gqa", lambda s: s.replace("  mg_fence_proxy_async();  // generic writes become visible "
                                                         "to wgmma\n", ""), "fence.proxy.async"),
}


def _release_first(source: str) -> str:
    """Moves the empty-barrier arrive from the end of the trip to right after its full wait."""
    arrive = re.search(r"\n(\s*mg_mbar_arrive\(sm\d+ \+ \d+ \+ it % \d+\);[^\n]*)", source)
    wait = re.search(r"\n\s*mg_mbar_wait\(sm\d+ \+ it % \d+, \(it / \d+\) & 1\);[^\n]*", source)
    without = source[:arrive.start()] + source[arrive.end():]
    return without[:wait.end()] + "\n" + arrive.group(1) + without[wait.end():]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_checking_build_catches_async_proxy_bugs(mutant):
    name, edit, message = MUTANTS[mutant]
    caught = False
    for schedule, seed in (("rr", 0), ("warpgreedy", 1), ("reverse", 0)):
        try:
            _run(name, edit, schedule=schedule, seed=seed)
        except KernelFault as e:
            assert e.kind in ("race", "bad_argument") and re.search(message, str(e)), str(e)
            caught = True
            break
    assert caught, f"{mutant}: no schedule exposed the bug"


def test_reading_accumulators_before_wgmma_completes_is_wrong_or_caught():
    def no_wait(s):
        return s.replace("mg_wgmma_commit();\n    mg_wgmma_wait<0>();", "mg_wgmma_commit();", 1)
    try:
        out, ref = _run("gqa", no_wait)
    except KernelFault:
        return
    assert max_rel_error(out, ref) > TOLERANCE


# ---- golden files: the generated sm_90a text, reviewed when it changes ------------------------------------------------

@pytest.mark.parametrize("name", ["gqa_safe", "rmsnorm_linear"])
def test_generated_sm_90a_source_matches_golden(name):
    from tests.golden import check_golden
    from tests.codegen.test_generate_golden import GOLDEN
    check_golden(GOLDEN / f"{name}_small.sm_90a.cu", generate(workloads.get(name).small().reference(), ARCH).source)


@pytest.mark.parametrize("name", NAMES)
def test_sm_90a_shared_layouts_are_conflict_free_for_ldmatrix(name):
    from mugraph.codegen import plan_shared_memory
    from mugraph.codegen.fragments import bank_conflicts
    for w in (workloads.get(name), workloads.get(name).small()):
        for bg, _ in w.reference().custom_ops():
            plan = plan_shared_memory(bg, ARCH)
            for layout in plan.ldmatrix_layouts():
                assert bank_conflicts(layout, "ldmatrix") == 0, (name, layout)
            for a in plan.allocations:  # a swizzled tile starts on its period, so its pattern is its own
                period = getattr(getattr(a.layout, "matrix", None), "mode", None)
                assert period is None or a.offset % period.period == 0, (name, a)
