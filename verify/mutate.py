"""Mutation testing of the verifier: valid one-change variants of a graph (schedule maps,
accumulators, operands, ops, constants), classified by an oracle that shares nothing with the
methods under test, and each method's kill rate on the ones the oracle separates.

Mutants are rebuilt through the node constructors, so the IR's own checks decide validity. The
oracle runs both graphs in float64 on its own inputs: two draws from a seed stream no method
uses, uniform rather than normal, at two scales (the workload's and a third of it). A mutant is
separated when both draws differ beyond 1e-6 of the output's scale, equivalent when both agree to
1e-9, and undecided otherwise (discarded and counted). Kill rates are then measured per method
alone — the finite-field test, float64, own precision, special values, the formal proof — and
for `check` as a whole; a method is never graded on the data that selected the mutants.
"""
from __future__ import annotations

import dataclasses
import importlib
import random
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import numpy as np

from mugraph.ir.block import BlockGraph, BlockOutput
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret
from mugraph.ir.node import BNode, KNode, toposort
from mugraph.ir.ops import BINARY, BOp, KOp, TOp, UNARY
from mugraph.verify.field import single_threaded_blas


@dataclass(frozen=True)
class Mutant:
    description: str
    graph: KernelGraph
    kind: str = ""
    gap: float | None = None   # the oracle's smaller relative difference over its two draws


@dataclass(frozen=True)
class MutantSet:
    """Valid mutants the oracle separates, and how many candidates were discarded and why."""

    mutants: tuple[Mutant, ...]
    invalid: int        # construction raised ShapeError / InvalidGraph
    equivalent: int     # the oracle says they compute the original's function
    duplicates: int     # the same graph reached by two mutations
    undecided: int = 0  # the oracle could not tell (non-finite, or only one draw differs)

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.mutants:
            counts[m.kind] = counts.get(m.kind, 0) + 1
        return counts


# ---- rebuilding ----------------------------------------------------------------------------------
def substitute(roots, mapping: Mapping) -> dict:
    """Old node -> new node for every node under `roots`, `mapping` applied, the rest rebuilt.

    A mapped node's replacement is taken as is (it may refer to the old node, e.g. f(f(x))).
    """
    done = dict(mapping)
    for node in toposort(roots):
        if node in done:
            continue
        srcs = tuple(done.get(s, s) for s in node.srcs)
        done[node] = node if srcs == node.srcs else type(node)(node.op, srcs, node.arg)
    return done


def rewrite(graph: KernelGraph, mapping: Mapping[KNode, KNode]) -> KernelGraph:
    """`graph` with nodes replaced as `mapping` says and everything downstream rebuilt."""
    done = substitute(graph.outputs, mapping)
    return KernelGraph([done[o] for o in graph.outputs], graph.inputs, graph.output_names)


def rewrite_block(bg: BlockGraph, mapping: Mapping[BNode, BNode], *, omaps=None, grid=None,
                  forloop=None) -> tuple[BlockGraph, tuple[int, ...]]:
    """A new block graph (schedule overrides optional) and the old indices of the inputs it keeps.

    Inputs that no longer reach an output are dropped and the rest renumbered.
    """
    grid, forloop = grid or bg.grid, forloop or bg.forloop
    mapping = dict(mapping)
    if (grid, forloop) != (bg.grid, bg.forloop):
        for node in bg.inputs:
            spec = mapping.get(node, node).arg
            mapping[node] = _input_node(dataclasses.replace(spec, grid=grid, forloop=forloop))
    done = substitute([o.node for o in bg.outputs], mapping)
    outs = [done[o.node] for o in bg.outputs]
    kept = sorted({n for n in toposort(outs) if n.op is BOp.INPUT}, key=lambda n: n.arg.index)
    renumber = {n: _input_node(dataclasses.replace(n.arg, index=k))
                for k, n in enumerate(kept) if n.arg.index != k}
    if renumber:
        again = substitute(outs, renumber)
        outs = [again[o] for o in outs]
    omaps = omaps or [o.omap for o in bg.outputs]
    outputs = tuple(BlockOutput(n, m, o.dtype, o.shape) for n, m, o in zip(outs, omaps, bg.outputs))
    inputs = tuple(renumber.get(n, n) for n in kept)
    return BlockGraph(grid, bg.threads, forloop, inputs, outputs), tuple(n.arg.index for n in kept)


