"""Hypothesis strategies and assertions for testing mugraph graphs in your own CI.

`kernel_graphs()` draws random well-formed kernel graphs, `block_schedules()` random valid
schedules of small block graphs together with their unscheduled kernel-level reference,
`input_arrays()` inputs for a graph, and `assert_equivalent()` compares two graphs in float64.
For an emitted kernel against `jax.jit(fn)`: `ieee_arrays()` / `kernel_inputs()` draw inputs
with IEEE special values and `assert_kernel_matches()` runs the kernel on them (`testing_kit`).
Needs Hypothesis and NumPy, not pytest.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from hypothesis import strategies as st

from mugraph import ir
from mugraph.ir import BOp, BlockGraph, DType, KernelGraph, KNode, TOp
from mugraph.ir.ops import BINARY, COMPARISONS, LAST_DIM_ACCUMULATORS, TERNARY, UNARY
from mugraph.testing_kit import SPECIAL_VALUES, assert_kernel_matches, ieee_arrays, kernel_inputs

__all__ = ["ACCUMULATORS_BY_KIND", "BLOCK_KINDS", "KERNEL_OPS", "SPECIAL_VALUES", "Scheduled",
           "assert_equivalent", "assert_kernel_matches", "block_schedules", "divisors",
           "grid_maps", "ieee_arrays", "input_arrays", "kernel_graphs", "kernel_inputs",
           "random_arrays"]

LIMIT = 1e3        # drawn graphs keep every value within +-LIMIT for inputs in [-1, 1]
_EXP_IN = 4.0      # exp's operand is clamped to +-_EXP_IN where it could be larger


# ---- inputs --------------------------------------------------------------------------------------
def random_arrays(graph, seed: int = 0, *, scale: float = 1.0, dtype=None) -> list[np.ndarray]:
    """Arrays uniform in [-scale, scale] for `graph`'s inputs, in input order.

    `dtype`: the NumPy dtype of every array; by default each input's own dtype, so the values are
    exactly the ones a kernel reading that tensor sees.
    """
    rng = np.random.default_rng(seed)
    return [rng.uniform(-scale, scale, shape).astype(dtype or d.numpy)
            for shape, d in _input_specs(graph)]


def input_arrays(graph, *, dtype=None, scale: float = 1.0) -> st.SearchStrategy:
    """A strategy of input lists for `graph` (see `random_arrays`); shrinks by seed."""
    return st.integers(0, 2**32 - 1).map(
        lambda seed: random_arrays(graph, seed, scale=scale, dtype=dtype))


def _input_specs(graph) -> list[tuple[tuple, DType]]:
    if isinstance(graph, BlockGraph):
        return [(n.arg.shape, n.arg.dtype) for n in graph.inputs]
    return [(n.shape, n.dtype) for n in graph.inputs]


# ---- comparing graphs ----------------------------------------------------------------------------
def assert_equivalent(graph_a, graph_b, arrays=None, *, rtol: float = 1e-6,
                      atol: float = 1e-6) -> None:
    """Interpret both graphs in float64 on the same inputs; raise AssertionError where they differ.

    `arrays`: a list in input order, a dict by input name, or None for `random_arrays(graph_a)`.
    Two kernel graphs receive their inputs by name (a list is named after graph_a's inputs when
    graph_b's names are among them), so they may list their inputs in any order.
    An element passes when |a - b| <= atol + rtol * |b|; NaNs must match NaNs.
    """
    if arrays is None:
        arrays = random_arrays(graph_a)
    named = all(isinstance(g, KernelGraph) for g in (graph_a, graph_b))
    if named and not isinstance(arrays, Mapping) and \
            set(graph_b.input_names) <= set(graph_a.input_names):
        arrays = dict(zip(graph_a.input_names, arrays))
    outs_a = ir.interpret(graph_a, _for(graph_a, arrays), dtype="float64")
    outs_b = ir.interpret(graph_b, _for(graph_b, arrays), dtype="float64")
    if len(outs_a) != len(outs_b):
        raise AssertionError(f"the graphs have {len(outs_a)} and {len(outs_b)} outputs")
    names = getattr(graph_a, "output_names", None) or [f"out{i}" for i in range(len(outs_a))]
    for i, (name, a, b) in enumerate(zip(names, outs_a, outs_b)):
        _compare(f"output {name!r} (#{i})", np.asarray(a, np.float64), np.asarray(b, np.float64),
                 rtol, atol)


def _for(graph, arrays):
    """The arrays `graph` reads: by-name inputs narrowed to its own names."""
    if isinstance(graph, KernelGraph) and isinstance(arrays, Mapping):
        return {n: arrays[n] for n in graph.input_names if n in arrays}
    return arrays


def _compare(what: str, a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> None:
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shapes differ, {list(a.shape)} vs {list(b.shape)}")
    allowed = atol + rtol * np.abs(b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))  # equal infinities and NaN positions agree
    with np.errstate(invalid="ignore"):
        excess = np.where(same, -np.inf, np.nan_to_num(np.abs(a - b) - allowed, nan=np.inf))
    bad = excess > 0
    if not bad.any():
        return
    worst = np.unravel_index(np.argmax(excess), a.shape)
    index = ", ".join(map(str, worst))
    raise AssertionError(
        f"{what} differs in {int(bad.sum())} of {a.size} elements "
        f"(allowed |a - b| <= {atol:g} + {rtol:g} * |b|)\n"
        f"  worst at [{index}]: a = {float(a[worst])!r}, b = {float(b[worst])!r}, "
        f"|a - b| = {abs(a[worst] - b[worst]):.3g}, allowed {allowed[worst]:.3g}")


# ---- random kernel graphs ------------------------------------------------------------------------
KERNEL_OPS = ("unary", "binary", "reduce_sum", "reduce_max", "matmul", "transpose", "rms_norm",
              "input")
_SIZES = (1, 2, 3, 4, 6)


class _Pool:
    """The nodes drawn so far, each with a bound on its absolute value, and fresh-input naming."""

    def __init__(self, draw, dtypes):
        self.draw, self.dtypes = draw, tuple(DType.parse(d) for d in dtypes)
        self.nodes: list[KNode] = []
        self.bound: dict[KNode, float] = {}
        self.n_inputs = 0

    def add(self, node: KNode, bound: float) -> KNode:
        if bound > LIMIT:  # keep later ops (and float32 references) far from overflow
            node, bound = node.clamp(-LIMIT, LIMIT), LIMIT
        if node not in self.bound:
            self.nodes.append(node)
        self.bound[node] = max(self.bound.get(node, 0.0), bound)
        return node

    def new_input(self, shape) -> KNode:
        dtype = self.draw(st.sampled_from(self.dtypes))
        node = ir.input(f"x{self.n_inputs}", shape, dtype)
        self.n_inputs += 1
        return self.add(node, 1.0)

    def pick(self, ok=lambda n: True):
        nodes = [n for n in self.nodes if ok(n)]
        return self.draw(st.sampled_from(nodes)) if nodes else None


def _broadcasts(a, b) -> bool:
    pairs = zip(reversed(a), reversed(b))
    return all(x == y or 1 in (x, y) for x, y in pairs)


def _clamped(node: KNode, bound: float, limit: float) -> tuple[KNode, float]:
    return (node.clamp(-limit, limit), limit) if bound > limit else (node, bound)


def _unary_step(pool: _Pool, x: KNode, op: TOp) -> None:
    b = pool.bound[x]
    if op in (TOp.EXP, TOp.EXPM1):
        x, b = _clamped(x, b, _EXP_IN)
        pool.add(ir.KNode(op, (x,)), math.exp(b))
    elif op is TOp.LOG1P:  # defined on x^2 >= 0
        pool.add(x.square().log1p(), math.log1p(b * b))
    elif op is TOp.SOFTPLUS:
        pool.add(x.softplus(), b + 1.0)
    elif op is TOp.IS_FINITE:
        pool.add(x.is_finite(), 1.0)
    elif op in (TOp.LOG, TOp.SQRT, TOp.RSQRT):  # defined on x^2 + 1 >= 1
        pos = x.square() + 1.0
        value = {TOp.LOG: pos.log, TOp.SQRT: pos.sqrt, TOp.RSQRT: pos.rsqrt}[op]()
        pool.add(value, {TOp.LOG: math.log1p(b * b), TOp.SQRT: math.sqrt(b * b + 1),
                         TOp.RSQRT: 1.0}[op])
    elif op is TOp.SQUARE:
        pool.add(x.square(), b * b)
    elif op is TOp.CLAMP:
        lo = pool.draw(st.sampled_from((-2.0, -0.5, 0.0)))
        pool.add(x.clamp(lo, lo + pool.draw(st.sampled_from((0.5, 1.0, 3.0)))), min(b, 3.0))
    elif op in (TOp.SIGMOID, TOp.TANH, TOp.ERF):
        pool.add(ir.KNode(op, (x,)), 1.0)
    elif op is TOp.CAST:  # |x| <= 1000 stays finite in every dtype
        pool.add(x.cast(pool.draw(st.sampled_from(pool.dtypes))), b)
    else:  # silu, gelu, relu, neg, abs: |f(x)| <= |x| + small
        pool.add(ir.KNode(op, (x,)), b + 0.2)


def _operand(pool: _Pool, a: KNode):
    """A second operand for a binary op with `a`: a pool node that broadcasts, or a constant."""
    choice = pool.draw(st.sampled_from(("node", "scalar", "constant")))
    other = pool.pick(lambda n: _broadcasts(n.shape, a.shape)) if choice == "node" else None
    if other is not None:
        return other, pool.bound[other]
    value = pool.draw(st.sampled_from((-1.5, -0.5, 0.25, 1.0, 2.0)))
    if choice == "scalar":
        return value, abs(value)
    shape = tuple(d if pool.draw(st.booleans()) else 1 for d in a.shape)
    return ir.constant(value, shape, a.dtype), abs(value)


def _binary_step(pool: _Pool, a: KNode, op: TOp) -> None:
    b, (other, ob) = pool.bound[a], _operand(pool, a)
    if op is TOp.DIV:  # the denominator is >= 1
        den = (other.square() if isinstance(other, KNode) else other * other) + 1.0
        pool.add(a / den, b)
    elif op is TOp.POW:  # a positive base in (0.5, 1.5), a moderate exponent
        base = a.sigmoid() + 0.5
        exponent = other.clamp(-3.0, 3.0) if isinstance(other, KNode) \
            else max(-3.0, min(3.0, other))
        pool.add(base ** exponent, 1.5 ** 3)
    elif op is TOp.MUL:
        pool.add(a * other, b * ob)
    elif op is TOp.LEAKY_RELU:  # x where x >= 0, else slope * x
        pool.add(a.leaky_relu(other), b * max(1.0, ob))
    elif op in COMPARISONS:  # a 0/1 mask
        pool.add(ir.KNode(op, (a, a._lift(other))), 1.0)
    elif op is TOp.SELECT:  # where(a > other, a, other)
        pool.add(a.gt(other).select(a, other), max(b, ob))
    elif op in (TOp.MAX, TOp.MIN):
        pool.add(a.maximum(other) if op is TOp.MAX else a.minimum(other), max(b, ob))
    else:
        pool.add(a + other if op is TOp.ADD else a - other, b + ob)


def _matmul_step(pool: _Pool, a: KNode) -> None:
    if a.rank < 2:
        a = pool.add(a.reshape((1,) + a.shape), pool.bound[a])
    k = a.shape[-1]
    w = pool.pick(lambda n: n.rank >= 2 and n.shape[-2] == k
                  and _broadcasts(n.shape[:-2], a.shape[:-2]))
    if w is None:
        w = pool.new_input((k, pool.draw(st.sampled_from(_SIZES))))
    pool.add(a @ w, k * pool.bound[a] * pool.bound[w])


def _step(pool: _Pool, kind: str) -> None:
    draw = pool.draw
    a = pool.pick()
    if kind == "unary":
        _unary_step(pool, a, draw(st.sampled_from(sorted(UNARY, key=lambda o: o.value))))
    elif kind == "binary":
        _binary_step(pool, a, draw(st.sampled_from(sorted(BINARY | TERNARY, key=lambda o: o.value))))
    elif kind in ("reduce_sum", "reduce_max"):
        dim = draw(st.integers(0, a.rank - 1))
        pool.add(a.sum(dim), a.shape[dim] * pool.bound[a]) if kind == "reduce_sum" \
            else pool.add(a.amax(dim), pool.bound[a])
    elif kind == "matmul":
        _matmul_step(pool, a)
    elif kind == "transpose" and a.rank >= 2:
        pool.add(a.transpose(draw(st.permutations(range(a.rank)))), pool.bound[a])
    elif kind == "rms_norm":
        dim = draw(st.integers(0, a.rank - 1))
        eps = draw(st.sampled_from((1e-5, 1e-3)))
        pool.add(a.rms_norm(dim, eps), math.sqrt(a.shape[dim]))
    else:  # "input", or a transpose of a rank-1 tensor: a fresh input to work on
        pool.new_input(tuple(draw(st.lists(st.sampled_from(_SIZES), min_size=1, max_size=3))))


@st.composite
def kernel_graphs(draw, max_nodes: int = 8, dtypes=("float32",), ops=KERNEL_OPS) -> KernelGraph:
    """Random well-formed kernel graphs, built with the IR builder (so valid by construction).

    Up to `max_nodes` drawn steps over `ops` (elementwise unary and binary ops with NumPy
    broadcasting, reduce_sum/max, matmul, transpose, rms_norm, constants), on 1 to 3 dim inputs
    of `dtypes`. Ops with a restricted domain get operands inside it (log(x^2 + 1), a / (b^2 + 1),
    a positive base for pow) and values are clamped to +-1000, so for inputs in [-1, 1] every
    value is finite and a float32 evaluation stays close to float64. Every graph has 1 or 2
    outputs, the last step and possibly an earlier one.
    """
    pool = _Pool(draw, dtypes)
    kinds = tuple(ops) + tuple(k for k in ("unary", "binary") if k in ops)  # elementwise twice
    first = tuple(draw(st.lists(st.sampled_from(_SIZES), min_size=1, max_size=3)))
    pool.new_input(first)
    steps = draw(st.integers(1, max_nodes))
    for _ in range(steps):
        _step(pool, draw(st.sampled_from(kinds)))
    computed = [n for n in pool.nodes if n.op is not ir.KOp.INPUT]
    last = computed[-1] if computed else pool.nodes[-1]
    outputs = [last]
    extra = draw(st.sampled_from([None] + computed[:-1]))
    if extra is not None:
        outputs.append(extra)
    return KernelGraph(outputs)


# ---- random schedules of block graphs ------------------------------------------------------------
BLOCK_KINDS = ("matmul", "elementwise", "reduce_sum", "reduce_max", "rms", "rms_norm_matmul",
               "softmax")
ACCUMULATORS_BY_KIND = {
    "matmul": (BOp.ACC_SUM,),
    "rms_norm_matmul": (BOp.ACC_SUM,),
    "elementwise": (BOp.ACC_SUM, BOp.ACC_MAX),
    "reduce_sum": (BOp.ACC_SUM_LAST, BOp.ACC_SUM),
    "reduce_max": (BOp.ACC_MAX_LAST, BOp.ACC_MAX),
    "rms": (BOp.ACC_RMS_LAST,),
    "softmax": (BOp.ACC_MAX_LAST, BOp.ACC_MAX),  # the running max next to the rescaled sums
}


class Scheduled(NamedTuple):
    """A block graph under one schedule, as a kernel graph, with its kernel-level reference."""

    graph: KernelGraph       # one custom op; same inputs (names, order) as `reference`
    reference: KernelGraph   # the same function with kernel-level ops only
    block_graph: BlockGraph


def divisors(n: int) -> list[int]:
    """The positive divisors of `n`, ascending: the only legal grid extents and trip counts."""
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def grid_maps(draw, extents: Sequence[int]) -> tuple[tuple, tuple]:
    """(grid, axis_dims): up to 3 grid axes, each splitting a distinct dim of `extents` evenly.

    `axis_dims[a]` is the dim grid axis `a` splits (None where the axis is unused, extent 1).
    """
    count = draw(st.integers(0, min(3, len(extents))))
    dims = draw(st.permutations(range(len(extents))))[:count]
    axes = draw(st.permutations(range(3)))[:count]
    grid, axis_dims = [1, 1, 1], [None, None, None]
    for dim, axis in zip(dims, axes):
        grid[axis] = draw(st.sampled_from(divisors(extents[dim])))
        axis_dims[axis] = dim
    return tuple(grid), tuple(axis_dims)


def _imap(axis_dims, to_input: dict) -> tuple:
    """An input's imap from the output dims the grid splits (`to_input`: output -> input dim)."""
    return tuple(to_input.get(d) if d is not None else None for d in axis_dims)


def _builder(draw, grid, forloop):
    return ir.BlockBuilder(grid, forloop, threads=draw(st.sampled_from((32, 128, 256))))


def _pair(custom_outputs, reference, inputs) -> Scheduled:
    names = [f"out{i}" for i in range(len(reference))]
    return Scheduled(KernelGraph(custom_outputs, inputs, names),
                     KernelGraph(reference, inputs, names), custom_outputs[0].arg[0])


@st.composite
def _matmul(draw, shape, dtype, acc, norm: bool = False) -> Scheduled:
    *batch, m, k, n = shape
    x = ir.input("X", (*batch, m, k), dtype)
    w = ir.input("W", (*batch, k, n), dtype)
    out_rank = len(batch) + 2
    grid, axis_dims = draw(grid_maps((*batch, m, n)))
    forloop = draw(st.sampled_from(divisors(k)))
    b = _builder(draw, grid, forloop)
    bdims = {i: i for i in range(len(batch))}
    loop_x = None if forloop == 1 and draw(st.booleans()) else out_rank - 1
    tx = b.input(x, _imap(axis_dims, bdims | {len(batch): len(batch)}), loop_x)
    tw = b.input(w, _imap(axis_dims, bdims | {len(batch) + 1: out_rank - 1}), out_rank - 2)
    omap = axis_dims  # the output is [*batch, M, N], the dims the grid was drawn over
    if norm:  # (x @ w) / rms(x): the norm accumulates next to the GEMM
        eps = 1e-6
        tile = ((tx @ tw).acc_sum() * (((tx * tx).acc_sum_last() / float(k)) + eps).rsqrt())
        ref = x.rms_norm(-1, eps) @ w
    else:
        epilogue = draw(st.sampled_from((None, TOp.SILU, TOp.RELU)))
        tile, ref = (tx @ tw).acc_sum(), x @ w
        if epilogue is not None:
            tile, ref = ir.BNode(epilogue, (tile,)), KNode(epilogue, (ref,))
    outs = b.finish([(tile, omap)])
    return _pair(outs, [ref], [x, w])


@st.composite
def _elementwise(draw, shape, dtype, acc) -> Scheduled:
    """out = silu(X) * Y + X with Y broadcast along a drawn dim: one tile per block, forloop 1."""
    rank = len(shape)
    x = ir.input("X", shape, dtype)
    flat = draw(st.sampled_from([None] + list(range(rank))))
    y = ir.input("Y", tuple(1 if d == flat else s for d, s in enumerate(shape)), dtype)
    grid, axis_dims = draw(grid_maps(shape))
    b = _builder(draw, grid, 1)
    tx = b.input(x, _imap(axis_dims, {d: d for d in range(rank)}))
    ty = b.input(y, _imap(axis_dims, {d: d for d in range(rank) if d != flat}))
    body = tx.silu() * ty + tx
    tile = body.acc_sum() if acc is BOp.ACC_SUM else body.acc_max()
    outs = b.finish([(tile, axis_dims)])
    return _pair(outs, [x.silu() * y + x], [x, y])


@st.composite
def _reduction(draw, shape, dtype, acc, kind, dim) -> Scheduled:
    """A reduction over `dim`, walked by the for-loop; the grid splits the other dims."""
    rank = len(shape)
    dim = dim % rank
    x = ir.input("X", shape, dtype)
    kept = [d for d in range(rank) if d != dim]
    grid, axis_dims = draw(grid_maps([shape[d] for d in kept]))
    axis_dims = tuple(None if a is None else kept[a] for a in axis_dims)
    b = _builder(draw, grid, draw(st.sampled_from(divisors(shape[dim]))))
    t = b.input(x, axis_dims, dim)
    tile = {BOp.ACC_SUM_LAST: lambda: t.acc_sum_last(), BOp.ACC_SUM: lambda: t.sum(dim).acc_sum(),
            BOp.ACC_MAX_LAST: lambda: t.acc_max_last(), BOp.ACC_MAX: lambda: t.amax(dim).acc_max(),
            BOp.ACC_RMS_LAST: lambda: t.acc_rms_last()}[acc]()
    ref = {"reduce_sum": lambda: x.sum(dim), "reduce_max": lambda: x.amax(dim),
           "rms": lambda: (x.square().sum(dim) / float(shape[dim])).sqrt()}[kind]()
    outs = b.finish([(tile, axis_dims)])
    return _pair(outs, [ref], [x])


@st.composite
def _softmax(draw, shape, dtype, acc) -> Scheduled:
    """softmax(Q @ K * scale) @ V by online softmax: the loop walks the keys (K's dim 1)."""
    m, d, n, dv = shape
    q, k = ir.input("Q", (m, d), dtype), ir.input("K", (d, n), dtype)
    v = ir.input("V", (n, dv), dtype)
    grid, axis_dims = draw(grid_maps((m, dv)))
    b = _builder(draw, grid, draw(st.sampled_from(divisors(n))))
    tq = b.input(q, _imap(axis_dims, {0: 0}))
    tk = b.input(k, None, 1)
    tv = b.input(v, _imap(axis_dims, {1: 1}), 0)
    scale = 1.0 / math.sqrt(d)
    s = (tq @ tk) * scale
    run_max = s.acc_max_last() if acc is BOp.ACC_MAX_LAST else s.amax(1).acc_max()
    p = (s - run_max).exp()
    tile = (p @ tv).acc_sum_rescale(run_max) / p.acc_sum_last_rescale(run_max)
    sk = (q @ k) * scale
    pk = (sk - sk.amax(1)).exp()
    outs = b.finish([(tile, axis_dims)])
    return _pair(outs, [(pk @ v) / pk.sum(1)], [q, k, v])


def block_schedules(kind: str, shape: Sequence[int], *, dtype="float16",
                    accumulator: BOp | None = None, dim: int = -1) -> st.SearchStrategy:
    """Random valid schedules (grid, imap, fmap, forloop, omap) of a small block graph.

    kinds and `shape`: "matmul" (M, K, N) or batched (B, M, K, N): X @ W, then maybe an epilogue;
    "rms_norm_matmul" (M, K, N): rms_norm(X) @ W with the norm accumulated next to the GEMM;
    "elementwise" (any shape): silu(X) * Y + X with Y broadcast; "reduce_sum" / "reduce_max" /
    "rms" (any shape, over `dim`); "softmax" (M, D, N, Dv): online softmax(Q @ K) @ V.
    Grid extents and trip counts are drawn among divisors, so every shape has schedules (at
    least grid (1, 1, 1) with forloop 1). `accumulator` picks the accumulator where the kind has
    several (`ACCUMULATORS_BY_KIND`); for "softmax" it picks the running max (acc_max_last or
    acc_max).
    Draws `Scheduled(graph, reference, block_graph)`.
    """
    if kind not in ACCUMULATORS_BY_KIND:
        raise ValueError(f"unknown block graph kind {kind!r}; use one of {BLOCK_KINDS}")
    shape = tuple(int(s) for s in shape)
    choices = ACCUMULATORS_BY_KIND[kind]
    if kind in ("reduce_sum", "reduce_max", "rms") and dim % len(shape) != len(shape) - 1:
        # the *_last accumulators reduce the last dim only
        choices = tuple(a for a in choices if a not in LAST_DIM_ACCUMULATORS)
    if accumulator is not None and accumulator not in choices:
        raise ValueError(f"{kind} over dim {dim} uses one of {[a.value for a in choices]}, "
                         f"not {accumulator}")
    if not choices:
        raise ValueError(f"{kind} has no accumulator for dim {dim}")
    accs = st.just(accumulator) if accumulator is not None else st.sampled_from(choices)
    build = {
        "matmul": lambda a: _matmul(shape, dtype, a),
        "rms_norm_matmul": lambda a: _matmul(shape, dtype, a, norm=True),
        "elementwise": lambda a: _elementwise(shape, dtype, a),
        "reduce_sum": lambda a: _reduction(shape, dtype, a, kind, dim),
        "reduce_max": lambda a: _reduction(shape, dtype, a, kind, dim),
        "rms": lambda a: _reduction(shape, dtype, a, kind, dim),
        "softmax": lambda a: _softmax(shape, dtype, a),
    }[kind]
    return accs.flatmap(build)
