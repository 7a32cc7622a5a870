"""The index-aware check's foundations, each against an independent oracle: element expressions
equal the reference interpreter, canonical reductions equal the literal sums and maxima they
were built from, index division is exact, and every elementwise entry is an identity."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mugraph import ir, workloads
from mugraph.ir import BOp, KOp, TOp
from mugraph.ir.interpret import interpret
from mugraph.ir.semantics import NUMPY_ELEMENTWISE
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.elements import Elements, modelled_ops
from mugraph.verify.abstract.evaluate import evaluate
from mugraph.verify.abstract.expr import Expr, Op
from mugraph.verify.abstract.indices import Aff, IVar, Refine, Unproved, divide
from mugraph.verify.abstract.lower import TOP_LOWER
from mugraph.verify.abstract.prove import element_pieces
from mugraph.verify.abstract.reductions import MAX, SUM, free_vars, reduction
from tests.ir.samples import all_samples

POINTS = 6   # index points checked per piece of an output


def _arrays(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {n.arg[0]: (rng.standard_normal(n.shape) * 0.5).astype(n.dtype.numpy).astype(np.float64)
            for n in graph.inputs}


def _points(piece, rng):
    """Up to POINTS assignments of the piece's index variables (all corners included)."""
    corners = [dict(zip(piece.free, c)) for c in
               itertools.product(*[(0, v.size - 1) for v in piece.free])][:POINTS // 2]
    rand = [{v: int(rng.integers(v.size)) for v in piece.free} for _ in range(POINTS // 2)]
    return corners + rand


def assert_elements_match_interpreter(graph, seed=0):
    """Every output's element expression, evaluated at sampled indices, is the interpreter's value."""
    arrays = _arrays(graph, seed)
    expected = interpret(graph, arrays, dtype="float64")
    rng = np.random.default_rng(seed)
    checked = 0
    for out, want in zip(graph.outputs, expected):
        for piece in element_pieces(Elements(), out, out):
            for env in _points(piece, rng):
                at = tuple(a.value(env) for a in piece.index)
                got = evaluate(piece.candidate, arrays, env)
                assert np.isclose(got, want[at], rtol=1e-9, atol=1e-12, equal_nan=True), \
                    (at, got, want[at], str(piece.candidate))
                checked += 1
    assert checked


@pytest.mark.parametrize("op,level,graph", all_samples(),
                         ids=[f"{level}-{op.name}" for op, level, _ in all_samples()])
def test_every_op_sample_lowers_to_what_the_interpreter_computes(op, level, graph):
    assert_elements_match_interpreter(graph)


_ATTN = dict(Q=(1, 64, 4), K=(1, 4, 128), V=(1, 128, 4))
TINY = {"rmsnorm_linear": dict(X=(2, 128), W=(128, 128)),
        "gated_mlp": dict(X=(2, 128), W1=(128, 128), W2=(128, 128)),
        "lora": dict(X=(2, 128), W=(128, 128), A=(128, 4), B=(4, 128)),
        "gqa": _ATTN, "gqa_safe": _ATTN, "qknorm_gqa": _ATTN,
        "ntrans": dict(H=(2, 16), X=(2, 16), alpha=(2, 16))}


@pytest.mark.parametrize("name", list(TINY))
def test_workload_references_lower_to_what_the_interpreter_computes(name):
    """The hand-written kernels at shapes small enough to evaluate element expressions exactly."""
    assert_elements_match_interpreter(workloads.get(name).build_reference(TINY[name]))


def _split_kv_softmax(rows=4, seq=16, d=2, splits=2, forloop=2):
    """Online softmax in two kernels with tiles of different heights (4 rows vs 2)."""
    Q, Kt, V = ir.input("Q", (rows, d)), ir.input("K", (d, seq)), ir.input("V", (seq, d))
    tile = seq // (splits * forloop)
    b = ir.BlockBuilder(grid=(splits, 1, 1), forloop=forloop)
    q, k, v = b.input(Q), b.input(Kt, imap=(1,), fmap=1), b.input(V, imap=(0,), fmap=0)
    s = q @ k
    m = s.acc_max_last()
    e = (s - m).exp()
    parts = b.finish([((e @ v).acc_sum_rescale(m), (1,)), (e.acc_sum_last_rescale(m), (1,)),
                      (m, (1,), "float32")])
    c = ir.BlockBuilder(grid=(rows // 2, 1, 1), forloop=splits)
    o, l, mt = (c.input(p, imap=(0,), fmap=1) for p in parts)
    mm = mt.acc_max()
    w = (mt - mm).exp()
    out = (o * w).acc_sum_rescale(mm) / (l * w).acc_sum_rescale(mm)
    assert tile >= 1
    return ir.KernelGraph(c.finish([(out, (0,))]), [Q, Kt, V])


def test_split_kv_online_softmax_lowers_exactly():
    assert_elements_match_interpreter(_split_kv_softmax())


def test_concat_transpose_reshape_broadcast_lower_exactly():
    x, y = ir.input("X", (3, 4), "float32"), ir.input("Y", (2, 4), "float32")
    both = ir.concat([x, y], 0)                                   # [5, 4]
    g = ir.KernelGraph([both.T.reshape((1, 4, 5)) + both.sum(0).reshape((1, 1, 4)).transpose(
        (0, 2, 1)).broadcast_to((1, 4, 5))])
    assert_elements_match_interpreter(g)


# ---- canonical reductions are the literal sums and maxima ---------------------------------------------
I, J, K = IVar("i", 3), IVar("j", 4), IVar("k", 2)
ARR = {"A": np.random.default_rng(1).standard_normal((12, 12)),
       "B": np.random.default_rng(2).standard_normal((12,))}


def _a(*index):
    return Expr(Op.ACCESS, (), ("A", tuple(index)))


def _b(index):
    return Expr(Op.ACCESS, (), ("B", (index,)))


def _literal(kind, bound, body, env):
    vals = [evaluate(body, ARR, env | dict(zip(bound, p)))
            for p in itertools.product(*(range(v.size) for v in bound))]
    return sum(vals) if kind == SUM else max(vals)


def _bodies():
    u, w = Aff.of(J), Aff.of(K)
    i = Aff.of(I)
    inner = reduction(SUM, [K], _a(i, u * 2 + w))
    return {
        "split loop": (SUM, [J, K], _a(i, u * 2 + w)),
        "hoisted factor": (SUM, [J], E.mul(_b(i), _a(i, u), _b(u + 1))),
        "separable": (SUM, [J, K], E.mul(_b(u), _a(i, w))),
        "absorbed inner sum": (SUM, [J], E.mul(_b(u), reduction(SUM, [K], _a(u, w + i)))),
        "polynomial": (SUM, [J], E.add(_a(i, u), E.mul(E.const(3), _b(i)), E.exp(_b(u)))),
        "inner sum in exp": (SUM, [J], E.exp(E.add(inner, _b(u)))),
        "max translated": (MAX, [J], E.add(_b(i), E.mul(E.const(2), _a(i, u)))),
        "max of max": (MAX, [J], reduction(MAX, [K], _a(i, u * 2 + w))),
        "prefix max": (MAX, [IVar("p", 4, Aff.of(J) + 1)], _b(Aff.of(IVar("p", 4, Aff.of(J) + 1)))),
    }


@pytest.mark.parametrize("case", list(_bodies()))
def test_canonical_reductions_are_identities(case):
    kind, bound, body = _bodies()[case]
    canonical = reduction(kind, bound, body)
    for env in [{I: i, J: j} for i in range(3) for j in range(4)]:
        want = _literal(kind, bound, body, env)
        assert np.isclose(evaluate(canonical, ARR, env), want, rtol=1e-12), (case, str(canonical))
    limits = {x for v in bound if v.limit is not None for x in v.limit.vars}
    assert free_vars(canonical) <= (free_vars(body) - set(bound)) | limits


def test_canonical_forms_meet():
    i = Aff.of(I)
    split = reduction(SUM, [J, K], _a(i, Aff.of(J) * 2 + Aff.of(K)))
    whole = reduction(SUM, [IVar("m", 8)], _a(i, Aff.of(IVar("m", 8))))
    assert split is whole                                         # split loops merge
    ab = reduction(SUM, [J], E.mul(_b(Aff.of(J)), reduction(SUM, [K], _a(Aff.of(J), Aff.of(K)))))
    ba = reduction(SUM, [K], reduction(SUM, [J], E.mul(_b(Aff.of(J)), _a(Aff.of(J), Aff.of(K)))))
    assert ab is ba                                               # order of summation
    assert reduction(SUM, [IVar("m", 8)], _a(i, Aff.of(IVar("m", 8)) + 1)) is not whole


@given(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3), st.integers(1, 8),
       st.integers(0, 7))
def test_index_division_is_exact_or_refuses(sizes, d, const):
    vs = [IVar(f"x{n}", s) for n, s in enumerate(sizes)]
    coeffs = [d ** n for n in range(len(vs))]
    e = Aff.build(dict(zip(vs, coeffs)), const % d)
    try:
        q, r = divide(e, d)
    except (Refine, Unproved):
        return
    for point in itertools.product(*(range(v.size) for v in vs)):
        env = dict(zip(vs, point))
        assert (q.value(env), r.value(env)) == divmod(e.value(env), d)


# ---- the tables --------------------------------------------------------------------------------------
def test_every_structural_op_has_an_index_meaning():
    assert {*KOp, *BOp} - modelled_ops() == set()


@pytest.mark.parametrize("op", list(TOP_LOWER), ids=lambda op: op.name)
def test_every_elementwise_entry_is_an_identity(op):
    """Each op's abstract expression, evaluated, is its NumPy meaning (so lowering by it is exact)."""
    rng = np.random.default_rng(0)
    arity = 2 if op in (TOp.ADD, TOp.SUB, TOp.MUL, TOp.DIV, TOp.POW, TOp.MAX, TOp.MIN) else 1
    arity = _arity(op, arity)
    arg = (-0.5, 0.7) if op is TOp.CLAMP else None
    for _ in range(20):
        values = np.abs(rng.standard_normal(arity)) + 0.1
        names = [E.var(f"x{n}") for n in range(arity)]
        expr = TOP_LOWER[op](names, arg)
        got = _eval_vars(expr, dict(zip(names, values)))
        want = float(NUMPY_ELEMENTWISE[op](*values, arg))
        assert np.isclose(got, want, rtol=1e-12), (op, got, want)


def _arity(op, default):
    from mugraph.ir.ops import BINARY
    ternary = getattr(__import__("mugraph.ir.ops", fromlist=["TERNARY"]), "TERNARY", frozenset())
    return 3 if op in ternary else 2 if op in BINARY else default


def _eval_vars(expr: Expr, values: dict) -> float:
    """Evaluate an abstract expression whose leaves are scalar variables."""
    env_arrays = {v.param[0]: np.array([x]) for v, x in values.items()}
    zero = Aff.constant(0)
    as_access = {v: Expr(Op.ACCESS, (), (v.param[0], (zero,))) for v in values}
    return evaluate(_replace(expr, as_access), env_arrays, {})


def _replace(e: Expr, mapping: dict) -> Expr:
    if e in mapping:
        return mapping[e]
    if not e.args:
        return e
    return Expr(e.op, tuple(_replace(a, mapping) for a in e.args), e.param)