def _input_node(spec) -> BNode:
    return BNode(BOp.INPUT, (), spec)


def replace_block(graph: KernelGraph, old: BlockGraph, new: BlockGraph, kept) -> KernelGraph:
    """`graph` with every use of block graph `old` switched to `new` (keeping inputs `kept`)."""
    mapping = {node: KNode(KOp.CUSTOM, tuple(node.srcs[i] for i in kept), (new, node.arg[1]))
               for node in graph.nodes if node.op is KOp.CUSTOM and node.arg[0] is old}
    return rewrite(graph, mapping)


# ---- node mutators (shared by both levels) -------------------------------------------------------
# Each yields (kind, description, replacement builder); builders may raise ShapeError/InvalidGraph.
Edit = tuple[str, str, Callable[[], object]]

NON_COMMUTATIVE = frozenset({TOp.SUB, TOp.DIV, TOp.POW})
UNARY_SWAP = {
    TOp.EXP: (TOp.SIGMOID, TOp.SQUARE), TOp.LOG: (TOp.SQRT,), TOp.SQUARE: (TOp.EXP,),
    TOp.SQRT: (TOp.RSQRT,), TOp.RSQRT: (TOp.SQRT, TOp.EXP), TOp.SILU: (TOp.GELU, TOp.SIGMOID),
    TOp.GELU: (TOp.SILU,), TOp.RELU: (TOp.SILU,), TOp.SIGMOID: (TOp.TANH,),
    TOp.TANH: (TOp.SIGMOID,), TOp.ERF: (TOp.TANH,), TOp.NEG: (TOp.SQUARE,), TOp.CLAMP: (TOp.RELU,),
}
BINARY_SWAP = {TOp.ADD: (TOp.SUB, TOp.MUL), TOp.SUB: (TOp.ADD,), TOp.MUL: (TOp.DIV, TOp.ADD),
               TOp.DIV: (TOp.MUL,), TOp.POW: (TOp.MUL,), TOp.MAX: (TOp.MIN, TOp.ADD),
               TOp.MIN: (TOp.MAX,)}


def _name(node) -> str:
    dims = ",".join(map(str, node.shape))
    return f"{node.op.value}[{dims}]"


def _swap_operands(node) -> Iterator[Edit]:
    if node.op in NON_COMMUTATIVE or node.op in (KOp.MATMUL, BOp.MATMUL):
        a, b = node.srcs
        yield "swap", f"swap the operands of {_name(node)}", \
            lambda: type(node)(node.op, (b, a), node.arg)


def _drop(node) -> Iterator[Edit]:
    if node.op in UNARY:
        yield "drop", f"bypass {_name(node)}", lambda: node.srcs[0]
    elif node.op in BINARY:
        for i, s in enumerate(node.srcs):
            yield "drop", f"drop operand {1 - i} of {_name(node)}", lambda s=s: s


def _duplicate(node) -> Iterator[Edit]:
    if node.op in UNARY:
        yield "duplicate", f"apply {_name(node)} twice", \
            lambda: type(node)(node.op, (node,), node.arg)
    elif node.op not in (KOp.INPUT, KOp.CONSTANT, BOp.CONSTANT, KOp.CUSTOM):
        yield "duplicate", f"add {_name(node)} to itself", lambda: type(node)(TOp.ADD, (node, node))


def _change_op(node) -> Iterator[Edit]:
    for op in UNARY_SWAP.get(node.op, ()) + BINARY_SWAP.get(node.op, ()):
        yield "wrong-op", f"{_name(node)} -> {op.value}", \
            lambda op=op: type(node)(op, node.srcs, None)


