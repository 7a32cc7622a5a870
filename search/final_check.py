"""The winner's check at the real shapes, bounded in time and memory by sampling output blocks.

Where one evaluation of the spec costs at most `WORK_CAP` multiply-adds, the whole output is
checked. Otherwise the check runs on sampled output blocks: parallel indices (those that reach
an output) are cut to a prefix, reduced indices stay whole, and the spec and the winner are
rebuilt over the cut inputs. The winner keeps its block programs and trip counts; along a
grid-split dim it keeps its tiles (the grid shrinks: a prefix of whole tiles is checked), and
along a dim its tiles hold whole the tile shrinks with the cut. Either way every checked output
element is computed by the same ops from the same reduced extents as in the real kernel. The
bound is the one stated for the sampled program, and the report names what was sampled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mugraph.ir import KernelGraph, memory
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.search.instantiate import reinstantiate_spec, resize
from mugraph.search.labels import analyze
from mugraph.search.leaves import index_inputs, restore

WORK_CAP = 48_000_000   # the check of one sample costs about 2 s on one core at this work

# Ops whose value at an index depends only on the values at that index along the parallel
# dims: cutting those dims cuts the result the same way. Elementwise ops are all such.
# An IOTA (an index tensor) is cut like an input: the sample is a prefix, so the indices it holds
# are the real ones.
_POSITIONLESS = frozenset({KOp.INPUT, KOp.CONSTANT, KOp.IOTA, KOp.MATMUL, KOp.REDUCE_SUM,
                           KOp.REDUCE_MAX, KOp.RMS_NORM, KOp.TRANSPOSE, KOp.BROADCAST, KOp.CUSTOM})


@dataclass(frozen=True)
class CheckPlan:
    """What the final check runs on: the spec and candidate as given, or a sampled pair."""

    spec: KernelGraph
    candidate: KernelGraph
    sampled: str | None            # None: the whole output; else what was sampled


ELEMENTWISE_WEIGHT = 8   # an elementwise op costs the check about 8 multiply-adds per element
# (the finite-field test hashes opaque ops, the float test runs several special-value cases)
STEP_WORK = 15_000         # one block op of one loop iteration, run by the interpreter (all
# blocks at once), costs about this much whatever the tile: Python's overhead per step


def work(graph: KernelGraph) -> int:
    """The check's cost of one evaluation of `graph`, in multiply-adds (matmuls, sums) with
    elementwise ops weighted by ELEMENTWISE_WEIGHT."""
    return sum(_node_work(n) for n in graph.nodes)


def _node_work(node) -> int:
    size = math.prod(node.shape)
    if node.op is KOp.MATMUL or node.op is BOp.MATMUL:
        return size * node.srcs[0].shape[-1]
    if node.op is KOp.CUSTOM:
        bg = node.arg[0]
        ops = [n for n in bg.nodes if n.op is not BOp.INPUT]
        per_block = sum(_node_work(n) for n in ops)
        total = bg.forloop * (bg.num_blocks * per_block + STEP_WORK * len(ops))
        return total // max(1, len(bg.outputs))
    if node.op in (KOp.INPUT, KOp.CONSTANT, KOp.IOTA, BOp.CONSTANT):
        return size
    if node.srcs and math.prod(node.srcs[0].shape) > size:      # a reduction
        return math.prod(node.srcs[0].shape)
    return size * ELEMENTWISE_WEIGHT


def plan(spec: KernelGraph, candidate: KernelGraph, cap: int = WORK_CAP) -> CheckPlan:
    """The whole pair when it is cheap or cannot be sampled, else the largest sample (halving
    the longest parallel index first, then reduced ones) whose check costs at most `cap` and
    fits the memory limit (`ir.memory`). A ResourceError when no such sample exists and the
    whole pair does not fit the memory limit: the candidate cannot be checked here."""
    too_big = lambda pair: _pair_work(*pair) > cap or not memory.fits(check_bytes(*pair))  # noqa: E731
    if not too_big((spec, candidate)) or not _sampleable(spec):
        return _fitting(CheckPlan(spec, candidate, None))
    indexed, leaves = index_inputs(spec)
    with_inputs = _iotas_as_inputs(candidate, leaves, indexed)
    analysis = analyze(indexed)
    extents = {lab: lab.extent for lab in analysis.labels}
    pair = None
    for labels in (analysis.parallel - analysis.reduced, _loop_cuttable(analysis, spec, candidate)):
        while pair is None or too_big(pair):
            step = _halve_one(indexed, with_inputs, analysis, extents, labels)
            if step is None:
                break
            extents, pair = step
    if pair is None:
        return _fitting(CheckPlan(spec, candidate, None))
    small_spec, small_cand = (restore(g, leaves, _real_inputs(pair[0], spec)) for g in pair)
    cut_loops = {lab: extents[lab] for lab in analysis.reduced if extents[lab] != lab.extent}
    return _fitting(CheckPlan(small_spec, small_cand, _describe(spec, small_spec, cut_loops)))


FIELD_BYTES, FLOAT_BYTES = 16, 8    # per element: a field value with its exponent; a float64


def check_bytes(spec: KernelGraph, candidate: KernelGraph) -> int:
    """Host memory `verify.check` takes on the pair: the larger of its finite-field test and its
    float test (the spec twice, as float64 reference and in its own dtypes, and the candidate)."""
    return max(memory.evaluation_bytes([spec, candidate], FIELD_BYTES),
               memory.evaluation_bytes([spec, spec, candidate], FLOAT_BYTES))


def _fitting(checked: CheckPlan) -> CheckPlan:
    what = "the check at the real shapes" if checked.sampled is None else \
        "the check of the smallest sample of output blocks"
    memory.require(check_bytes(checked.spec, checked.candidate),
                   f"{what} of {memory.describe(checked.spec)}",
                   "superoptimize a smaller instance of the program (its structure re-sizes to "
                   "these shapes)")
    return checked


_IMPLICIT_MEANS = frozenset({KOp.RMS_NORM, BOp.RMS_NORM, BOp.ACC_RMS_LAST})


def _loop_cuttable(analysis, spec: KernelGraph, candidate: KernelGraph) -> frozenset:
    """Reduced indices that may be cut when one tile per parallel dim still costs too much:
    the winner then runs fewer iterations of the same loop. Not where an op divides by the
    extent implicitly (rms norms): the spec and the winner would then mean different things."""
    ops = {n.op for n in spec.nodes} | {n.op for bg, _ in candidate.custom_ops() for n in bg.nodes}
    if ops & _IMPLICIT_MEANS:
        return frozenset()
    return frozenset(analysis.reduced - analysis.parallel)


def _iotas_as_inputs(candidate: KernelGraph, leaves: dict, indexed: KernelGraph) -> KernelGraph:
    """The candidate over the indexed spec's inputs: each IOTA leaf read as its `%iota` input."""
    if not leaves:
        return candidate
    inputs = {n.arg[0]: n for n in indexed.inputs}
    mapping = {iota: inputs[name] for name, iota in leaves.items()}
    for node in candidate.nodes:
        if node not in mapping:
            srcs = tuple(mapping.get(s, s) for s in node.srcs)
            mapping[node] = node if srcs == node.srcs else node.replace(srcs=srcs)
    return KernelGraph([mapping[o] for o in candidate.outputs], list(indexed.inputs),
                       candidate.output_names)


