"""Full-shape kernels on the CPU harness, a sample of blocks at a time: every custom kernel of a graph runs the
first and last block of its grid, every corner of it (each distinct boundary case: first or last along each grid
axis) and a few blocks drawn at random -- with all the CTAs of a split loop -- on inputs the reference
interpreter computed, and their output tiles are checked against the interpreter's."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mugraph.codegen.cpu import build_cpu
from mugraph.codegen.generate import generate
from mugraph.codegen.plan import GraphPlanner
from mugraph.codegen.run_cpu import aligned_empty
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import bind_inputs, interpret


@dataclass(frozen=True)
class SampledKernel:
    """One custom kernel's sampled run: which blocks ran (block-graph coordinates) and the largest error of
    their output tiles relative to each output's scale."""

    name: str
    grid: tuple
    splits: int
    blocks: tuple
    max_error: float

    def __str__(self) -> str:
        return (f"{self.name}: {len(self.blocks)} of {int(np.prod(self.grid))} blocks (x {self.splits} CTAs), "
                f"max error {self.max_error:.1e}")


def sample_blocks(grid, picks: int = 3, seed: int = 0) -> list[tuple]:
    """The first and last block, every corner of the grid, and ``picks`` more at random (seeded), in order."""
    corners = set(itertools.product(*[sorted({0, g - 1}) for g in grid]))
    rng = np.random.default_rng(seed)
    total = int(np.prod(grid))
    extra = set()
    for linear in rng.permutation(total)[:picks + len(corners)]:
        if len(extra) == picks:
            break
        b = (int(linear) % grid[0], int(linear) // grid[0] % grid[1], int(linear) // (grid[0] * grid[1]))
        if b not in corners:
            extra.add(b)
    return sorted(corners | extra, key=lambda b: (b[2], b[1], b[0]))


def run_sampled(graph: KernelGraph, arrays, *, arch: str = "sm_90", picks: int = 3, seed: int = 0,
                schedule: str = "rr", workers: int | None = None) -> list[SampledKernel]:
    """Each custom kernel of ``graph`` on a sample of its blocks (``sample_blocks``), against the interpreter."""
    module = generate(graph, arch)
    planner = GraphPlanner(graph)
    customs, _, _ = planner.run()
    values = _reference_values(graph, bind_inputs(graph, arrays), planner)
    launches = {k.name: k for k in module.plan.kernels if k.kind == "custom"}
    cpu = build_cpu(module.source, list(launches)) if launches else None
    specs = {b.name: b for b in module.plan.buffers}
    out = []
    for ck in customs:
        launch = launches[ck.name]
        out.append(_run_one(cpu, launch, ck, specs, values, picks, seed, schedule, workers))
    return out


def _reference_values(graph: KernelGraph, arrays, planner: GraphPlanner) -> dict:
    """Every buffer's contents as the interpreter computes them (own dtypes), by buffer name."""
    values = dict(zip((planner.names[n] for n in graph.inputs), arrays))
    nodes = [n for n in planner.names if n.op.value != "input"]
    if nodes:
        for node, value in zip(nodes, interpret(KernelGraph(nodes, graph.inputs), arrays)):
            values[planner.names[node]] = value
    return values


def _run_one(cpu, launch, ck, specs, values, picks, seed, schedule, workers) -> SampledKernel:
    bg = ck.graph
    splits = launch.grid[2] // bg.grid[2]
    blocks = sample_blocks(bg.grid, picks, seed)
    buffers = {}
    for name in launch.args:
        spec = specs[name]
        buf = aligned_empty(spec.shape, spec.dtype.numpy)
        if name in values and name not in ck.outputs:
            buf[...] = np.asarray(values[name]).astype(spec.dtype.numpy)
        else:
            buf[...] = 0 if spec.zero_init else np.nan
        buffers[name] = buf
    ids = [x + bg.grid[0] * (y + bg.grid[1] * (z + bg.grid[2] * s)) for x, y, z in blocks for s in range(splits)]
    cpu.run(launch.name, [buffers[a] for a in launch.args], launch.grid, launch.block, launch.smem_bytes,
            schedule=schedule, seed=seed, workers=workers, blocks=ids)
    worst = 0.0
    for out_spec, name in zip(bg.outputs, ck.outputs):
        want = np.asarray(values[name], np.float64)
        scale = max(float(np.abs(want).max()), 1e-30)
        for b in blocks:
            region = _tile_region(out_spec, b)
            error = np.abs(buffers[name][region].astype(np.float64) - want[region]).max() / scale
            worst = max(worst, float(error) if np.isfinite(error) else float("inf"))
    return SampledKernel(ck.name, bg.grid, splits, tuple(blocks), worst)


def _tile_region(out, block) -> tuple:
    """The slices of the output tensor that block ``block`` writes (its omap)."""
    tile = out.node.shape
    region = [slice(None)] * len(tile)
    for axis, dim in enumerate(out.omap):
        if dim is not None:
            region[dim] = slice(block[axis] * tile[dim], (block[axis] + 1) * tile[dim])
    return tuple(region)