def _change_constant(node) -> Iterator[Edit]:
    if node.op in (KOp.CONSTANT, BOp.CONSTANT):
        value, shape, dtype = node.arg
        for new in (value * 2.0 if value else 0.5, value + 1.0):
            yield "constant", f"constant {value!r} -> {new!r}", \
                lambda new=new: type(node)(node.op, (), (new, shape, dtype))


def _change_dim(node) -> Iterator[Edit]:
    if node.op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        for d in range(node.srcs[0].rank):
            if d != node.arg:
                yield "reduce-dim", f"{_name(node)} over dim {d}", \
                    lambda d=d: type(node)(node.op, node.srcs, d)
    if node.op in (KOp.RMS_NORM, BOp.RMS_NORM):
        dim, eps = node.arg
        for d in range(node.rank):
            if d != dim:
                yield "reduce-dim", f"{_name(node)} over dim {d}", \
                    lambda d=d: type(node)(node.op, node.srcs, (d, eps))
        yield "constant", f"{_name(node)} eps {eps!r} -> {eps * 10 + 1e-3!r}", \
            lambda: type(node)(node.op, node.srcs, (dim, eps * 10 + 1e-3))


REDUCE_SWAP = {KOp.REDUCE_SUM: KOp.REDUCE_MAX, KOp.REDUCE_MAX: KOp.REDUCE_SUM,
               BOp.REDUCE_SUM: BOp.REDUCE_MAX, BOp.REDUCE_MAX: BOp.REDUCE_SUM}
ACCUMULATOR_SWAP = {
    BOp.ACC_SUM: (BOp.ACC_MAX, BOp.ACC_SUM_LAST),
    BOp.ACC_SUM_LAST: (BOp.ACC_MAX_LAST, BOp.ACC_RMS_LAST, BOp.ACC_SUM),
    BOp.ACC_RMS_LAST: (BOp.ACC_SUM_LAST,),
    BOp.ACC_MAX: (BOp.ACC_SUM,),
    BOp.ACC_MAX_LAST: (BOp.ACC_SUM_LAST,),
    BOp.ACC_SUM_RESCALE: (BOp.ACC_SUM, BOp.ACC_SUM_LAST_RESCALE),
    BOp.ACC_SUM_LAST_RESCALE: (BOp.ACC_SUM_LAST, BOp.ACC_SUM_RESCALE),
}


def _change_reduction(node) -> Iterator[Edit]:
    if node.op in REDUCE_SWAP:
        yield "reduce-kind", f"{_name(node)} -> {REDUCE_SWAP[node.op].value}", \
            lambda: type(node)(REDUCE_SWAP[node.op], node.srcs, node.arg)
    for op in ACCUMULATOR_SWAP.get(node.op, ()):
        two = op in (BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE)
        yield "accumulator", f"{_name(node)} -> {op.value}", \
            lambda op=op, two=two: BNode(op, node.srcs if two else node.srcs[:1])


def _shift(node) -> Iterator[Edit]:
    if node.op not in (KOp.INPUT, KOp.CONSTANT, BOp.CONSTANT, KOp.CUSTOM):
        yield "constant", f"add 0.5 to {_name(node)}", lambda: node + 0.5


def _wrong_operand(node, candidates) -> Iterator[Edit]:
    """An operand replaced by another value of its shape (one that does not depend on `node`)."""
    if node.op not in BINARY and node.op not in (KOp.MATMUL, BOp.MATMUL):
        return
    for i, src in enumerate(node.srcs):
        for other in candidates:
            if other is not src and other.shape == src.shape and \
                    other.op not in (KOp.CONSTANT, BOp.CONSTANT):
                srcs = node.srcs[:i] + (other,) + node.srcs[i + 1:]
                yield "wrong-operand", f"operand {i} of {_name(node)}: {_name(src)} -> " \
                    f"{_name(other)}", lambda srcs=srcs: type(node)(node.op, srcs, node.arg)


NODE_MUTATORS = (_swap_operands, _drop, _duplicate, _change_op, _change_constant, _change_dim,
                 _change_reduction, _shift)


