"""The partitioner: cut a classified flat program into regions the search handles well.

1. Schedule. The non-constant steps in a topological order that runs lifted steps whenever one
   is ready and JAX steps only when none is (so lifted steps gather into long runs), layer by
   layer where the program repeats (a stack: `search.layers`). A run is a maximal stretch of
   lifted steps between JAX steps (and layers).
2. Cut each run by dynamic programming over its order: a region is a contiguous stretch (so it
   is convex: nothing leaves it and comes back), within `Limits` (matmuls, compute ops, outputs:
   what one search fuses; see the limits' comments), and the cuts minimise the sum of the
   regions' estimated fused times: each region as one kernel that reads its inputs once and
   writes its outputs once (`cost.fused_kernel`, the library-kernel formula). A cut through a
   large tensor costs its write and its read, and each region a launch. A cut may not separate a
   value that cannot leave a kernel (a mask, an index, rank > 4).
3. Lift each region alone (`search.region.lift_region`): the same structure at the same shapes
   is the same KernelGraph, so one search serves them all; identical layers are cut alike
   (`search.layers`).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from mugraph.ir.jax_frontend import Const
from mugraph.ir.node import kernel_input
from mugraph.ir.ops import KOp
from mugraph.search.classify import (PROGRAM_OUTPUT, Classification, Kind, classify,
                                     deep_recursion)
from mugraph.search.cost import fused_kernel, kernel_node_flops
from mugraph.search.flatten import FlatProgram, Step
from mugraph.search.layers import layer_boundaries, layer_groups, period, signature
from mugraph.search.region import Region, describe_region, is_compute, lift_region, rebuilt


@dataclass(frozen=True)
class Limits:
    """What one region may hold. Measured on this machine (budget 60 s, small dims): RMSNorm ->
    matmul fused after 1 s, gated silu(x@W1)*(x@W2) after 1.3 s, SwiGLU (3 chained matmuls) after
    6 s, causal attention (2 matmuls, softmax, mask) after 15 s; RMSNorm -> Q, K, V (3 outputs)
    found nothing in 45 s. So: up to 3 matmuls, a few dozen ops, and few outputs."""

    max_matmuls: int = 3
    max_ops: int = 32              # compute ops (layout views and leaves excluded)
    max_outputs: int = 2


@dataclass(frozen=True)
class Partition:
    """A classified program, its schedule, and its regions. `items` is the run order: ("jax",
    step) for a step JAX runs, ("region", region index) for a region."""

    classification: Classification
    items: tuple
    regions: tuple
    limits: Limits

    @property
    def program(self) -> FlatProgram:
        return self.classification.program

    def jax_steps(self) -> list[Step]:
        return [s for kind, s in self.items if kind == "jax"]


def partition(program: FlatProgram, limits: Limits | None = None, target: str = "h100",
              classification: Classification | None = None) -> Partition:
    """Classify (unless given), schedule and cut `program` (see the module docstring)."""
    with deep_recursion():
        return _partition(program, limits, target, classification)


def _partition(program, limits, target, classification) -> Partition:
    limits = limits or Limits()
    c = classification or classify(program)
    while True:
        groups = layer_groups(c)
        order = schedule(c, groups)
        runs = _runs(c, order, layer_boundaries(c, order, groups))
        stuck = _stuck_across_runs(c, runs)
        if not stuck:
            break
        c = classify(program, c.forced | stuck)
    return _cut(c, order, runs, limits, target)


def schedule(c: Classification, groups: dict | None = None) -> list[Step]:
    """The non-constant steps in a topological order, layer by layer (`groups`: step index ->
    layer, from `layers.layer_groups`; a layer's steps never depend on a later one's). Within a
    layer, the order of two greedy ones that breaks the lifted steps into fewer runs: a lifted
    step whenever one is ready, else a JAX step; or a JAX step whenever one is ready (a KV-cache
    update, a mask from positions), else a lifted one (lowest program index first)."""
    groups = groups or {}
    layers = sorted({groups.get(s.index, 0) for s in c.program.steps})
    order = []
    for layer in layers:
        chosen = [s for s in c.program.steps if c.kind(s.index) is not Kind.CONST
                  and groups.get(s.index, 0) == layer]
        order += min((_schedule_layer(c, chosen, first) for first in (Kind.LIFT, Kind.JAX)),
                     key=lambda o: _lifted_runs(c, o))
    return order


def _lifted_runs(c: Classification, order: list[Step]) -> int:
    kinds = [c.kind(s.index) is Kind.LIFT for s in order]
    return sum(k and (i == 0 or not kinds[i - 1]) for i, k in enumerate(kinds))


def _schedule_layer(c: Classification, steps: list, first: Kind = Kind.LIFT) -> list[Step]:
    inside = {s.index for s in steps}
    deps = {s.index: {c.producer[v] for v in s.value_ins() if c.producer.get(v) in inside}
            for s in steps}
    users: dict = {}
    for index, found in deps.items():
        for d in found:
            users.setdefault(d, []).append(index)
    waiting = {i: len(d) for i, d in deps.items()}
    ready = {Kind.LIFT: [], Kind.JAX: []}
    for i, n in waiting.items():
        if n == 0:
            heapq.heappush(ready[c.kind(i)], i)
    order = []
    while ready[Kind.LIFT] or ready[Kind.JAX]:
        second = Kind.JAX if first is Kind.LIFT else Kind.LIFT
        i = heapq.heappop(ready[first] or ready[second])
        order.append(c.program.steps[i])
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready[c.kind(u)], u)
    return order


def _runs(c: Classification, order: list[Step], boundaries=frozenset()) -> list[list[Step]]:
    """Maximal stretches of lifted steps, also ended at each position in `boundaries`."""
    runs, current = [], []
    for k, step in enumerate(order):
        if current and (k in boundaries or c.kind(step.index) is not Kind.LIFT):
            runs.append(current)
            current = []
        if c.kind(step.index) is Kind.LIFT:
            current.append(step)
    if current:
        runs.append(current)
    return runs


def _stuck_across_runs(c: Classification, runs) -> dict:
    """Values one run makes and a later run reads that cannot leave a kernel: their producers
    must become JAX (step index -> why)."""
    run_of = {s.index: r for r, run in enumerate(runs) for s in run}
    stuck = {}
    for r, run in enumerate(runs):
        for step in run:
            for vid in step.outs:
                later = [u for u in c.consumers.get(vid, ()) if u != PROGRAM_OUTPUT
                         and run_of.get(u, r) != r]
                why = c.exportable(vid) if later else None
                if why is not None:
                    stuck[step.index] = (f"its result {c.program.value(vid).describe()} is read "
                                         f"past a JAX step and cannot leave a kernel ({why})")
    return stuck


# ---- the dynamic program ------------------------------------------------------------------------
@dataclass
class _StepCost:
    matmuls: int
    ops: int
    tc: int
    simt: int


def _step_costs(c: Classification, run) -> list[_StepCost]:
    out = []
    for step in run:
        nodes = c.built.get(step.index, ())
        flops = [kernel_node_flops(n, pad=False) for n in nodes if is_compute(n)]
        out.append(_StepCost(sum(n.op is KOp.MATMUL for n in nodes),
                             sum(is_compute(n) for n in nodes),
                             sum(f[0] for f in flops), sum(f[1] for f in flops)))
    return out


def _last_use(c: Classification, run) -> dict:
    """Per value made in the run: the position of its last reader in the run, or inf when a JAX
    step, a later run or the caller reads it."""
    pos = {s.index: p for p, s in enumerate(run)}
    last = {}
    for step in run:
        for vid in step.outs:
            users = c.consumers.get(vid, ())
            outside = any(u == PROGRAM_OUTPUT or u not in pos for u in users)
            last[vid] = math.inf if outside else max((pos[u] for u in users), default=-1)
    return last


def _cut_points(c: Classification, run, last: dict) -> list[bool]:
    """cut_ok[k]: a region boundary may fall before run[k] (every value crossing it can leave a
    kernel)."""
    ok = [True] * (len(run) + 1)
    live: dict = {}
    for k, step in enumerate(run):
        if k:
            ok[k] = all(c.exportable(v) is None or isinstance(c.lifted.get(v), Const)
                        for v in live)
        for vid in step.outs:
            if last[vid] > k:
                live[vid] = last[vid]
        live = {v: p for v, p in live.items() if p > k}
    return ok


def _cut(c: Classification, order, runs, limits: Limits, target: str) -> Partition:
    memo: dict = {}     # identical runs (every layer of a stack) are cut once
    pieces = []
    for run in runs:
        key = _run_key(c, run)
        if key not in memo:
            memo[key] = _best_cuts(c, run, limits, target)
        pieces += [(run[lo:hi], seconds) for lo, hi, seconds in memo[key]]
    return _assemble(c, order, pieces, limits)


def _run_key(c: Classification, run) -> tuple:
    """What the dynamic program reads of a run: each step's signature, where its operands come
    from (a step of the run, by offset; a constant the region rebuilds; elsewhere) and whether
    each result is read after the run."""
    pos = {s.index: k for k, s in enumerate(run)}
    last = _last_use(c, run)

    def source(vid):
        made = c.producer.get(vid)
        if made in pos:
            return pos[made]
        return "free" if rebuilt(c, vid) else "in"

    return tuple((signature(s), tuple(source(v) for v in s.value_ins()),
                  tuple(math.isinf(last[o]) for o in s.outs)) for s in run)


def _assemble(c: Classification, order, pieces, limits: Limits) -> Partition:
    """The partition whose regions are `pieces` ([(steps, estimated seconds)] in run order)."""
    regions, first_step = [], {}
    for steps, seconds in pieces:
        region = lift_region(c, steps, len(regions), seconds)
        first_step[steps[0].index] = region.index
        regions.append(region)
    in_region = {s.index for r in regions for s in r.steps}
    items = []
    for step in order:
        if step.index in first_step:
            items.append(("region", first_step[step.index]))
        elif step.index not in in_region:
            items.append(("jax", step))
    return Partition(c, tuple(items), tuple(regions), limits)


def refine(p: Partition, split: dict, target: str = "h100") -> Partition:
    """`p` with each region in `split` (region index -> tighter Limits) cut again by the same
    dynamic program; a region the tighter limits admit no cutting of stays whole."""
    pieces = []
    for r in p.regions:
        cuts = _best_cuts(p.classification, list(r.steps), split[r.index], target,
                          whole_if_none=True) if r.index in split else None
        pieces += [(r.steps[lo:hi], s) for lo, hi, s in cuts] if cuts else [(r.steps,
                                                                              r.estimate_s)]
    order = [s for kind, x in p.items for s in (p.regions[x].steps if kind == "region" else [x])]
    return _assemble(p.classification, order, pieces, p.limits)


def tighter(region: Region, limits: Limits) -> Limits | None:
    """Limits that force `region` apart (one matmul fewer, half the ops), or None when it is as
    small as a region gets (one matmul or none, a handful of ops)."""
    if region.matmuls <= 1 and region.ops < 8 or len(region.steps) < 2:
        return None
    return Limits(max_matmuls=max(1, region.matmuls - 1), max_ops=max(4, region.ops // 2),
                  max_outputs=limits.max_outputs)


def _best_cuts(c: Classification, run, limits: Limits, target: str,
               whole_if_none: bool = False) -> list[tuple]:
    """[(lo, hi, estimated seconds)] of the cheapest cutting of `run` within `limits`. A run that
    repeats one stretch of steps (a stack of identical layers) is cut in that stretch and the cuts
    repeated, so every layer has the same regions (searched once). Where the limits admit no
    cutting: one step per region, or [] with `whole_if_none`."""
    data = _RunData(c, run, limits, target)
    repeat = period(run)
    if repeat < len(run):
        cuts = _dp(data, repeat)
        if cuts is not None:
            repeated = [(lo + k, hi + k, s) for k in range(0, len(run), repeat)
                        for lo, hi, s in cuts]
            if all(data.ok[lo] and data.ok[hi] for lo, hi, _ in repeated):
                return repeated
    cuts = _dp(data, len(run))
    if cuts is None:     # nothing fits the limits at the allowed cuts
        return [] if whole_if_none else [(k, k + 1, 0.0) for k in range(len(run))]
    return cuts


class _RunData:
    """What the dynamic program reads about one run."""

    def __init__(self, c: Classification, run, limits: Limits, target: str):
        self.c, self.run, self.limits, self.target = c, run, limits, target
        self.costs, self.last = _step_costs(c, run), _last_use(c, run)
        self.ok = _cut_points(c, run, self.last)
        self.reads = _reads(c)


def _dp(d: _RunData, end: int) -> list[tuple] | None:
    """The cheapest cutting of run[:end] (None when the limits admit none)."""
    best, back = [0.0] + [math.inf] * end, [None] * (end + 1)
    for j in range(1, end + 1):
        if not d.ok[j]:
            continue
        for i, seconds in _stretches_ending_at(d.c, d.run, d.costs, d.last, j, d.limits,
                                               d.target, d.reads):
            if d.ok[i] and best[i] + seconds < best[j]:
                best[j], back[j] = best[i] + seconds, (i, seconds)
    if best[end] == math.inf:
        return None
    cuts, j = [], end
    while j:
        i, seconds = back[j]
        cuts.append((i, j, seconds))
        j = i
    return cuts[::-1]


def _reads(c: Classification):
    """A kernel_input node per value id (the cost model reads bytes off nodes)."""
    made = {}

    def node(vid):
        if vid not in made:
            v = c.program.value(vid)
            made[vid] = kernel_input(f"v{vid}", _as_ir_shape(v.shape), _ir_dtype_name(v.dtype))
        return made[vid]
    return node


def _as_ir_shape(shape) -> tuple[int, ...]:
    """`shape` as a kernel graph holds it, for the cost model (which reads only its bytes): 0-d as
    [1], and rank above the IR's MAX_RANK with its leading dims merged (a GQA repeat's 5-d
    broadcast is a view, never a buffer of that rank)."""
    from mugraph.ir.shapes import MAX_RANK
    shape = tuple(shape) or (1,)
    if len(shape) > MAX_RANK:
        shape = (math.prod(shape[:len(shape) - MAX_RANK + 1]),) + shape[len(shape) - MAX_RANK + 1:]
    return shape


def _ir_dtype_name(dtype) -> str:
    return dtype.name if dtype.name in ("float16", "bfloat16", "float32") else "float32"


def _stretches_ending_at(c, run, costs, last, j, limits: Limits, target: str, reads):
    """(i, estimated fused seconds) for each stretch run[i:j] within the limits, growing it
    backwards from j. One step is a stretch whatever its size (an einsum over heads and head dim
    lowers to several matmuls): it cannot be cut further, and refusing it would leave the whole
    run without a cutting."""
    matmuls = ops = tc = simt = 0
    inputs: dict = {}
    outputs: set = set()
    made: set = set()
    for i in range(j - 1, -1, -1):
        step, cost = run[i], costs[i]
        matmuls, ops = matmuls + cost.matmuls, ops + cost.ops
        if (matmuls > limits.max_matmuls or ops > limits.max_ops) and i < j - 1:
            return
        tc, simt = tc + cost.tc, simt + cost.simt
        made.update(step.outs)
        for vid in step.outs:
            inputs.pop(vid, None)
            if last[vid] >= j and not isinstance(c.lifted.get(vid), Const):
                outputs.add(vid)
        for vid in step.value_ins():
            if vid not in made and not rebuilt(c, vid):
                inputs[vid] = True
        if len(outputs) > limits.max_outputs:
            continue
        write = sum(c.program.value(v).nbytes for v in outputs)
        k = fused_kernel("region", [reads(v) for v in inputs], write, tc, simt, target)
        yield i, k.seconds


__all__ = ["Limits", "Partition", "Region", "describe_region", "lift_region", "partition",
           "refine", "schedule", "tighter"]
