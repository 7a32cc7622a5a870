"""Choosing real sizes for a structure found at reduced shapes: grid extents and trip counts.

Each grid axis keeps the dims it splits and the loop keeps its dims; only extents change. For
every custom op in program order the options are the extents that give power-of-two tiles (or
the tile the reduced structure had when it was a single element of a composite dim); options
that do not fit the target are dropped, and the cost model ranks the rest. A small beam keeps
the best few choices of each kernel while later kernels are sized; options whose cost floor
(`cost.estimate_floor`, no lowering) is above the beam's worst estimate are never lowered.
"""
from __future__ import annotations

import itertools
import math

from mugraph.ir import KernelGraph
from mugraph.ir.ops import KOp
from mugraph.search.instantiate import resize

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


def size_structure(structure: KernelGraph, inputs, constants, target, estimate, fits, floor=None):
    """Sized versions of `structure` over real `inputs`, best estimate first: [(Estimate, graph)].

    `floor(graph, target)`, when given, is a lower bound on `estimate(graph, target).seconds` that is cheap
    next to `fits` and `estimate` (which lower every kernel): options are then weighed cheapest floor first,
    and those whose floor is above the beam's worst estimate are never checked or estimated. The beam is the
    one weighing every option gives."""
    partial = [dict()]
    for key in structure.custom_ops():
        trials = _trials(key, structure, inputs, partial, constants)
        partial = [trial for _, _, trial in _beam(trials, target, estimate, fits, floor)]
        if not partial:
            return []
    results = []
    for choice in partial:
        graph = _build(structure, inputs, choice, constants)
        if graph is not None:
            results.append((estimate(graph, target), graph))
    results.sort(key=lambda r: r[0].seconds)
    return results


def _trials(key, structure, inputs, partial, constants) -> list[tuple]:
    """(sizes, the sub-graph up to this custom op built with them) for every option of every choice so far."""
    sub = _subgraph(structure, key)
    out = []
    for choice in partial:
        srcs = _sources_of(structure, inputs, choice, constants, key)
        for opt in block_options(key[0], srcs) if srcs is not None else ():
            trial = choice | {key: opt}
            graph = _build(sub, inputs, trial, constants)
            if graph is not None:
                out.append((trial, graph))
    return out


def _beam(trials, target, estimate, fits, floor) -> list[tuple]:
    """The BEAM best trials that fit, as (seconds, index, trial), ranked by estimate then enumeration order."""
    bounds = [floor(graph, target) for _, graph in trials] if floor else [0.0] * len(trials)
    kept: list[tuple] = []
    for i in sorted(range(len(trials)), key=lambda i: bounds[i]):
        if floor and len(kept) >= BEAM and bounds[i] > kept[BEAM - 1][0]:
            break  # this floor and every later one are above the beam's worst: none can enter it
        trial, graph = trials[i]
        if fits(graph.outputs[0].arg[0]):  # the sub-graph's outputs are this custom op's
            kept.append((estimate(graph, target).seconds, i, trial))
            kept.sort(key=lambda s: s[:2])
    return kept[:BEAM]


def _subgraph(structure: KernelGraph, key) -> KernelGraph:
    """The part of `structure` up to one custom op: its outputs, over the same inputs."""
    outs = [n for n in structure.nodes if n.op is KOp.CUSTOM and (n.arg[0], n.srcs) == key]
    return KernelGraph(outs, structure.inputs)


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