def _downstream(nodes, node) -> set:
    """`node` and every node that depends on it."""
    users: dict = {}
    for n in nodes:
        for s in n.srcs:
            users.setdefault(s, []).append(n)
    seen, stack = {node}, [node]
    while stack:
        for user in users.get(stack.pop(), ()):
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


# ---- schedule mutators (block graphs) ------------------------------------------------------------
def _imap_edits(bg: BlockGraph) -> Iterator[tuple[str, str, BNode, dict]]:
    """Each grid axis (of extent > 1) of each input re-mapped: to another dim, or replicated.

    When the new dim was split by another axis the two axes exchange dims ("imap"). The IR has
    no tile offset, so an off-by-one tile is emulated: the dim moves to an axis that split
    nothing, and blocks read another block's tile ("off-by-one").
    """
    for node in bg.inputs:
        spec = node.arg
        for axis in range(3):
            for dim in (None, *range(len(spec.shape))):
                if dim == spec.imap[axis] or bg.grid[axis] == 1:
                    continue
                imap = list(spec.imap)
                if dim is not None and dim in imap:
                    imap[imap.index(dim)] = spec.imap[axis]
                imap[axis] = dim
                moved = spec.imap[axis] is None and dim in spec.imap
                desc = f"input {spec.index} imap {spec.imap} -> {tuple(imap)}"
                yield "off-by-one" if moved else "imap", desc, node, {"imap": tuple(imap)}


def _fmap_edits(bg: BlockGraph) -> Iterator[tuple[str, str, BNode, dict]]:
    """The loop walks another dim (or none), or the loop dim and a split dim trade places."""
    for node in bg.inputs:
        spec = node.arg
        for dim in (None, *range(len(spec.shape))):
            if dim != spec.fmap:
                yield "fmap", f"input {spec.index} fmap {spec.fmap} -> {dim}", node, {"fmap": dim}
        for axis, dim in enumerate(spec.imap):
            if dim is not None and spec.fmap is not None:
                imap = tuple(spec.fmap if a == axis else d for a, d in enumerate(spec.imap))
                yield "fmap", f"input {spec.index} loop dim {spec.fmap} and split dim {dim} " \
                    "trade places", node, {"imap": imap, "fmap": dim}


