"""The finite-field test's error bound: a symbolic pass that runs the op table on degree records,
and a backward pass that counts the transcendental applications one output element depends on.
The derivation is in `finite_field.py`'s docstring.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.errors import VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.layout import reshape_groups
from mugraph.ir.node import BNode
from mugraph.ir.ops import ACCUMULATORS, BOp, KOp, TOp
from mugraph.ir.thread import evaluate as evaluate_thread
from mugraph.verify.field import Q_MIN
from mugraph.verify.field_semantics import FF_ELEMENTWISE

LOOP = "L"          # the pseudo-dim of loop iterations in a Term's variation sets
EXP = "exp"         # the pool of exps with an exponent image (their collisions are mod q)
NONE = frozenset()


# ---- the symbolic pass ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """A value as N/D in the atoms: the degrees of N and D, whether it keeps an exponent image,
    the exact value of a constant-only expression, and the dims (negative, NumPy-aligned, or LOOP)
    along which the value and its denominator may vary."""

    num: int
    den: int
    image: bool = True
    value: Fraction | None = None
    vary: frozenset = NONE
    den_vary: frozenset = NONE


LEAF = Term(0, 0)


def _fold(fn, *terms) -> Fraction | None:
    values = [t.value for t in terms]
    if None in values:
        return None
    try:
        return fn(*values)
    except (ZeroDivisionError, OverflowError):
        return None


@dataclass
class Apps:
    """Transcendental applications one element of a node makes: per function, the count and the
    largest numerator / denominator degree of an argument; and the divisions (zero-divisor draws)."""

    count: dict = field(default_factory=dict)
    degree: dict = field(default_factory=dict)
    divisions: int = 0
    division_degree: int = 0
    exps: int = 0

    def add(self, pool, count: int, args) -> None:
        self.count[pool] = self.count.get(pool, 0) + count
        n, d = self.degree.get(pool, (0, 0))
        self.degree[pool] = (max([n] + [a.num for a in args]), max([d] + [a.den for a in args]))


class SymbolicSemantics:
    """The finite-field semantics' primitives on `Term`s: running an op-table entry on it gives
    the entry's degree rule and the applications it makes, so there is no second table."""

    def __init__(self, exact_casts=frozenset()):
        self.apps = Apps()
        self.exact_casts = exact_casts    # casts that make no new rounding (ALL: every one)

    def element(self, value: float) -> Term:
        if not math.isfinite(value):
            return self.oracle("constant", repr(float(value)))
        return Term(0, 0, value=Fraction(value))

    def add(self, a: Term, b: Term) -> Term:
        return Term(max(a.num + b.den, b.num + a.den), a.den + b.den, a.image and b.image,
                    _fold(lambda x, y: x + y, a, b), a.vary | b.vary, a.den_vary | b.den_vary)

    def sub(self, a: Term, b: Term) -> Term:
        return replace(self.add(a, b), value=_fold(lambda x, y: x - y, a, b))

    def mul(self, a: Term, b: Term) -> Term:
        return Term(a.num + b.num, a.den + b.den, a.image and b.image,
                    _fold(lambda x, y: x * y, a, b), a.vary | b.vary, a.den_vary | b.den_vary)

    def neg(self, a: Term) -> Term:
        return replace(a, value=_fold(lambda x: -x, a))

    def inverse(self, a: Term) -> Term:
        if a.value is None:
            self.apps.divisions += 1
            self.apps.division_degree = max(self.apps.division_degree, a.num)
        return Term(a.den, a.num, a.image, _fold(lambda x: 1 / x, a), a.vary,
                    a.vary if a.num else NONE)

    def power(self, a: Term, e: int) -> Term:
        if e < 0:
            return self.power(self.inverse(a), -e)
        return Term(e * a.num, e * a.den, a.image, _fold(lambda x: x ** e, a), a.vary,
                    a.den_vary)

    def exp(self, a: Term) -> Term:
        self.apps.add(EXP if a.image else ("exp", "fallback"), 1, [a])
        self.apps.exps += 1
        return Term(1, 0, image=False, vary=a.vary)

    def oracle(self, op, params, *args: Term) -> Term:
        self.apps.add((op, params), 1, args)
        return _atom(args)

    def rounding(self, a: Term, dtype) -> Term:
        """A CAST covers both outcomes of the run: the program's own rounding (x, exact) and a
        new one (an uninterpreted application)."""
        if not dtype.is_16bit:
            return a
        self.oracle("round", dtype.value, a)
        return replace(a, num=max(a.num, 1), value=None)

    def lattice(self, kind: str, a: Term, b: Term) -> Term:
        self.apps.add(kind, 3, [a, b])          # Φ(a), Φ(b), Φ⁻¹ of their sum
        return _atom([a, b])

    def exponent_value(self, y: Term) -> float | None:
        """Whatever the run decides (a constant's value, or an oracle), `_pow` covers both."""
        return None if y.value is None else float(y.value)


