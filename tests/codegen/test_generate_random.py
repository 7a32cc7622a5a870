"""Seeded random μGraphs (tests/codegen/random_graphs.py) through the generator and the CPU harness: odd
M/N/K, 64 to 256 threads, f16 and bf16, every accumulator kind, epilogues mixing registers of several layouts."""
from __future__ import annotations

import pytest

from mugraph import ir
from tests.codegen.bundle import build_bundle, generate_all, max_rel_error, run_bundled
from tests.codegen.random_graphs import random_graph

SEEDS = range(24)


@pytest.fixture(scope="module")
def bundle():
    built = {f"random{s}": random_graph(s) for s in SEEDS}
    modules = generate_all({name: g for name, (g, _) in built.items()}, "sm_90")
    return built, modules, build_bundle(modules)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_matches_interpreter(bundle, seed):
    built, modules, cpu = bundle
    graph, arrays = built[f"random{seed}"]
    ref = ir.interpret(graph, arrays, dtype="float64")
    for schedule, sched_seed in [("rr", 0), ("warpgreedy", seed)]:
        out = run_bundled(modules[f"random{seed}"], cpu, arrays, schedule=schedule, seed=sched_seed)
        assert max_rel_error(out, ref) <= 1e-2, (seed, schedule, str(graph))
