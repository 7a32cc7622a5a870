"""Choosing real sizes for a structure found at reduced shapes: grid extents and trip counts.

Each grid axis keeps the dims it splits and the loop keeps its dims; only extents change. For
every custom op in program order the options are the extents that give power-of-two tiles (or
the tile the reduced structure had when it was a single element of a composite dim); options
that do not fit the target are dropped, and the cost model ranks the rest. A small beam keeps
the best few choices of each kernel while later kernels are sized.
"""
from __future__ import annotations

import itertools
import math

from mugraph.ir import KernelGraph
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.ops import KOp
from mugraph.search.instantiate import resize, resize_block

TILES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BEAM = 4


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _axis_options(g, srcs, axis) -> list[int]:
    """Grid extents for one axis: common splits of the dims it maps in every input."""
    dims = [src.shape[n.arg.imap[axis]] for n, src in zip(g.inputs, srcs)
            if n.arg.imap[axis] is not None]
    if g.grid[axis] == 1:
        return [1]
    if not dims:
        return [g.grid[axis]]
    common = math.gcd(*dims)
    return [e for e in _divisors(common) if e >= 2 and all(d // e in TILES or d // e >= 256
                                                         for d in dims)]


def _loop_options(g, srcs, grid) -> list[int]:
    if g.forloop == 1:
        return [1]
    extents, reduced_tiles = [], []
    for n, src in zip(g.inputs, srcs):
        f = n.arg.fmap
        if f is None:
            continue
        per_block = src.shape[f]
        for axis, d in enumerate(n.arg.imap):
            if d == f:
                per_block //= grid[axis]
        extents.append(per_block)
        reduced_tiles.append(n.shape[f])
    if not extents:
        return [g.forloop]
    common = math.gcd(*extents)
    small = set(t for t in reduced_tiles if t < 8)
    return [F for F in _divisors(common) if F >= 2 and
            all(e // F in TILES[3:] or e // F in small for e in extents)]


def block_options(g, srcs) -> list[tuple]:
    axes = [_axis_options(g, srcs, a) for a in range(3)]
    out = []
    for grid in itertools.product(*axes):
        for F in _loop_options(g, srcs, grid):
            out.append((tuple(grid), F))
    return out


def size_structure(structure: KernelGraph, inputs, constants, target, estimate, fits,
                   bound: float | None = None):
    """Sized versions of `structure` over real `inputs`, best estimate first: [(Estimate, graph)].

    With a `bound` (the best estimate so far), the structure is first sized over its QUICK most
    balanced options per kernel (tiles nearest 64), and over every option only if that comes
    within SLACK of the bound: each option costs a lowering by codegen, and most structures
    a search finds are variants far from the best.
    """
    if bound is not None:
        quick = _size(structure, inputs, constants, target, estimate, fits, QUICK)
        if not quick or quick[0][0].seconds > SLACK * bound:
            return quick
    return _size(structure, inputs, constants, target, estimate, fits, None)


QUICK = 4
SLACK = 1.1


def _size(structure, inputs, constants, target, estimate, fits, limit):
    partial = [dict()]
    for key in structure.custom_ops():
        sub = _subgraph(structure, key)
        scored = []
        for choice in partial:
            for opt in _feasible(key, structure, inputs, choice, constants, fits, limit):
                trial = choice | {key: opt}
                graph = _build(sub, inputs, trial, constants)
                if graph is not None:
                    scored.append((estimate(graph, target).seconds, len(scored), trial))
        scored.sort(key=lambda s: s[:2])
        partial = [s[2] for s in scored[:BEAM]]
        if not partial:
            return []
    results = []
    for choice in partial:
        graph = _build(structure, inputs, choice, constants)
        if graph is not None:
            results.append((estimate(graph, target), graph))
    results.sort(key=lambda r: r[0].seconds)
    return results


def _subgraph(structure: KernelGraph, key) -> KernelGraph:
    """The part of `structure` up to one custom op: its outputs, over the same inputs."""
    outs = [n for n in structure.nodes if n.op is KOp.CUSTOM and (n.arg[0], n.srcs) == key]
    return KernelGraph(outs, structure.inputs)


def _feasible(key, structure, inputs, choice, constants, fits, limit=None):
    """Options for one custom op given the sizes already chosen upstream (the `limit` most
    balanced ones, if given)."""
    bg = key[0]
    new_srcs = _sources_of(structure, inputs, choice, constants, key)
    if new_srcs is None:
        return []
    options = block_options(bg, new_srcs)
    if limit is not None:
        options = sorted(options, key=lambda o: _imbalance(bg, new_srcs, *o))[:limit]
    out = []
    for grid, F in options:
        try:
            g = resize_block(bg, new_srcs, grid, F, constants)
        except InvalidGraph:
            continue
        if fits(g):
            out.append((grid, F))
    return out


def _imbalance(g, srcs, grid, F) -> float:
    """How far the tiles an option cuts are from 64 along the dims it splits (log scale)."""
    total = 0.0
    for n, src in zip(g.inputs, srcs):
        for d, extent in enumerate(src.shape):
            parts = [grid[a] for a in range(3) if n.arg.imap[a] == d] + \
                ([F] if n.arg.fmap == d else [])
            if parts:
                total += abs(math.log2(max(1, extent // math.prod(parts))) - 6)
    return total


def _build(structure, inputs, choice, constants):
    return resize(structure, inputs, lambda key, new_srcs: choice.get(key), constants)


def _sources_of(structure, inputs, choice, constants, target_key):
    """The real-shape sources of one custom op, given the sizes chosen upstream of it."""
    found = {}

    def choose(key, new_srcs):
        if key == target_key:
            found["srcs"] = new_srcs
            return None
        return choice.get(key)

    resize(structure, inputs, choose, constants)
    return found.get("srcs")
