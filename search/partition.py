"""The partitioner: cut a classified flat program into regions the search handles well.

1. Schedule. The non-constant steps in a topological order that runs lifted steps whenever one
   is ready and JAX steps only when none is (so lifted steps gather into long runs). A run is a
   maximal stretch of lifted steps between JAX steps.
2. Cut each run by dynamic programming over its order: a region is a contiguous stretch (so it
   is convex: nothing leaves it and comes back), within `Limits` (matmuls, compute ops, outputs:
   what one search fuses; see the limits' comments), and the cuts minimise the sum of the
   regions' estimated fused times: each region as one kernel that reads its inputs once and
   writes its outputs once (`cost.fused_kernel`, the library-kernel formula). A cut through a
   large tensor costs its write and its read, and each region a launch. A cut may not separate a
   value that cannot leave a kernel (a mask, an index, rank > 4).
3. Lift each region alone (`lift_region`): values from outside enter as inputs named in0, in1,
   ... in first-use order and its results leave as out0, out1, ...: the same structure at the
   same shapes (every layer of a model) is the same KernelGraph, so one search serves them all.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
from dataclasses import dataclass

from jax.extend.core import Literal

from mugraph.ir.errors import MugraphError, UnsupportedOp
from mugraph.ir.graph import KernelGraph
from mugraph.ir.jax_frontend import (Const, Opaque, boundary_view, exported_node, lift_eqn,
                                     literal_value)
from mugraph.ir.node import kernel_input, toposort
from mugraph.ir.ops import KERNEL_LAYOUT, KERNEL_LEAF, KOp
from mugraph.search.classify import PROGRAM_OUTPUT, Classification, Kind, classify
from mugraph.search.cost import fused_kernel, kernel_node_flops
from mugraph.search.flatten import FlatProgram, Step


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
class Region:
    """A stretch of lifted steps searched as one program."""

    index: int
    steps: tuple                   # Step, in schedule order
    inputs: tuple                  # value ids entering, in the spec's input order (in0, in1, ...)
    outputs: tuple                 # value ids leaving, in the spec's output order (out0, ...)
    free_outputs: tuple            # (value id, number): results that are one constant (JAX fills)
    spec: KernelGraph | None       # None: nothing to compute (layout only), or it did not lift
    note: str = ""                 # why there is no spec
    estimate_s: float = 0.0        # the partitioner's fused estimate
    lifted: bool = True            # False: the steps do not lift as one region (see `note`)

    @property
    def matmuls(self) -> int:
        return 0 if self.spec is None else sum(n.op is KOp.MATMUL for n in self.spec.nodes)

    @property
    def ops(self) -> int:
        return 0 if self.spec is None else sum(_is_compute(n) for n in self.spec.nodes)


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
    limits = limits or Limits()
    c = classification or classify(program)
    while True:
        order = schedule(c)
        runs = _runs(c, order, _layer_boundaries(c, order))
        stuck = _stuck_across_runs(c, runs)
        if not stuck:
            break
        c = classify(program, c.forced | stuck)
    return _cut(c, order, runs, limits, target)


def schedule(c: Classification) -> list[Step]:
    """The non-constant steps, lifted ones first whenever one is ready (program order within
    each kind)."""
    steps = [s for s in c.program.steps if c.kind(s.index) is not Kind.CONST]
    deps = {s.index: {c.producer[v] for v in s.value_ins() if v in c.producer
                      and c.kind(c.producer[v]) is not Kind.CONST} for s in steps}
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
        kind = Kind.LIFT if ready[Kind.LIFT] else Kind.JAX
        i = heapq.heappop(ready[kind])
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


# ---- identical layers -----------------------------------------------------------------------------
MIN_LAYER_STEPS = 4          # a repeated stretch shorter than this is not taken for a layer


def _layer_boundaries(c: Classification, order: list[Step]) -> frozenset:
    """Where the schedule repeats one stretch of steps (a stack of identical layers, JAX steps
    included), the positions where each repetition starts: runs end there, so every layer is
    cut alike, whatever its neighbours (a layer's last region never merges with the next
    layer's first). The repeated stretch must cover at least half the schedule; a position
    where a value that cannot leave a kernel crosses is left out."""
    found = _repetition(np.array(_codes(order)))
    if found is None:
        return frozenset()
    start, period, count = found
    return frozenset(start + k * period for k in range(1, count + 1)) - _uncuttable(c, order)


def _codes(order) -> list[int]:
    codes: dict = {}
    return [codes.setdefault(_signature(s), len(codes)) for s in order]


def _repetition(codes: np.ndarray):
    """(start, period, count) of the stretch of `count` >= 2 repetitions of one period covering
    the most of `codes` (at least half of it), or None."""
    n, best = len(codes), None
    for period in range(MIN_LAYER_STEPS, n // 2 + 1):
        same = codes[:-period] == codes[period:]
        run, start, longest = 0, 0, (0, 0)
        for i, ok in enumerate(same):
            run = run + 1 if ok else 0
            if run > longest[0]:
                longest = (run, i - run + 1)
        count = (longest[0] + period) // period
        if count >= 2 and 2 * count * period >= n and \
                (best is None or count * period > best[1] * best[2]):
            best = (longest[1], period, count)
    return best


def _uncuttable(c: Classification, order) -> set:
    """Positions a value that cannot leave a kernel crosses (from its maker to its last use)."""
    pos = {s.index: k for k, s in enumerate(order)}
    bad: set = set()
    for s in order:
        if c.kind(s.index) is not Kind.LIFT:
            continue
        for vid in s.outs:
            users = [pos[u] for u in c.consumers.get(vid, ()) if u in pos]
            if users and c.exportable(vid) is not None:
                bad.update(range(pos[s.index] + 1, max(users) + 1))
    return bad


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
def _is_compute(node) -> bool:
    return node.op not in KERNEL_LAYOUT and node.op not in KERNEL_LEAF


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
        flops = [kernel_node_flops(n, pad=False) for n in nodes if _is_compute(n)]
        out.append(_StepCost(sum(n.op is KOp.MATMUL for n in nodes),
                             sum(_is_compute(n) for n in nodes),
                             sum(f[0] for f in flops), sum(f[1] for f in flops)))
    return out


def _free(c: Classification, vid) -> bool:
    """A constant the region rebuilds itself (uniform, or an index expression)."""
    return c.is_const(vid) and not isinstance(c.lifted.get(vid), Opaque)


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
        return "free" if _free(c, vid) else "in"

    return tuple((_signature(s), tuple(source(v) for v in s.value_ins()),
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
    period = _period(run)
    if period < len(run):
        cuts = _dp(data, period)
        if cuts is not None:
            repeated = [(lo + k, hi + k, s) for k in range(0, len(run), period)
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


def _period(run) -> int:
    """The shortest p that divides len(run) with step k like step k + p for every k (primitive,
    operand and result types, parameters), or len(run)."""
    sigs = [_signature(s) for s in run]
    m = len(sigs)
    for p in range(1, m // 2 + 1):
        if m % p == 0 and all(sigs[k] == sigs[k % p] for k in range(p, m)):
            return p
    return m


def _signature(step: Step) -> tuple:
    eqn = step.eqn
    avals = tuple(str(v.aval) for v in (*eqn.invars, *eqn.outvars))
    literals = tuple(repr(x.val) for x in step.ins if isinstance(x, Literal))
    return eqn.primitive.name, avals, literals, repr(sorted(eqn.params.items()))


def _reads(c: Classification):
    """A kernel_input node per value id (the cost model reads bytes off nodes)."""
    made = {}

    def node(vid):
        if vid not in made:
            v = c.program.value(vid)
            made[vid] = kernel_input(f"v{vid}", v.shape or (1,), _ir_dtype_name(v.dtype))
        return made[vid]
    return node


def _ir_dtype_name(dtype) -> str:
    return dtype.name if dtype.name in ("float16", "bfloat16", "float32") else "float32"


def _stretches_ending_at(c, run, costs, last, j, limits: Limits, target: str, reads):
    """(i, estimated fused seconds) for each stretch run[i:j] within the limits, growing it
    backwards from j."""
    matmuls = ops = tc = simt = 0
    inputs: dict = {}
    outputs: set = set()
    made: set = set()
    for i in range(j - 1, -1, -1):
        step, cost = run[i], costs[i]
        matmuls, ops = matmuls + cost.matmuls, ops + cost.ops
        if matmuls > limits.max_matmuls or ops > limits.max_ops:
            return
        tc, simt = tc + cost.tc, simt + cost.simt
        made.update(step.outs)
        for vid in step.outs:
            inputs.pop(vid, None)
            if last[vid] >= j and not isinstance(c.lifted.get(vid), Const):
                outputs.add(vid)
        for vid in step.value_ins():
            if vid not in made and not _free(c, vid):
                inputs[vid] = True
        if len(outputs) > limits.max_outputs:
            continue
        write = sum(c.program.value(v).nbytes for v in outputs)
        k = fused_kernel("region", [reads(v) for v in inputs], write, tc, simt, target)
        yield i, k.seconds


# ---- one region as a KernelGraph ------------------------------------------------------------------
def lift_region(c: Classification, steps, index: int = 0, seconds: float = 0.0) -> Region:
    """The region of `steps` with its spec (canonical names: in0.., out0..)."""
    inside = {s.index for s in steps}
    env, inputs = {}, []
    try:
        for step in steps:
            args = [_region_arg(c, x, env, inputs) for x in step.ins]
            env.update(zip(step.outs, lift_eqn(step.eqn, args)))
    except (UnsupportedOp, MugraphError) as e:
        return _unlifted(steps, index, inputs, f"the region does not lift alone: "
                                                f"{e.message.splitlines()[0]}")
    leaving = [v for s in steps for v in s.outs
               if any(u == PROGRAM_OUTPUT or u not in inside for u in c.consumers.get(v, ()))]
    outputs = [v for v in leaving if not isinstance(env[v], Const)]
    free = tuple((v, env[v].value) for v in leaving if isinstance(env[v], Const))
    try:
        nodes = [exported_node(env[v], c.program.value(v).shape, c.program.value(v).dtype)
                 for v in outputs]
    except MugraphError as e:
        return _unlifted(steps, index, inputs, f"a result cannot leave the region: "
                                                f"{e.message.splitlines()[0]}")
    if not nodes or not any(_is_compute(n) for n in _nodes_of(nodes)):
        return Region(index, tuple(steps), tuple(v for v, _ in inputs), tuple(outputs), free,
                      None, "nothing to compute (layout changes only)", seconds)
    spec = KernelGraph(nodes, inputs=[n for _, n in inputs])
    return Region(index, tuple(steps), tuple(v for v, _ in inputs), tuple(outputs), free, spec,
                  "", seconds)


def _nodes_of(nodes):
    return toposort(nodes)


def _unlifted(steps, index, inputs, note: str) -> Region:
    return Region(index, tuple(steps), tuple(v for v, _ in inputs), (), (), None, note,
                  lifted=False)


def _region_arg(c: Classification, x, env: dict, inputs: list):
    """A step operand inside a region: a literal, a value made in the region, a constant the
    region rebuilds, or a new input."""
    if isinstance(x, Literal):
        return literal_value(x)
    if x in env:
        return env[x]
    if _free(c, x):
        return c.lifted[x]
    v = c.program.value(x)
    view = boundary_view(f"in{len(inputs)}", v.shape, v.dtype)
    if view is None:
        raise UnsupportedOp(f"{v.describe()} cannot enter a kernel", primitive="input")
    env[x] = view
    inputs.append((x, view.node))
    return view


def describe_region(p: Partition, region: Region) -> str:
    """One line: the steps' primitives and where they come from."""
    prims = [s.primitive for s in region.steps if s.primitive not in _QUIET]
    counts: dict = {}
    for name in prims:
        counts[name] = counts.get(name, 0) + 1
    shown = ", ".join(f"{n} x{k}" if k > 1 else n for n, k in counts.items())
    return shown or "layout only"


_QUIET = frozenset({"broadcast_in_dim", "reshape", "squeeze", "transpose", "convert_element_type",
                    "stop_gradient", "copy", "copy_p"})

