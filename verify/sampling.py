"""Sampled finite-field tests at full shapes: each test compares a fresh random sample of output
blocks and computes only what those blocks depend on — kernel ops on the rows and columns they
need, custom kernels on the thread blocks that write them, inputs drawn per element by a keyed
hash so that both programs see the same values wherever they read.

What a sampled pass says: on the elements compared (`sample_blocks` random 64×64 tiles of the
last two dims of every output, at random indices of its leading dims, drawn afresh each test),
the per-test bound of `finite_field.py` holds. It says nothing about elements never sampled: a
candidate wrong on a fraction f of an output's tiles escapes T tests of N tiles with probability
up to (1 − f)^(N·T), which no bound here covers.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from mugraph.ir.block import BlockGraph, BlockOutput
from mugraph.ir.errors import InvalidInput, VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import KERNEL_EVAL, run_block_graph
from mugraph.ir.layout import reshape_groups
from mugraph.ir.node import BNode
from mugraph.ir.ops import BOp, KOp
from mugraph.verify.field import (as_u64, derive_key, join, mix64, single_threaded_blas,
                                  uniform_below)
from mugraph.verify.field_bound import pair_bound
from mugraph.verify.field_semantics import NeedsExponents, ZeroDivisorDrawn
from mugraph.verify.finite_field import (FiniteFieldResult, default_count, first_mismatch,
                                         make_draw)

BLOCK = 64
ALL = None        # a dim needed whole
FIELD_BYTES = 16  # a finite-field value with its exponent image: two int64
AUTO_BLOCKS = 4   # tiles per output and test when the whole output does not fit in memory


def blocks_for_memory(spec: KernelGraph, candidate: KernelGraph) -> int | None:
    """None when the finite-field test of every output element fits the memory limit
    (`ir.memory`); else how many random tiles per output a sampled test compares instead (its
    result says what it compared, and its bound covers only that)."""
    from mugraph.ir import memory
    need = memory.evaluation_bytes([spec, candidate], FIELD_BYTES)
    return None if memory.fits(need) else AUTO_BLOCKS


# ---- index sets ----------------------------------------------------------------------------------
def _union(a, b):
    if a is ALL or b is ALL:
        return ALL
    return np.union1d(a, b)


def _union_sets(a, b):
    return b if a is None else tuple(_union(x, y) for x, y in zip(a, b))


def _size(index, extent: int) -> int:
    return extent if index is ALL else len(index)


def sample_sets(shape, count: int, rng: np.random.Generator) -> tuple:
    """`count` random BLOCK×BLOCK tiles of the last two dims (one index of each leading dim):
    per dim, the union of the indices the tiles cover."""
    sets = [np.zeros(0, np.int64) for _ in shape]
    tiled = range(max(0, len(shape) - 2), len(shape))
    for _ in range(count):
        for d, n in enumerate(shape):
            if d in tiled:
                start = int(rng.integers(0, math.ceil(n / BLOCK))) * BLOCK
                picked = np.arange(start, min(start + BLOCK, n))
            else:
                picked = np.array([int(rng.integers(0, n))])
            sets[d] = np.union1d(sets[d], picked)
    return tuple(ALL if len(s) == n else s for s, n in zip(sets, shape))


def restrict(array, have, want, shape) -> np.ndarray:
    """`array` holds the elements `have` of a tensor of `shape`; keep those of `want` ⊆ `have`."""
    for d, (h, w) in enumerate(zip(have, want)):
        if w is ALL:
            if h is not ALL and len(h) != shape[d]:
                raise VerificationError(f"sampling: dim {d} is needed whole but {len(h)} of "
                                        f"{shape[d]} indices were computed")
            continue
        positions = w if h is ALL else np.searchsorted(h, w)
        array = np.take(array, positions, axis=d)
    return array


def _aligned(src_shape, sets, out_shape) -> tuple:
    lead = len(out_shape) - len(src_shape)
    return tuple(np.zeros(1, np.int64) if n == 1 else sets[lead + i]
                 for i, n in enumerate(src_shape))


def source_sets(node, sets) -> list:
    """What each source of a kernel node must hold for the node's elements `sets` (None: a
    source of a concat that none of them reads)."""
    op, srcs = node.op, node.srcs
    if op is KOp.MATMUL:
        a, b = srcs
        batch = sets[:-2]
        return [_aligned(a.shape[:-2], batch, node.shape[:-2]) + (sets[-2], ALL),
                _aligned(b.shape[:-2], batch, node.shape[:-2]) + (ALL, sets[-1])]
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX):
        return [_with(sets, node.arg, ALL)]
    if op is KOp.RMS_NORM:
        return [_with(sets, node.arg[0], ALL)]
    if op is KOp.TRANSPOSE:
        out = [ALL] * len(sets)
        for i, d in enumerate(node.arg):
            out[d] = sets[i]
        return [tuple(out)]
    if op is KOp.RESHAPE:
        return [_reshape_sets(srcs[0].shape, node.shape, sets)]
    if op is KOp.SLICE:
        return [tuple(_shifted(s, a, b, n) for s, a, b, n in
                      zip(sets, *node.arg, srcs[0].shape))]
    if op is KOp.CONCAT:
        return _concat_sets(node, sets)
    return [_aligned(s.shape, sets, node.shape) for s in srcs]


def _reshape_sets(old, new, sets) -> tuple:
    """A reshape's source sets: a dim that keeps its extent keeps its set, the dims of a group
    that splits or merges are needed whole (the reshape is computed whole there, then cut)."""
    out = [np.zeros(1, np.int64)] * len(old)
    for gi, gj in _wide_groups(old, new):
        if len(gi) == 1 and len(gj) == 1:
            out[gi[0]] = sets[gj[0]]
        else:
            for i in gi:
                out[i] = ALL
    return tuple(out)


def _wide_groups(old, new) -> list:
    return [([i for i in gi if old[i] != 1], [j for j in gj if new[j] != 1])
            for gi, gj in reshape_groups(old, new)]


def _shifted(s, start: int, limit: int, extent: int):
    """The source indices of a window's indices `s`."""
    if s is not ALL:
        return s + start
    return ALL if (start, limit) == (0, extent) else np.arange(start, limit)