def _atom(args) -> Term:
    return Term(1, 0, vary=frozenset().union(*(a.vary for a in args)))


def _pow(sem, x: Term, y: Term, arg) -> Term:
    """POW covers both outcomes of the run's exponent lookup: the exact power and an oracle."""
    exact = FF_ELEMENTWISE[TOp.POW](sem, x, y, arg)
    sem.oracle(TOp.POW, None, x, y)
    return replace(exact, num=max(exact.num, 1), vary=exact.vary | y.vary)


def _elementwise(sem, node, *srcs) -> Term:
    if node.op is TOp.POW:
        return _pow(sem, *srcs, node.arg)
    if node.op is TOp.CAST and (sem.exact_casts is ALL or node in sem.exact_casts):
        return srcs[0]     # the program's own rounding: exact in the run, no application
    return FF_ELEMENTWISE[node.op](sem, *srcs, node.arg)


ALL = "all"   # every cast of the graph is exact: the spec's run never makes a new rounding


# ---- structural ops (the interpreter builds them from the same primitives) ------------------------
def _sum(t: Term, n: int, dim) -> Term:
    """A sum of n terms along `dim`: one denominator if it does not vary along `dim`, else n."""
    vary, den_vary = t.vary - {dim}, t.den_vary - {dim}
    if dim not in t.den_vary or t.den == 0 or n == 1:
        return Term(t.num, t.den, t.image, None, vary, den_vary)
    return Term(t.num + (n - 1) * t.den, n * t.den, t.image, None, vary, den_vary)


def _negative(node, dim: int) -> int:
    return dim - len(node.srcs[0].shape)


def _reduce_sum(sem, node, a: Term) -> Term:
    return _sum(a, node.srcs[0].shape[node.arg], _negative(node, node.arg))


def _reduce_max(sem, node, a: Term) -> Term:
    n, dim = node.srcs[0].shape[node.arg], _negative(node, node.arg)
    sem.apps.add("max", n + 1, [a])              # Φ of each element, Φ⁻¹ of their sum
    return Term(1, 0, vary=a.vary - {dim})


def _rms(sem, node, x: Term) -> Term:
    """x · rsqrt(mean(x²) + eps), as the interpreter computes it."""
    dim, eps = node.arg
    n = node.srcs[0].shape[dim]
    mean = sem.mul(_sum(sem.mul(x, x), n, _negative(node, dim)),
                   sem.inverse(sem.element(float(n))))
    root = sem.oracle(TOp.SQRT, None, sem.add(mean, sem.element(eps)))
    return sem.mul(x, sem.inverse(root))


def _matmul(sem, node, a: Term, b: Term) -> Term:
    k = node.srcs[0].shape[-1]
    along_k = -1 in a.den_vary or -2 in b.den_vary
    left = Term(a.num, a.den, a.image, None, _shift(a.vary), _shift(a.den_vary))
    right = Term(b.num, b.den, b.image, None, b.vary - {-2}, b.den_vary - {-2})
    product = sem.mul(left, right)
    if along_k:
        product = replace(product, den_vary=product.den_vary | {"K"})
    return _sum(product, k, "K")


def _shift(dims) -> frozenset:
    """A matmul's left operand: its dim -1 (K) is summed, its dim -2 (M) stays at -2."""
    return frozenset(d for d in dims if d != -1)


def _transpose(sem, node, a: Term) -> Term:
    rank = len(node.shape)

    def move(dims):
        where = {src: out for out, src in enumerate(node.arg)}
        return frozenset(d if d == LOOP else where[d + rank] - rank for d in dims)
    return replace(a, vary=move(a.vary), den_vary=move(a.den_vary))