def _real_inputs(small: KernelGraph, spec: KernelGraph) -> list:
    """The cut graph's inputs that are the spec's own (not `%iota` stand-ins), in spec order."""
    names = set(spec.input_names)
    return [n for n in small.inputs if n.arg[0] in names]


def _pair_work(spec: KernelGraph, candidate: KernelGraph) -> int:
    return work(spec) + work(candidate)


def _sampleable(spec: KernelGraph) -> bool:
    return all(n.op in _POSITIONLESS or isinstance(n.op, TOp) for n in spec.nodes)


def _halve_one(spec, candidate, analysis, extents, labels):
    """Halve the longest of `labels` the winner's tiles allow: (extents, (spec, candidate)).

    Parallel indices come first; one that is also reduced somewhere (the columns of a row
    softmax) is read whole by every output element and is not among them."""
    for lab in sorted(labels, key=lambda lab: (-extents[lab], lab.uid)):
        if extents[lab] % 2:
            continue
        trial = dict(extents)
        trial[lab] = extents[lab] // 2
        pair = _cut(spec, candidate, analysis, trial)
        if pair is not None:
            return trial, pair
    return None


def _cut(spec, candidate, analysis, extents):
    from mugraph.verify import interface_mismatch
    small = reinstantiate_spec(spec, analysis, extents)
    cut = resize(candidate, list(small.inputs), _same_tiles, {})
    if cut is None or interface_mismatch(small, cut) is not None:
        return None
    return small, cut


def _same_tiles(key, new_srcs):
    """(grid, forloop) that keep a block graph's tiles over cut sources, or None."""
    bg, old_srcs = key
    grid = []
    for axis in range(3):
        ratios = {_ratio(old_srcs[n.arg.index].shape[d], new_srcs[n.arg.index].shape[d])
                  for n in bg.inputs if (d := n.arg.imap[axis]) is not None}
        extent = _scaled(bg.grid[axis], ratios)
        if extent is None:
            return None
        grid.append(extent)
    loops = set()
    for n in bg.inputs:
        f = n.arg.fmap
        if f is None:
            continue
        old = old_srcs[n.arg.index].shape[f] // _split(bg.grid, n.arg.imap, f)
        new = new_srcs[n.arg.index].shape[f] // _split(grid, n.arg.imap, f)
        loops.add(_ratio(old, new))
    forloop = _scaled(bg.forloop, loops)
    return None if forloop is None else (tuple(grid), forloop)


def _ratio(old: int, new: int):
    from fractions import Fraction
    return Fraction(new, old)


def _scaled(value: int, ratios: set):
    """`value` times the one ratio in `ratios` (unchanged when empty), if a whole number >= 1."""
    if not ratios:
        return value
    if len(ratios) > 1:
        return None
    scaled = value * ratios.pop()
    return int(scaled) if scaled.denominator == 1 and scaled >= 1 else None


def _split(grid, imap, dim: int) -> int:
    n = 1
    for axis, d in enumerate(imap):
        if d == dim:
            n *= grid[axis]
    return n


def _describe(spec: KernelGraph, small: KernelGraph, cut_loops: dict) -> str:
    parts = [f"{name} {_shape(s.shape)} of {_shape(r.shape)}"
             for name, s, r in zip(spec.output_names, small.outputs, spec.outputs)]
    loops = ", ".join(f"{lab!r} {n} of {lab.extent}" for lab, n in sorted(
        cut_loops.items(), key=lambda kv: kv[0].uid))
    reduced = (f"reduced dims cut too, the loops running fewer trips: {loops}" if loops
               else "reduced dims whole")
    return (f"sampled output blocks: {', '.join(parts)} (leading blocks along each parallel "
            f"dim; {reduced}; the bound holds for the sampled program)")


def _shape(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"