def _reshaped(value, src, node, sets) -> np.ndarray:
    """A reshape of a source restricted by `_reshape_sets`: computed with its split or merged
    groups whole, then cut to `sets`."""
    shape, have = list(node.shape), [ALL] * node.rank
    for gi, gj in _wide_groups(src.shape, node.shape):
        if len(gi) == 1 and len(gj) == 1:
            shape[gj[0]] = _size(sets[gj[0]], node.shape[gj[0]])
            have[gj[0]] = sets[gj[0]]
    full = np.reshape(value, shape)
    return restrict(full, tuple(have), sets, node.shape)


def _with(sets, dim: int, value) -> tuple:
    sets = list(sets)
    sets[dim] = value
    return tuple(sets)


def _concat_sets(node, sets) -> list:
    d, offset, out = node.arg, 0, []
    for s in node.srcs:
        n = s.shape[d]
        if sets[d] is ALL:
            out.append(_with(sets, d, ALL))
        else:
            local = sets[d][(sets[d] >= offset) & (sets[d] < offset + n)] - offset
            out.append(_with(sets, d, local) if len(local) else None)
        offset += n
    return out


# ---- custom kernels: only the blocks that write the sampled tiles ---------------------------------
@dataclasses.dataclass
class Group:
    """One custom op restricted to some blocks: its block graph, what each output then holds,
    and what each operand must hold."""

    graph: BlockGraph
    outputs: list
    inputs: list