def _reshape(sem, node, a: Term) -> Term:
    """A row-major reshape: a dim of the result varies where a dim of its group varies (a head
    split of a varying dim varies in both parts; a merge of dims varies if either does)."""
    old, new = node.srcs[0].shape, node.shape
    where: dict = {}
    for gi, gj in reshape_groups(old, new):
        wide = [j - len(new) for j in gj if new[j] != 1]
        for i in gi:
            where[i - len(old)] = wide

    def move(dims):
        return frozenset(x for d in dims for x in ((d,) if d == LOOP else where.get(d, ())))
    return replace(a, vary=move(a.vary), den_vary=move(a.den_vary))


def _slice(sem, node, a: Term) -> Term:
    """A window keeps its dims; one cut to extent 1 no longer varies."""
    unit = {d - len(node.shape) for d, n in enumerate(node.shape) if n == 1}

    def keep(dims):
        return frozenset(d for d in dims if d not in unit)
    return replace(a, vary=keep(a.vary), den_vary=keep(a.den_vary))


def _concat(sem, node, *args) -> Term:
    dim = node.arg - len(node.shape)
    den = max(a.den for a in args)
    return Term(max(a.num for a in args), den, all(a.image for a in args), None,
                frozenset({dim}).union(*(a.vary for a in args)),
                frozenset({dim} if den else ()).union(*(a.den_vary for a in args)))


def _iota(sem, node) -> Term:
    shape, dim, _ = node.arg
    return Term(0, 0, vary=frozenset({dim - len(shape)} if shape[dim] > 1 else ()))


def _thread(sem, node, *srcs) -> Term:
    """A thread graph: its expanded elementwise nodes, run on the same symbolic semantics."""
    return evaluate_thread(node, srcs, lambda m, v: _node_term(sem, m, v))


def _table(sem, node) -> Term:
    """A mask table is exact 0/1 constants; any other table a leaf drawn like an input."""
    if node.arg[0].is_mask:
        return sem.element(1.0)
    return _input_term(node)


STRUCTURAL = {
    KOp.CONSTANT: lambda sem, node: sem.element(node.arg[0]),
    KOp.TABLE: _table,
    KOp.IOTA: _iota,
    KOp.MATMUL: _matmul,
    KOp.REDUCE_SUM: _reduce_sum,
    KOp.REDUCE_MAX: _reduce_max,
    KOp.RMS_NORM: _rms,
    KOp.CONCAT: _concat,
    KOp.TRANSPOSE: _transpose,
    KOp.RESHAPE: _reshape,
    KOp.SLICE: _slice,
    KOp.BROADCAST: lambda sem, node, a: a,
    BOp.CONSTANT: lambda sem, node: sem.element(node.arg[0]),
    BOp.MATMUL: _matmul,
    BOp.REDUCE_SUM: _reduce_sum,
    BOp.REDUCE_MAX: _reduce_max,
    BOp.RMS_NORM: _rms,
    BOp.THREAD: _thread,
}


def _over_loop_and_last(t: Term, n: int, forloop: int) -> Term:
    return _sum(_sum(t, n, -1), forloop, LOOP)


def _rescaled(sem, node, x: Term, m: Term, forloop: int) -> Term:
    """acc = acc · exp(m_prev − m) + x, once per iteration."""
    if node.op is BOp.ACC_SUM_LAST_RESCALE:
        x = _sum(x, node.srcs[0].shape[-1], -1)
    acc = LEAF
    for _ in range(forloop):
        acc = sem.add(sem.mul(acc, sem.exp(sem.sub(m, m))), x)
    return replace(acc, vary=acc.vary - {LOOP}, den_vary=acc.den_vary - {LOOP})


def _running_max(sem, node, x: Term, forloop: int) -> Term:
    last = node.op is BOp.ACC_MAX_LAST
    n = node.srcs[0].shape[-1] if last else 1
    sem.apps.add("max", forloop * (n + 1 + 3), [x])   # a tile max, then the running one
    return Term(1, 0, vary=x.vary - {LOOP} - ({-1} if last else NONE))