def _block_edits(graph: KernelGraph, bg: BlockGraph) -> Iterator[Edit]:
    """Every mutation of one custom op, as (kind, description, kernel-graph builder)."""
    def build(mapping, **schedule):
        return lambda: replace_block(graph, bg, *rewrite_block(bg, mapping, **schedule))

    for kind, desc, node, changes in (*_imap_edits(bg), *_fmap_edits(bg)):
        yield kind, desc, lambda node=node, changes=changes: replace_block(
            graph, bg, *rewrite_block(bg, {node: _input_node(dataclasses.replace(node.arg,
                                                                                 **changes))}))
    for i, out in enumerate(bg.outputs):
        for omap in _omap_variants(out.omap, bg.grid):
            omaps = [o.omap for o in bg.outputs]
            omaps[i] = omap
            yield "omap", f"output {i} omap {out.omap} -> {omap}", build({}, omaps=omaps)
    for f in (bg.forloop * 2, bg.forloop // 2):
        if f >= 1 and f != bg.forloop:
            yield "forloop", f"forloop {bg.forloop} -> {f}", build({}, forloop=f)
    nodes = bg.nodes
    for node in nodes:
        if node.op is not BOp.INPUT:
            for kind, desc, make in _node_edits(node, nodes):
                yield kind, f"{desc} (in a custom op)", \
                    lambda make=make, node=node: replace_block(
                        graph, bg, *rewrite_block(bg, {node: make()}))


def _omap_variants(omap, grid) -> Iterator[tuple]:
    rank_dims = [d for d in omap if d is not None]
    for a in range(3):
        for b in range(a + 1, 3):
            if omap[a] != omap[b] and grid[a] > 1 and grid[b] > 1:
                swapped = list(omap)
                swapped[a], swapped[b] = omap[b], omap[a]
                yield tuple(swapped)
    for a in range(3):
        if grid[a] > 1 and omap[a] is not None:
            for d in range(max(rank_dims, default=0) + 2):
                if d not in omap:
                    moved = list(omap)
                    moved[a] = d
                    yield tuple(moved)


def _node_edits(node, nodes) -> Iterator[Edit]:
    for mutator in NODE_MUTATORS:
        yield from mutator(node)
    down = _downstream(nodes, node)
    yield from _wrong_operand(node, [n for n in nodes if n not in down])


def _kernel_edits(graph: KernelGraph) -> Iterator[Edit]:
    seen_blocks = set()
    nodes = graph.nodes
    for node in nodes:
        if node.op is KOp.CUSTOM:
            if node.arg[0] not in seen_blocks:
                seen_blocks.add(node.arg[0])
                yield from _block_edits(graph, node.arg[0])
        elif node.op is not KOp.INPUT:
            for kind, desc, make in _node_edits(node, nodes):
                yield kind, desc, lambda make=make, node=node: rewrite(graph, {node: make()})


# ---- the oracle --------------------------------------------------------------------------------
SEPARATED, EQUIVALENT, UNDECIDED = "separated", "equivalent", "undecided"
SEPARATED_GAP = 1e-6          # relative to the output's scale, at both draws
EQUIVALENT_GAP = 1e-9
ORACLE_STREAM = 0x0AC1E       # a SeedSequence spawn key no verification method uses


def oracle_inputs(graph: KernelGraph, seed: int, draw: int, scale: float) -> dict:
    """The oracle's inputs: uniform on ±2·scale (a third of it at the second draw), rounded to
    each input's dtype, from a seed stream of its own."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(ORACLE_STREAM, draw)))
    size = scale * (2.0 if draw == 0 else 2.0 / 3.0)
    return {n.arg[0]: rng.uniform(-size, size, n.shape).astype(n.dtype.numpy).astype(np.float64)
            for n in graph.inputs}


def _outputs(graph: KernelGraph, inputs) -> list[np.ndarray]:
    with single_threaded_blas(), np.errstate(all="ignore"):
        return interpret(graph, inputs, dtype="float64")


def _gap(expected, got) -> float | None:
    """The largest relative difference over elements finite in both (None: none are)."""
    gaps = []
    for e, g in zip(expected, got):
        e, g = np.broadcast_arrays(np.asarray(e, np.float64), np.asarray(g, np.float64))
        finite = np.isfinite(e) & np.isfinite(g)
        if finite.any():
            scale = max(float(np.max(np.abs(e[finite]))), 1e-30)
            gaps.append(float(np.max(np.abs(e[finite] - g[finite]))) / scale)
        if (np.isfinite(e) != np.isfinite(g)).any():
            gaps.append(np.inf)
    return max(gaps) if gaps else None


class Oracle:
    """Decides a mutant against the original by float64 runs on the oracle's own inputs."""

    def __init__(self, original: KernelGraph, seed: int, scale: float):
        self.original = original
        self.draws = [oracle_inputs(original, seed, d, scale) for d in range(2)]
        self.expected = [_outputs(original, inputs) for inputs in self.draws]

    def classify(self, mutant: KernelGraph) -> tuple[str, float | None]:
        gaps = [_gap(e, _outputs(mutant, inputs)) for e, inputs in zip(self.expected, self.draws)]
        if any(g is None for g in gaps):
            return UNDECIDED, None
        if all(g > SEPARATED_GAP for g in gaps):
            return SEPARATED, min(gaps)
        if all(g <= EQUIVALENT_GAP for g in gaps):
            return EQUIVALENT, max(gaps)
        return UNDECIDED, max(gaps)


# ---- generation and classification --------------------------------------------------------------
def generate_mutants(graph: KernelGraph, *, seed: int = 0, limit: int | None = None,
                     scale: float = 1.0) -> MutantSet:
    """Valid mutants of `graph` in a seeded order, classified by the oracle; `.mutants` holds the
    separated ones (at most `limit`), the counts say what was discarded and why."""
    edits = list(_kernel_edits(graph))
    random.Random(seed).shuffle(edits)
    oracle = Oracle(graph, seed, scale)
    found, seen = [], {graph}
    counts = {"invalid": 0, EQUIVALENT: 0, UNDECIDED: 0, "duplicates": 0}
    for kind, desc, make in edits:
        if limit is not None and len(found) >= limit:
            break
        try:
            mutant = make()
        except InvalidGraph:
            counts["invalid"] += 1
            continue
        if _interface(mutant) != _interface(graph):  # check() rejects those before testing
            counts["invalid"] += 1
            continue
        if mutant in seen:
            counts["duplicates"] += 1
            continue
        seen.add(mutant)
        verdict, gap = oracle.classify(mutant)
        if verdict != SEPARATED:
            counts[verdict] += 1
            continue
        found.append(Mutant(desc, mutant, kind, gap))
    return MutantSet(tuple(found), counts["invalid"], counts[EQUIVALENT], counts["duplicates"],
                     counts[UNDECIDED])


def mutants(graph: KernelGraph, *, seed: int = 0, limit: int | None = None,
            scale: float = 1.0) -> list[Mutant]:
    """The valid mutants the oracle separates from `graph` (see `generate_mutants`)."""
    return list(generate_mutants(graph, seed=seed, limit=limit, scale=scale).mutants)


def _interface(graph: KernelGraph) -> list:
    return [(o.shape, o.dtype) for o in graph.outputs]


# ---- kill rates ------------------------------------------------------------------------------------
KILLING = {"finite field": "failed", "float64": "failed", "own precision": "failed",
           "special values": "failed", "formal": "not proved"}


@dataclass(frozen=True)
class KillRates:
    """Per method: the separated mutants it rejected alone, and the survivors' descriptions."""

    total: int
    killed: dict                # method -> count ("check" is the whole verifier)
    survivors: dict             # method -> tuple of descriptions

    def rate(self, method: str) -> float:
        return self.killed[method] / self.total if self.total else 1.0

    def line(self, method: str) -> str:
        return f"{method}: {self.killed[method]}/{self.total} ({100 * self.rate(method):.0f}%)"


def kill_rates(original: KernelGraph, found, *, seed: int = 0, scale: float = 1.0,
               formal: bool = True) -> KillRates:
    """Each method alone on every mutant (the float test runs every case, not stopping at the
    first failure), and `check`'s verdict from those same results. The formal proof "kills" a
    mutant when it does not prove it: a proof of a separated mutant would be unsound."""
    methods = list(KILLING) + ["check"]
    survivors: dict = {m: [] for m in methods}
    for m in found:
        for method, status in method_statuses(original, m.graph, seed, scale, formal).items():
            killed = status == "killed" if method == "check" else status == KILLING[method]
            if not killed:
                survivors[method].append(m.description)
    total = len(found)
    return KillRates(total, {k: total - len(v) for k, v in survivors.items()},
                     {k: tuple(v) for k, v in survivors.items()})


def method_statuses(original: KernelGraph, mutant: KernelGraph, seed: int, scale: float,
                    formal: bool) -> dict:
    """Every method's status on one mutant, each run alone, and check's verdict from them."""
    c = importlib.import_module("mugraph.verify.check")   # the module; the package exports the function
    from mugraph.verify.float_diff import float_diff
    ff, error = c._finite_field(original, mutant, None, seed, c.TARGET_BOUND, c.MAX_TESTS)
    fl = float_diff(original, mutant, seed=seed, scale=scale, stop_at_failure=False)
    proof, status = c._formal(original, mutant, None) if formal else (None, "skipped")
    methods = (c._ff_method(ff, error),) + c._float_methods(fl) + (c._formal_method(proof, status),)
    verdict, _ = c._decide(methods, False, fl)
    return {r.name: r.status for r in methods} | {"check": "survived" if verdict == c.EQUIVALENT
                                                  else "killed"}
