"""The CPU harness's checking build (race and bounds mode): every generated kernel of the suite's small shapes,
the construct cases and the random graphs runs with shadow shared memory (a read and a write, or two writes, of
one byte by different threads between the same barriers is a race, whatever the schedule) and every global
access judged against the launch's arrays; and the checks catch a removed barrier, a removed cp.async wait and
an input too short for the kernel."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.codegen import generate
from mugraph.codegen.cpu import CHECK_DEFINE, KernelFault, build_cpu
from mugraph.codegen.run_cpu import run_plan
from mugraph.ir.interpret import bind_inputs
from tests.codegen.bundle import build_bundle, generate_all, max_rel_error, run_bundled
from tests.codegen.cases import CASES
from tests.codegen.random_graphs import random_graph

ARCH = "sm_90"
GRAPHS = {**{f"w_{n}": (lambda n=n: _workload(n)) for n in workloads.names()},
          **{f"case_{n}": (lambda make=make: make(0)) for n, make in CASES.items()},
          **{f"random{s}": (lambda s=s: random_graph(s)) for s in range(0, 24, 3)}}


def _workload(name):
    w = workloads.get(name).small()
    return w.reference(), w.random_inputs(0)


@pytest.fixture(scope="module")
def checked():
    built = {name: make() for name, make in GRAPHS.items()}
    modules = generate_all({name: g for name, (g, _) in built.items()}, ARCH)
    return built, modules, build_bundle(modules, defines=[CHECK_DEFINE])


@pytest.mark.parametrize("name", list(GRAPHS))
def test_generated_kernels_have_no_races_or_out_of_bounds_accesses(checked, name):
    built, modules, cpu = checked
    graph, arrays = built[name]
    out = run_bundled(modules[name], cpu, bind_inputs(graph, arrays), schedule="rr")
    assert max_rel_error(out, ir.interpret(graph, arrays, dtype="float64")) <= 1e-2


def _mutant(drop=None):
    """rmsnorm_linear (small) with the source lines ``drop`` picks removed, built with the checks."""
    w = workloads.get("rmsnorm_linear").small()
    g, arrays = w.reference(), w.random_inputs(0)
    m = generate(g, ARCH)
    lines = m.source.splitlines()
    gone = drop(lines) if drop else set()
    assert gone or not drop, "the mutation found nothing to remove"
    source = "\n".join(line for i, line in enumerate(lines) if i not in gone)
    cpu = build_cpu(source, ["mg_kernel0"], defines=[CHECK_DEFINE])
    return type(m)(source, m.plan, m.arch), cpu, bind_inputs(g, arrays)


def _nth(pattern: str, n: int):
    return lambda lines: {[i for i, line in enumerate(lines) if line.strip().startswith(pattern)][n]}


@pytest.mark.parametrize("n", [0, 1, 2])
def test_a_removed_barrier_is_a_race(n):
    module, cpu, arrays = _mutant(_nth("mg_syncthreads();", n))
    with pytest.raises(KernelFault) as e:
        run_plan(module, cpu, arrays)
    assert e.value.kind == "race" and "between the same barriers" in str(e.value)


def test_a_removed_cp_async_wait_is_a_race():
    module, cpu, arrays = _mutant(_nth("mg_cp_async_wait_group<", 0))
    with pytest.raises(KernelFault) as e:
        run_plan(module, cpu, arrays)
    assert e.value.kind == "race" and "cp.async in flight" in str(e.value)


def test_an_input_too_short_is_an_out_of_bounds_access():
    module, cpu, arrays = _mutant()
    w = arrays[1]
    short = np.ascontiguousarray(w[: w.shape[0] // 2])  # W with half its rows
    launch = module.plan.kernels[0]
    buffers = [arrays[0], short] + [np.full(b.shape, np.nan, b.dtype.numpy) for b in module.plan.buffers[2:]]
    with pytest.raises(KernelFault) as e:
        cpu.run(launch.name, buffers, launch.grid, launch.block, launch.smem_bytes)
    assert e.value.kind == "global_out_of_bounds"