def _acc_rms(sem, node, x: Term, forloop: int) -> Term:
    n = forloop * node.srcs[0].shape[-1]
    mean = sem.mul(_over_loop_and_last(sem.mul(x, x), node.srcs[0].shape[-1], forloop),
                   sem.inverse(sem.element(float(n))))
    return sem.oracle(TOp.SQRT, None, mean)


ACCUMULATOR = {
    BOp.ACC_SUM: lambda sem, node, a, f: _sum(a, f, LOOP),
    BOp.ACC_SUM_LAST: lambda sem, node, a, f: _over_loop_and_last(a, node.srcs[0].shape[-1], f),
    BOp.ACC_RMS_LAST: _acc_rms,
    BOp.ACC_MAX: _running_max,
    BOp.ACC_MAX_LAST: _running_max,
    BOp.ACC_SUM_RESCALE: _rescaled,
    BOp.ACC_SUM_LAST_RESCALE: _rescaled,
}


# the op-table walk's view: every kernel / block op's degree rule, structural or elementwise
KERNEL_DEGREE = {op: rule for op, rule in STRUCTURAL.items() if isinstance(op, KOp)} | \
    {op: _elementwise for op in TOp}
BLOCK_DEGREE = {op: rule for op, rule in STRUCTURAL.items() if isinstance(op, BOp)} | \
    {op: _elementwise for op in TOp}


def _node_term(sem, node, srcs) -> Term:
    if isinstance(node.op, TOp):
        return _elementwise(sem, node, *srcs)
    rule = STRUCTURAL.get(node.op)
    if rule is None:
        raise VerificationError(f"the finite-field bound has no rule for {node.op.value}",
                                hint="add the op to field_bound.STRUCTURAL")
    return rule(sem, node, *srcs)


def _input_term(node) -> Term:
    dims = frozenset(i - len(node.shape) for i, n in enumerate(node.shape) if n != 1)
    return Term(1, 0, vary=dims)


def _tile_term(node, src: Term) -> Term:
    """A block input's tile: the tensor's term, varying across iterations if the loop walks it."""
    spec = node.arg
    if spec.fmap is None or spec.forloop == 1:
        return src
    fmap = spec.fmap - len(spec.shape)
    loop_den = {LOOP} if fmap in src.den_vary else set()
    return replace(src, vary=src.vary | {LOOP}, den_vary=src.den_vary | loop_den)


# ---- the backward pass: which elements one output element depends on ------------------------------
# A box gives, per dim, (key, size): `size` indices whose identity `key` names (two paths that
# reach a node with equal keys read the same indices, so they are counted once).
ONE = (("one",), 1)


def _full(n: int):
    return (("full", n), n)


def _entry(key, size: int, extent: int):
    """A box entry; one that covers its whole extent is the same set whatever path built it."""
    return _full(extent) if size >= extent else (key, size)


def _aligned(src_shape, box, out_shape) -> tuple:
    lead = len(out_shape) - len(src_shape)
    return tuple(ONE if n == 1 else box[lead + i] for i, n in enumerate(src_shape))


def _with(box, dim: int, entry) -> tuple:
    box = list(box)
    box[dim] = entry
    return tuple(box)


def _source_boxes(node, box) -> list:
    op, srcs = node.op, node.srcs
    if op in (KOp.MATMUL, BOp.MATMUL):
        a, b = srcs
        batch = box[:-2]
        return [_aligned(a.shape[:-2], batch, node.shape[:-2]) + (box[-2], _full(a.shape[-1])),
                _aligned(b.shape[:-2], batch, node.shape[:-2]) + (_full(b.shape[-2]), box[-1])]
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        return [_with(box, node.arg, _full(srcs[0].shape[node.arg]))]
    if op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return [_with(box, node.arg[0], _full(srcs[0].shape[node.arg[0]]))]
    if op is KOp.TRANSPOSE:
        out = [ONE] * len(box)
        for i, d in enumerate(node.arg):
            out[d] = box[i]
        return [tuple(out)]
    if op is KOp.RESHAPE:
        return [_reshaped_box(srcs[0].shape, node.shape, box)]
    if op is KOp.SLICE:
        return [tuple(_entry(("slice", a, key), size, n) if n > 1 else ONE
                      for a, (key, size), n in zip(node.arg[0], box, srcs[0].shape))]
    if op is KOp.CONCAT:
        d = node.arg
        return [_with(box, d, (("concat", k, box[d][0]), min(box[d][1], s.shape[d])))
                for k, s in enumerate(srcs)]
    if op in (BOp.ACC_SUM_LAST, BOp.ACC_RMS_LAST, BOp.ACC_MAX_LAST, BOp.ACC_SUM_LAST_RESCALE):
        first = _with(_aligned(srcs[0].shape, box, node.shape), -1, _full(srcs[0].shape[-1]))
        return [first] + [_aligned(s.shape, box, node.shape) for s in srcs[1:]]
    return [_aligned(s.shape, box, node.shape) for s in srcs]