def _blocks(bg: BlockGraph, members, want) -> list:
    """Per grid axis, the blocks that write some wanted element of some output."""
    chosen = [None] * 3
    for m in members:
        out = bg.outputs[m.arg[1]]
        for g, j in enumerate(out.omap):
            if j is None or m not in want:
                continue
            s = want[m][j]
            picked = np.arange(bg.grid[g]) if s is ALL else np.unique(s // out.node.shape[j])
            chosen[g] = picked if chosen[g] is None else np.union1d(chosen[g], picked)
    return [np.arange(bg.grid[g]) if c is None else c for g, c in enumerate(chosen)]


def _ranges(blocks, extent: int) -> np.ndarray:
    return (blocks[:, None] * extent + np.arange(extent)[None, :]).ravel()


def restrict_group(bg: BlockGraph, members, want) -> Group:
    blocks = _blocks(bg, members, want)
    grid = tuple(len(b) for b in blocks)
    whole = grid == tuple(bg.grid)
    inputs, mapping = [], {}
    for node in bg.inputs:
        spec = node.arg
        shape, sets = list(spec.shape), [ALL] * len(spec.shape)
        for g, d in enumerate(spec.imap):
            if d is not None and not whole:
                extent = spec.shape[d] // bg.grid[g]
                sets[d], shape[d] = _ranges(blocks[g], extent), grid[g] * extent
        inputs.append(tuple(sets))
        mapping[node] = BNode(BOp.INPUT, (), dataclasses.replace(spec, shape=tuple(shape),
                                                                 grid=grid))
    if whole:
        return Group(bg, [(ALL,) * len(o.shape) for o in bg.outputs], inputs)
    from mugraph.verify.mutate import substitute
    done = substitute([o.node for o in bg.outputs], mapping)
    outputs, sets_out = [], []
    for o in bg.outputs:
        shape, sets = list(o.shape), [ALL] * len(o.shape)
        for g, j in enumerate(o.omap):
            if j is not None:
                tile = o.node.shape[j]
                sets[j], shape[j] = _ranges(blocks[g], tile), grid[g] * tile
        outputs.append(BlockOutput(done[o.node], o.omap, o.dtype, tuple(shape)))
        sets_out.append(tuple(sets))
    new_inputs = tuple(done.get(n, mapping[n]) for n in bg.inputs)
    return Group(BlockGraph(grid, bg.threads, bg.forloop, new_inputs, tuple(outputs)), sets_out,
                 inputs)


# ---- the plan: which elements of which node, backward from the sampled outputs --------------------
def plan(graph: KernelGraph, output_sets) -> tuple[dict, dict]:
    """(what every needed node holds, the restricted custom groups)."""
    want: dict = {}
    for o, s in zip(graph.outputs, output_sets):
        want[o] = _union_sets(want.get(o), s)
    members: dict = {}
    for n in graph.nodes:
        if n.op is KOp.CUSTOM:
            members.setdefault((n.arg[0], n.srcs), []).append(n)
    have, groups = {}, {}
    for node in reversed(graph.nodes):
        if node not in want:
            continue
        if node.op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if node is not members[key][0]:
                continue   # the group is restricted at its first member, once all are wanted
            group = groups[key] = restrict_group(node.arg[0], members[key], want)
            for m in members[key]:
                have[m] = group.outputs[m.arg[1]]
            for src, sets in zip(node.srcs, group.inputs):
                want[src] = _union_sets(want.get(src), sets)
            continue
        have[node] = want[node]
        for src, sets in zip(node.srcs, source_sets(node, want[node])):
            if sets is not None:
                want[src] = _union_sets(want.get(src), sets)
    return have, groups


# ---- evaluation ----------------------------------------------------------------------------------
def hashed_input(draw, node, sets, exponents: bool) -> np.ndarray:
    """Uniform field elements as a keyed hash of (input name, flat index): any subset of an
    input is drawn consistently, whoever reads it."""
    key = np.uint64(derive_key(draw.key, "input", node.arg[0]))
    index = np.zeros((1,) * len(node.shape), np.int64)
    for d, (s, n) in enumerate(zip(sets, node.shape)):
        axis = np.arange(n) if s is ALL else np.asarray(s)
        stride = math.prod(node.shape[d + 1:])
        index = index + (axis * stride).reshape((1,) * d + (-1,) + (1,) * (len(node.shape) - d - 1))
    h = mix64(mix64(as_u64(index) ^ key))
    residues = uniform_below(h, draw.field.p)
    if not exponents:
        return residues
    return join(residues, uniform_below(mix64(h ^ np.uint64(0x5851F42D4C957F2D)), draw.field.q))


def evaluate_sampled(graph: KernelGraph, have: dict, groups: dict, draw, exponents: bool,
                     sem=None) -> dict:
    sem = sem or draw.semantics(exponents)
    values: dict = {}
    done_groups: dict = {}
    with single_threaded_blas():
        for node in graph.nodes:
            if node not in have:
                continue
            if node.op is KOp.INPUT:
                values[node] = sem.input(hashed_input(draw, node, have[node], exponents),
                                         node.dtype)
            elif node.op is KOp.CUSTOM:
                values[node] = _run_group(sem, node, have, groups, values, done_groups)
            else:
                values[node] = _eval_node(sem, node, have, values)
    return values


def _run_group(sem, node, have, groups, values, done_groups):
    key = (node.arg[0], node.srcs)
    if key not in done_groups:
        group = groups[key]
        operands = [restrict(values[s], have[s], sets, s.shape)
                    for s, sets in zip(node.srcs, group.inputs)]
        done_groups[key] = run_block_graph(sem, group.graph, operands)
    return done_groups[key][node.arg[1]]


def _shape(node, sets) -> tuple:
    return tuple(_size(s, n) for s, n in zip(sets, node.shape))


def _eval_node(sem, node, have, values):
    sets = have[node]
    wanted = source_sets(node, sets)
    args = [restrict(values[s], have[s], w, s.shape) for s, w in zip(node.srcs, wanted)
            if w is not None]
    op = node.op
    if op is KOp.CONCAT:
        return sem.cast(np.concatenate(args, axis=node.arg), node.dtype)
    if op is KOp.BROADCAST:
        return np.ascontiguousarray(np.broadcast_to(args[0], _shape(node, sets)))
    if op is KOp.RESHAPE:
        return _reshaped(args[0], node.srcs[0], node, sets)
    if op is KOp.SLICE:
        return args[0]    # the source was cut to the window's indices already
    if op in (KOp.CONSTANT, KOp.IOTA, KOp.TABLE):
        full = KERNEL_EVAL[op](sem, node, [])
        return restrict(full, (ALL,) * len(node.shape), sets, node.shape)
    return KERNEL_EVAL[op](sem, node, args)


# ---- the test ------------------------------------------------------------------------------------
def sampled_test(spec: KernelGraph, candidate: KernelGraph, sample_blocks: int, *, tests, seed,
                 target, max_tests, max_redraws) -> FiniteFieldResult:
    """`finite_field_test` on `sample_blocks` random output tiles per output and test."""
    start = time.perf_counter()
    if not isinstance(sample_blocks, int) or isinstance(sample_blocks, bool) or sample_blocks < 1:
        raise InvalidInput(f"sample_blocks={sample_blocks!r} is not a positive number of blocks",
                           hint="use None to compare every output element")
    bound = pair_bound(spec, candidate)
    count = tests if tests is not None else default_count(bound, target, max_tests)
    exponents, primes, redraws, compared = bound.exponents, [], 0, []
    for test in range(count):
        for attempt in range(max_redraws + 1):
            draw = make_draw(seed, test, attempt)
            try:
                expected, got, n = _compare(spec, candidate, sample_blocks, draw, exponents)
            except NeedsExponents:
                exponents = True
                expected, got, n = _compare(spec, candidate, sample_blocks, draw, exponents)
            except ZeroDivisorDrawn:
                redraws += 1
                continue
            break
        else:
            raise VerificationError(f"sampled finite-field test {test}: every draw hit a zero "
                                    "divisor", hint="a denominator is identically zero in Z_p")
        primes.append((draw.field.p, draw.field.q))
        compared.append(n)
        failure = first_mismatch(expected, got, draw, exponents)
        if failure is not None:
            return _result(False, bound, primes, target, start, redraws, failure, exponents,
                           sample_blocks, compared, spec)
    return _result(True, bound, primes, target, start, redraws, None, exponents, sample_blocks,
                   compared, spec)


def _compare(spec, candidate, sample_blocks, draw, exponents):
    rng = np.random.default_rng(np.random.SeedSequence(draw.seed,
                                                       spawn_key=(draw.test, draw.attempt, 3)))
    sets = [sample_sets(o.shape, sample_blocks, rng) for o in spec.outputs]
    outputs, plans = [], [plan(graph, sets) for graph in (spec, candidate)]
    _require_memory(spec, plans)
    spec_sem = draw.semantics(exponents)
    for graph, (have, groups) in zip((spec, candidate), plans):
        # the candidate's casts read the spec's roundings
        sem = spec_sem if graph is spec else draw.semantics(exponents, spec_sem.recorded)
        values = evaluate_sampled(graph, have, groups, draw, exponents, sem)
        outputs.append([restrict(values[o], have[o], s, o.shape)
                        for o, s in zip(graph.outputs, sets)])
    n = sum(math.prod(_shape(o, s)) for o, s in zip(spec.outputs, sets))
    return outputs[0], outputs[1], n


def _require_memory(spec: KernelGraph, plans) -> None:
    """A ResourceError when even the sampled blocks (with the whole reduced dims they read) need
    more memory than the limit."""
    from mugraph.ir import memory
    elements = 0
    for have, groups in plans:
        sizes = [math.prod(_shape(node, sets)) for node, sets in have.items()]
        sizes += [g.graph.num_blocks * sum(math.prod(n.shape) for n in g.graph.nodes)
                  for g in groups.values()]
        elements += sum(sizes) + 2 * max(sizes, default=0)
    memory.require(elements * FIELD_BYTES,
                   f"the sampled finite-field test of {memory.describe(spec)}",
                   "verify the program at smaller shapes")


def _result(passed, bound, primes, target, start, redraws, failure, exponents, blocks, compared,
            spec) -> FiniteFieldResult:
    error = math.prod(bound.per_test(p, q) for p, q in primes) if passed else 1.0
    total = sum(math.prod(o.shape) for o in spec.outputs)
    sampled = (f"{blocks} random {BLOCK}x{BLOCK} tiles of each output per test: "
               f"{min(compared)}-{max(compared)} of {total} elements compared per test; the bound "
               f"covers those elements only")
    return FiniteFieldResult(passed, len(primes), tuple(primes), bound.degree, error,
                             math.log2(error) if error > 0 else -math.inf,
                             time.perf_counter() - start, target, bound.worst_per_test(),
                             tuple(bound.terms().items()), redraws, failure, exponents, sampled)
