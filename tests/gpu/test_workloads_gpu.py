"""Every workload's generated kernel (of its hand-written fused μGraph) on the GPU, against the spec run by the
reference interpreter in float64, at full and reduced shapes. Outputs are poisoned with NaN before each launch,
so an element the kernel never writes fails the test."""
from __future__ import annotations

import functools
import shutil
from pathlib import Path

import cupy
import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.codegen.runtime_cupy import load_kernel

TOLERANCE = 1e-2  # fp16 outputs: max error relative to the output's largest magnitude
SIZES = ("full", "small")


def _workload(name: str, size: str):
    w = workloads.get(name)
    return w.small() if size == "small" else w


@functools.lru_cache(maxsize=None)
def _kernel(name: str, size: str):
    return load_kernel(_workload(name, size).reference())


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(got.astype(np.float64) - want).max() / scale)


def _run_poisoned(kernel, arrays) -> list[np.ndarray]:
    bound = kernel.bind(*arrays)
    for out in bound.outputs:
        out.fill(np.nan)
    return [cupy.asnumpy(o) for o in bound.launch()]


def _assert_close(name: str, got: list, want: list, tolerance: float, against: str) -> None:
    assert len(got) == len(want), f"{name}: {len(got)} outputs, {against} has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{name} output {i}: shape {g.shape}, {against} {w.shape}"
        bad = np.count_nonzero(~np.isfinite(g))
        assert bad == 0, f"{name} output {i}: {bad} of {g.size} elements unwritten or not finite"
        error = relative_error(g, np.asarray(w, np.float64))
        assert error <= tolerance, f"{name} output {i}: max error {error:.2e} of the output scale vs {against}"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", workloads.names())
def test_generated_kernel_matches_the_spec(name, size):
    w = _workload(name, size)
    arrays = w.random_inputs(seed=1)
    got = _run_poisoned(_kernel(name, size), arrays)
    _assert_close(f"{name} ({size})", got, ir.interpret(w.spec(), arrays), TOLERANCE, "the spec in float64")


@pytest.mark.parametrize("name", workloads.names())
def test_gpu_agrees_with_the_cpu_harness_on_the_same_source(name):
    """Same generated .cu on both: a GPU-only failure points at the device (layouts, async copies, races)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU harness needs it")
    from mugraph.codegen import run_on_cpu
    w = _workload(name, "small")
    arrays = w.random_inputs(seed=2)
    kernel = _kernel(name, "small")  # the device's code: sm_90a on a Hopper GPU
    got = _run_poisoned(kernel, arrays)
    cpu = run_on_cpu(w.reference(), arrays, arch=kernel.arch)
    _assert_close(f"{name} (small, {kernel.arch})", got, cpu, TOLERANCE, "the CPU harness")


@pytest.mark.parametrize("name", workloads.names())
def test_repeated_launches_are_bitwise_identical(name):
    """A result that moves between launches on the same inputs is a race (METHOD: 'a moving error is a race')."""
    arrays = _workload(name, "full").random_inputs(seed=3)
    runs = [_run_poisoned(_kernel(name, "full"), arrays) for _ in range(3)]
    for later in runs[1:]:
        for i, (a, b) in enumerate(zip(runs[0], later)):
            assert np.array_equal(a, b, equal_nan=True), f"{name} output {i} changed between launches"


SEARCHED = {name: path for name in workloads.names()
            if (path := Path(__file__).resolve().parents[2] / "kernels_generated" / name / "searched" / "graph.json")
            .is_file()}


@pytest.mark.parametrize("name", sorted(SEARCHED))
def test_the_searched_winner_matches_the_spec(name):
    w = _workload(name, "full")
    graph = ir.from_json(SEARCHED[name].read_text())
    arrays = w.random_inputs(seed=4)
    got = _run_poisoned(load_kernel(graph), arrays)
    _assert_close(f"{name} (searched)", got, ir.interpret(w.spec(), arrays), TOLERANCE, "the spec in float64")


def _split_graph():
    """A grid of 6 blocks over a 256-trip loop: codegen splits the loop over CTAs, the last one combines."""
    X, W = ir.input("X", (16, 4096), "float16"), ir.input("W", (4096, 384), "float16")
    b = ir.BlockBuilder(grid=(6, 1, 1), forloop=256)
    x, w = b.input(X, imap=None, fmap=1), b.input(W, imap=(1,), fmap=0)
    out = (x @ w).acc_sum() * ((x * x).acc_sum_last() / 4096.0 + 1e-6).rsqrt()
    return ir.KernelGraph(b.finish([(out, (1,))]), [X, W])


def test_split_loops_combine_deterministically_and_reset_their_counters():
    graph = _split_graph()
    kernel = load_kernel(graph)
    assert kernel.module.plan.kernels[0].grid[2] > 1, "the loop is not split: pick a smaller grid"
    rng = np.random.default_rng(5)
    arrays = [(rng.standard_normal(s) * 0.5).astype(np.float16) for s in ((16, 4096), (4096, 384))]
    runs = [_run_poisoned(kernel, arrays) for _ in range(3)]
    _assert_close("split", runs[0], ir.interpret(graph, arrays, dtype="float64"), TOLERANCE, "the interpreter")
    for later in runs[1:]:
        assert np.array_equal(runs[0][0], later[0]), "a split kernel's result moved between launches"