class Cone:
    """The distinct boxes of every node that one output element reads (block nodes' boxes also
    carry the blocks per grid axis and the iterations: ((dims), (x, y, z), iterations))."""

    def __init__(self):
        self.boxes: dict = {}

    def reach(self, node, box) -> None:
        self.boxes.setdefault(node, set()).add(box)

    def elements(self, node, collapse: int | None = None) -> int:
        """Elements of `node` in the cone (`collapse`: count one per row along that dim)."""
        total = 0
        for box in self.boxes.get(node, ()):
            dims, extra = (box[0], box[1] + (box[2],)) if isinstance(node, BNode) else (box, ())
            if collapse is not None:
                dims = _with(dims, collapse, ONE)
            total += math.prod(s for _, s in dims) * math.prod(s for _, s in extra)
        return total


def _kernel_cone(graph: KernelGraph, index: int) -> Cone:
    cone = Cone()
    out = graph.outputs[index]
    cone.reach(out, tuple((("out", j), 1) for j in range(len(out.shape))))
    for node in reversed(graph.nodes):
        for box in list(cone.boxes.get(node, ())):
            if node.op is KOp.CUSTOM:
                _enter_block(node, box, cone)
            else:
                for src, src_box in zip(node.srcs, _source_boxes(node, box)):
                    cone.reach(src, src_box)
    return cone


def _reshaped_box(old, new, box) -> tuple:
    """A reshape's source box: a dim that keeps its extent keeps its entry; the dims of a group
    that splits or merges are read whole (more elements than needed: the bound stays sound)."""
    out = [ONE] * len(old)
    for gi, gj in reshape_groups(old, new):
        wide_i, wide_j = [i for i in gi if old[i] != 1], [j for j in gj if new[j] != 1]
        if len(wide_i) == 1 and len(wide_j) == 1:
            out[wide_i[0]] = box[wide_j[0]]
        else:
            for i in wide_i:
                out[i] = _full(old[i])
    return tuple(out)


def _enter_block(node, box, cone: Cone) -> None:
    """One custom op's output box, followed through its block graph to the kernel inputs."""
    bg, which = node.arg
    out = bg.outputs[which]
    tile = out.node.shape
    dims = tuple(_entry(("tile", key), size, tile[j]) if size > 1 else _entry(("at", key), 1,
                                                                              tile[j])
                 for j, (key, size) in enumerate(box))
    blocks = tuple(_entry(("blocks", g, box[d][0]), box[d][1], bg.grid[g]) if d is not None
                   else ONE for g, d in enumerate(out.omap))
    inner = Cone()
    inner.reach(out.node, (dims, blocks, ONE))
    phase = bg.phases()
    for bnode in reversed(bg.nodes):
        for bbox in list(inner.boxes.get(bnode, ())):
            if bnode.op is BOp.INPUT:
                cone.reach(node.srcs[bnode.arg.index], _tensor_box(bnode.arg, bbox))
                continue
            _block_sources(bnode, bbox, bg, phase, inner)
    for bnode, boxes in inner.boxes.items():
        for bbox in boxes:
            cone.reach(bnode, bbox)


def _block_sources(bnode, bbox, bg: BlockGraph, phase, inner: Cone) -> None:
    dims, blocks, iteration = bbox
    if bnode.op in ACCUMULATORS:
        iteration = (("loop",), bg.forloop)
    for src, src_dims in zip(bnode.srcs, _source_boxes(bnode, dims)):
        it = iteration if phase[src] is Phase.LOOP else ONE
        inner.reach(src, (src_dims, blocks, it))


def _tensor_box(spec, bbox) -> tuple:
    """The kernel tensor elements a block input's tiles cover, over its blocks and iterations."""
    dims, blocks, iteration = bbox
    out = []
    for d, (key, size) in enumerate(dims):
        parts = [key]
        for g in range(3):
            if spec.imap[g] == d:
                parts.append(blocks[g][0])
                size *= blocks[g][1]
        if spec.fmap == d:
            parts.append(iteration[0])
            size *= iteration[1]
        out.append(_entry(("input", d) + tuple(parts), size, spec.shape[d]))
    return tuple(out)


# ---- per graph -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphBound:
    """What the bound needs from one graph: each output's term; per output, the applications in
    one element's cone ({pool: (count, (num, den))}); the divisions one run makes; whether the
    graph has an exp (its test needs exponent images)."""

    outputs: tuple
    cones: tuple
    divisions: tuple            # (divisor elements, largest divisor degree)
    exponents: bool


@functools.lru_cache(maxsize=256)
def analyze(graph: KernelGraph, exact_casts=frozenset()) -> GraphBound:
    """`exact_casts`: the graph's casts its run keeps exact (ALL for a spec, whose casts are the
    program's own roundings); every other cast counts as an uninterpreted application."""
    terms, apps = {}, {}
    for node in graph.nodes:
        sem = SymbolicSemantics(exact_casts)
        if node.op is KOp.INPUT:
            terms[node] = _input_term(node)
        elif node.op is KOp.CUSTOM:
            terms[node] = _block_terms(node, [terms[s] for s in node.srcs], apps, exact_casts)
        else:
            terms[node] = _node_term(sem, node, [terms[s] for s in node.srcs])
            apps[node] = (sem.apps, math.prod(node.shape))
    cones = tuple(_tally(_kernel_cone(graph, i), apps) for i in range(len(graph.outputs)))
    divisions = (sum(a.divisions * runs for a, runs in apps.values()),
                 max((a.division_degree for a, _ in apps.values()), default=0))
    exponents = any(a.exps for a, _ in apps.values())
    return GraphBound(tuple(terms[o] for o in graph.outputs), cones, divisions, exponents)


def _block_terms(node, inputs: list, apps: dict, exact_casts=frozenset()) -> Term:
    """The term of one custom op's output; its block nodes' applications go into `apps`."""
    bg, which = node.arg
    terms, phase = {}, bg.phases()
    for bnode in bg.nodes:
        sem = SymbolicSemantics(exact_casts)
        srcs = [terms[s] for s in bnode.srcs]
        if bnode.op is BOp.INPUT:
            terms[bnode] = _tile_term(bnode, inputs[bnode.arg.index])
        elif bnode.op in ACCUMULATORS:
            terms[bnode] = ACCUMULATOR[bnode.op](sem, bnode, *srcs, bg.forloop)
        else:
            terms[bnode] = _node_term(sem, bnode, srcs)
        runs = bg.num_blocks * math.prod(bnode.shape) * (
            bg.forloop if phase[bnode] is Phase.LOOP else 1)
        _keep_larger(apps, bnode, sem.apps, runs)
    return terms[bg.outputs[which].node]


def _keep_larger(apps: dict, node, new: Apps, runs: int) -> None:
    """A block graph applied to two operand sets: keep the larger count and degree of each."""
    old = apps.get(node)
    if old is not None:
        for pool, count in old[0].count.items():
            new.add(pool, 0, [Term(*old[0].degree[pool])])
            new.count[pool] = max(new.count.get(pool, 0), count)
        new.divisions = max(new.divisions, old[0].divisions)
        new.division_degree = max(new.division_degree, old[0].division_degree)
        new.exps = max(new.exps, old[0].exps)
    apps[node] = (new, runs)


def _tally(cone: Cone, apps: dict) -> dict:
    pools: dict = {}
    for node in cone.boxes:
        if node not in apps or not apps[node][0].count:
            continue
        node_apps = apps[node][0]
        norm = node.op in (KOp.RMS_NORM, BOp.RMS_NORM)
        elements = cone.elements(node, node.arg[0] if norm else None)
        for pool, count in node_apps.count.items():
            c, (n, d) = pools.get(pool, (0, (0, 0)))
            dn, dd = node_apps.degree[pool]
            pools[pool] = (c + count * elements, (max(n, dn), max(d, dd)))
    return pools


# ---- the bound -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PairBound:
    """The per-test bound's ingredients for a (spec, candidate) pair."""

    degree: int                 # of the output difference, denominators cleared
    collisions: tuple           # (pool, applications in one output element's cones, D)
    division_elements: int      # divisor elements per test (the zero-divisor redraw)
    division_degree: int
    exponents: bool

    def parts(self, p: int, q: int) -> dict:
        support = q if self.exponents else p
        parts = {"degree": self.degree / support, "exp collisions": 0.0,
                 "uninterpreted collisions": 0.0}
        for pool, n, d in self.collisions:
            name = "exp collisions" if pool == EXP else "uninterpreted collisions"
            parts[name] += math.comb(n, 2) * d / (q if pool == EXP else p)
        parts["zero divisors"] = self.division_elements * self.division_degree / p
        return parts

    def per_test(self, p: int, q: int) -> float:
        """ε: the chance one test passes a non-equivalent pair (capped at 1)."""
        parts = self.parts(p, q)
        zero = parts.pop("zero divisors")
        return 1.0 if zero >= 1 else min(1.0, sum(parts.values()) / (1 - zero))

    def worst_per_test(self) -> float:
        return self.per_test(2 * Q_MIN + 1, Q_MIN)

    def terms(self) -> dict:
        """The worst per-test bound's parts (smallest field), for reports."""
        return self.parts(2 * Q_MIN + 1, Q_MIN)


def pair_bound(spec: KernelGraph, candidate: KernelGraph, *, trust_forms: bool = False) -> PairBound:
    """The bound's ingredients for one pair. The spec's casts never make a new rounding (its run
    records them). The candidate's do where the program does not hold the value: every cast
    counts as an application but the spec's own cast nodes (the same node, the same values), or
    with `trust_forms` only those whose operand's normal form the spec does not hold
    (`abstract.casts.new_roundings`); a caller that trusts forms must check that the run made no
    other new rounding (`FiniteFieldSemantics.new_roundings_made`)."""
    from mugraph.verify.abstract.casts import casts, new_roundings
    own = frozenset(n for n, _ in casts(candidate))
    exact = own & frozenset(n for n, _ in casts(spec))     # the spec's own cast nodes
    if trust_forms:
        exact |= own - new_roundings(spec, candidate)
    s, c = analyze(spec, ALL), analyze(candidate, exact)
    degree, pools = 1, {}
    for ts, tc, cs, cc in zip(s.outputs, c.outputs, s.cones, c.cones):
        degree = max(degree, ts.num + tc.den, tc.num + ts.den)
        for pool in set(cs) | set(cc):
            (ns, (a, b)), (nc, (e, f)) = cs.get(pool, (0, (0, 0))), cc.get(pool, (0, (0, 0)))
            old_n, old_d = pools.get(pool, (0, 0))
            pools[pool] = (max(old_n, ns + nc), max(old_d, max(a, e) + max(b, f), 1))
    collisions = tuple((pool, n, d) for pool, (n, d) in sorted(pools.items(), key=repr))
    return PairBound(degree, collisions, s.divisions[0] + c.divisions[0],
                     max(s.divisions[1], c.divisions[1], 1), s.exponents or c.exponents)


def degree_bound(spec: KernelGraph, candidate: KernelGraph) -> int:
    """d: a degree bound of spec_i − candidate_i (denominators cleared) over every output i."""
    return pair_bound(spec, candidate).degree


def output_degrees(graph: KernelGraph) -> list[tuple[int, int]]:
    """(numerator, denominator) degree of every output of `graph`, in the atoms."""
    return [(t.num, t.den) for t in analyze(graph).outputs]


def tests_needed(bound: PairBound, target: float, max_tests: int) -> int | None:
    """The fewest tests whose worst-case bound reaches `target`, or None beyond `max_tests`."""
    eps = bound.worst_per_test()
    if eps <= 0:
        return 1
    if eps >= 1:
        return None
    needed = max(1, math.ceil(math.log(target) / math.log(eps)))
    return needed if needed <= max_tests else None
