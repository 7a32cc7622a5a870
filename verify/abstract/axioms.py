"""The Z3 theory of abstract expressions: the encoding, the laws (each with a float soundness check).

Terms live in an uninterpreted sort `T`; constants are `num(r)` for an exact rational r, so
constant folding is Z3's real arithmetic; reduction sizes are concrete `Int`s, so
sum(a, sum(b, x)) = sum(a*b, x) folds the product and "k divides n" is decided on instantiation.
Every law is quantified with E-matching patterns (one axiom per direction it may be used in) and
carries a `check` that evaluates both sides on random floats, so the test suite rejects any law
that is false of real arithmetic. `sub(a, b)` is Mirage's subexpression predicate, decided under
the non-erasing laws only (see `axioms`). Queries use a deterministic `rlimit`, never a
wall-clock timeout, each in a fresh context, and read `unknown` (or `sat`) as "not proved".
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
import z3

from mugraph.verify.abstract.expr import Expr, Fn, Op, subterms

# ---- the signature ----------------------------------------------------------------------------------
T = z3.DeclareSort("T")
num = z3.Function("num", z3.RealSort(), T)
add = z3.Function("add", T, T, T)
mul = z3.Function("mul", T, T, T)
inv = z3.Function("inv", T, T)
exp = z3.Function("exp", T, T)
rsum = z3.Function("sum", z3.IntSort(), T, T)
maxr = z3.Function("maxr", z3.IntSort(), T, T)
vmax = z3.Function("max", T, T, T)
vmin = z3.Function("min", T, T, T)
power = z3.Function("pow", T, T, T)
concat = z3.Function("concat", T, T, T)          # right-nested: concat(a, concat(b, c))
sqrt = z3.Function("sqrt", T, T)                 # named: the pow laws mention it
sub = z3.Function("sub", T, T, z3.BoolSort())    # sub(a, b): a is a subexpression of b

x, y, z = z3.Consts("x y z", T)
a, b = z3.Reals("a b")
n, k = z3.Ints("n k")

# ---- laws ----------------------------------------------------------------------------------------------
Sides = tuple  # (lhs, rhs) values of one random instance

# Guards that stop merge and fold laws from minting ever larger numbers. An E-graph with a cycle
# (C = 0*x = sum(2, C)) lets sum(a, sum(b, x)) = sum(a*b, x) double a size thousands of times,
# and Z3's rlimit does not count big-number arithmetic: one query ran for minutes.
MAX_SIZE = 1 << 40
MAX_CONST = 1 << 64


def _real(value: Fraction) -> z3.ArithRef:
    return z3.RealVal(f"{value.numerator}/{value.denominator}")


@dataclass(frozen=True)
class Law:
    """One law: its quantified axioms (one per pattern direction) and its float soundness check.

    `abstraction` marks laws that hold of the abstraction, not of indexed tensors; their `check`
    evaluates the real law they abstract (e.g. sum_i(x_i * y) = (sum_i x_i) * y, y free of i).
    """

    name: str
    axioms: tuple
    check: Callable[[np.random.Generator], Sides]
    abstraction: bool = False


ERASING: set[str] = set()   # qids of equations whose sides hold different term variables


def _term_vars(e) -> frozenset:
    if z3.is_const(e) and e.sort() == T and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
        return frozenset({e.decl().name()})
    return frozenset().union(*(_term_vars(c) for c in e.children()))


def _eq(name: str, vs, lhs, rhs, when=None, both=False, erasing=False) -> tuple:
    """lhs = rhs (under `when`), used left to right, and right to left too when `both`.

    Erasing equations (detected, or flagged: a reduction of a constant folding to the constant
    makes the E-graph cyclic, C = sum(2, C), and the merge laws then loop) are left out of the
    theory the subexpression predicate is decided in.
    """
    body = lhs == rhs if when is None else z3.Implies(when, lhs == rhs)
    pats = [lhs, rhs] if both else [lhs]
    out = tuple(z3.ForAll(vs, body, patterns=[p], qid=f"{name}/{i}") for i, p in enumerate(pats))
    if erasing or _term_vars(lhs) != _term_vars(rhs):
        ERASING.update(q.qid() for q in out)
    return out


def _lemma(name: str, vs, fact, when, pattern) -> tuple:
    return (z3.ForAll(vs, z3.Implies(when, fact), patterns=[pattern], qid=name),)


def _small(value):
    return z3.And(value <= MAX_CONST, value >= -MAX_CONST)


def _rand(rng, *shape):
    return rng.standard_normal(shape) if shape else float(rng.standard_normal())


def _pos(rng, *shape):
    return np.abs(_rand(rng, *shape)) + 0.1


def _sizes(rng):
    return int(rng.integers(1, 6)), int(rng.integers(1, 6))


def _check_sum_merge(rng) -> Sides:
    p, q = _sizes(rng)
    v = _rand(rng, p, q)
    return v.sum(axis=1).sum(), v.reshape(-1).sum()


def _check_sum_split(rng) -> Sides:
    """Witness of sum(k, x) being part of sum(n, x) when k | n: the n-sum of k-partial sums."""
    p, q = _sizes(rng)
    v = _rand(rng, p * q)
    return v.reshape(p, q).sum(axis=1).sum(), v.sum()


def _check_maxr_merge(rng) -> Sides:
    p, q = _sizes(rng)
    v = _rand(rng, p, q)
    return v.max(axis=1).max(), v.reshape(-1).max()


def _check_maxr_split(rng) -> Sides:
    p, q = _sizes(rng)
    v = _rand(rng, p * q)
    return v.reshape(p, q).max(axis=1).max(), v.max()


def _check_int_pow(rng) -> Sides:
    e, v = int(rng.integers(2, 6)), _rand(rng)
    return v ** e, v ** (e - 1) * v


def _check_neg_pow(rng) -> Sides:
    e, v = -float(rng.choice([1, 2, 3, 0.5])), _pos(rng)
    return v ** e, 1.0 / v ** (-e)


_RING = [
    Law("add-comm", _eq("add-comm", [x, y], add(x, y), add(y, x)),
        lambda r: ((u := _rand(r)) + (v := _rand(r)), v + u)),
    Law("mul-comm", _eq("mul-comm", [x, y], mul(x, y), mul(y, x)),
        lambda r: ((u := _rand(r)) * (v := _rand(r)), v * u)),
    Law("add-assoc", _eq("add-assoc", [x, y, z], add(add(x, y), z), add(x, add(y, z)), both=True),
        lambda r: ((u := _rand(r)) + (v := _rand(r)) + (w := _rand(r)), u + (v + w))),
    Law("mul-assoc", _eq("mul-assoc", [x, y, z], mul(mul(x, y), z), mul(x, mul(y, z)), both=True),
        lambda r: ((u := _rand(r)) * (v := _rand(r)) * (w := _rand(r)), u * (v * w))),
    Law("distribute", _eq("distribute", [x, y, z], mul(x, add(y, z)), add(mul(x, y), mul(x, z)), both=True),
        lambda r: ((u := _rand(r)) * ((v := _rand(r)) + (w := _rand(r))), u * v + u * w)),
    Law("add-zero", _eq("add-zero", [a, x], add(num(a), x), x, when=a == 0),
        lambda r: (0.0 + (u := _rand(r)), u)),
    Law("mul-one", _eq("mul-one", [a, x], mul(num(a), x), x, when=a == 1),
        lambda r: (1.0 * (u := _rand(r)), u)),
    Law("mul-zero", _eq("mul-zero", [a, x], mul(num(a), x), num(0), when=a == 0),
        lambda r: (0.0 * _rand(r), 0.0)),
    Law("fold-add", _eq("fold-add", [a, b], add(num(a), num(b)), num(a + b), when=_small(a + b)),
        lambda r: ((u := _rand(r)) + (v := _rand(r)), u + v)),
    Law("fold-mul", _eq("fold-mul", [a, b], mul(num(a), num(b)), num(a * b), when=_small(a * b)),
        lambda r: ((u := _rand(r)) * (v := _rand(r)), u * v)),
    Law("add-self", _eq("add-self", [x], add(x, x), mul(num(2), x)),
        lambda r: ((u := _rand(r)) + u, 2.0 * u)),
    Law("like-terms", _eq("like-terms", [a, x], add(mul(num(a), x), x), mul(num(a + 1), x)),
        lambda r: ((c := _rand(r)) * (u := _rand(r)) + u, (c + 1) * u)),
    Law("like-terms-2", _eq("like-terms-2", [a, b, x], add(mul(num(a), x), mul(num(b), x)), mul(num(a + b), x)),
        lambda r: ((c := _rand(r)) * (u := _rand(r)) + (d := _rand(r)) * u, (c + d) * u)),
]

_DIVISION = [
    Law("fold-inv", _eq("fold-inv", [a], inv(num(a)), num(1 / a), when=a != 0)
        + _eq("fold-inv-back", [a], num(a), inv(num(1 / a)), when=a != 0),
        lambda r: (1.0 / (u := _pos(r)), 1.0 / u)),
    Law("inv-mul", _eq("inv-mul", [x, y], inv(mul(x, y)), mul(inv(x), inv(y)), both=True),
        lambda r: (1.0 / ((u := _pos(r)) * (v := _pos(r))), (1.0 / u) * (1.0 / v))),
    Law("inv-inv", _eq("inv-inv", [x], inv(inv(x)), x),
        lambda r: (1.0 / (1.0 / (u := _pos(r))), u)),
]

_SUMS = [
    Law("sum-merge", _eq("sum-merge", [n, k, x], rsum(n, rsum(k, x)), rsum(n * k, x),
                          when=z3.And(n >= 1, k >= 1, n * k <= MAX_SIZE)),
        _check_sum_merge),
    Law("sum-one", _eq("sum-one", [n, x], rsum(n, x), x, when=n == 1),
        lambda r: (np.sum(np.array([u := _rand(r)])), u)),
    Law("sum-zero", _eq("sum-zero", [n, a], rsum(n, num(a)), num(0), when=a == 0, erasing=True),
        lambda r: (np.zeros(int(r.integers(1, 6))).sum(), 0.0)),
    Law("sum-add", _eq("sum-add", [n, x, y], rsum(n, add(x, y)), add(rsum(n, x), rsum(n, y)), both=True),
        lambda r: (((u := _rand(r, 4)) + (v := _rand(r, 4))).sum(), u.sum() + v.sum())),
    Law("sum-mul", _eq("sum-mul", [n, x, y], rsum(n, mul(x, y)), mul(rsum(n, x), y), both=True),
        lambda r: (((u := _rand(r, 4)) * (v := _rand(r))).sum(), u.sum() * v), abstraction=True),
    Law("sum-split", _lemma("sum-split", [n, k, x], sub(rsum(k, x), rsum(n, x)),
                            z3.And(k >= 1, n >= k, n % k == 0),
                            z3.MultiPattern(rsum(k, x), rsum(n, x))), _check_sum_split),
]

_EXP = [
    Law("exp-add", _eq("exp-add", [x, y], exp(add(x, y)), mul(exp(x), exp(y)), both=True),
        lambda r: (np.exp((u := _rand(r)) + (v := _rand(r))), np.exp(u) * np.exp(v))),
    Law("exp-zero", _eq("exp-zero", [a], exp(num(a)), num(1), when=a == 0), lambda r: (np.exp(0.0), 1.0)),
    Law("exp-neg", _eq("exp-neg", [a, x], exp(mul(num(a), x)), inv(exp(x)), when=a == -1)
        + _eq("exp-neg-back", [x], inv(exp(x)), exp(mul(num(-1), x))),
        lambda r: (np.exp(-(u := _rand(r))), 1.0 / np.exp(u))),
]


def _ac(f, name: str, ref) -> list[Law]:
    return [
        Law(f"{name}-comm", _eq(f"{name}-comm", [x, y], f(x, y), f(y, x)),
            lambda r: (ref(u := _rand(r), v := _rand(r)), ref(v, u))),
        Law(f"{name}-assoc", _eq(f"{name}-assoc", [x, y, z], f(f(x, y), z), f(x, f(y, z)), both=True),
            lambda r: (ref(ref(u := _rand(r), v := _rand(r)), w := _rand(r)), ref(u, ref(v, w)))),
        Law(f"{name}-idem", _eq(f"{name}-idem", [x], f(x, x), x), lambda r: (ref(u := _rand(r), u), u)),
    ]


_MAX = [
    Law("maxr-merge", _eq("maxr-merge", [n, k, x], maxr(n, maxr(k, x)), maxr(n * k, x),
                          when=z3.And(n >= 1, k >= 1, n * k <= MAX_SIZE)), _check_maxr_merge),
    Law("maxr-one", _eq("maxr-one", [n, x], maxr(n, x), x, when=n == 1),
        lambda r: (np.max((u := _rand(r, 1))), u[0])),
    Law("maxr-const", _eq("maxr-const", [n, a], maxr(n, num(a)), num(a), erasing=True),
        lambda r: (np.max(np.full(4, u := _rand(r))), u)),
    Law("maxr-scale", _eq("maxr-scale", [n, a, x], maxr(n, mul(num(a), x)), mul(num(a), maxr(n, x)), when=a > 0,
                          both=True),
        lambda r: (np.max((c := _pos(r)) * (u := _rand(r, 4))), c * np.max(u))),
    Law("maxr-split", _lemma("maxr-split", [n, k, x], sub(maxr(k, x), maxr(n, x)),
                             z3.And(k >= 1, n >= k, n % k == 0),
                             z3.MultiPattern(maxr(k, x), maxr(n, x))), _check_maxr_split),
    *_ac(vmax, "max", max), *_ac(vmin, "min", min),
]


_POW = [
    Law("pow-int", _eq("pow-int", [a, x], power(x, num(a)), mul(power(x, num(a - 1)), x),
                       when=z3.And(z3.IsInt(a), a >= 2)), _check_int_pow),
    Law("pow-one", _eq("pow-one", [a, x], power(x, num(a)), x, when=a == 1),
        lambda r: ((u := _rand(r)) ** 1.0, u)),
    Law("pow-zero", _eq("pow-zero", [a, x], power(x, num(a)), num(1), when=a == 0),
        lambda r: (_rand(r) ** 0.0, 1.0)),
    Law("pow-neg", _eq("pow-neg", [a, x], power(x, num(a)), inv(power(x, num(-a))), when=a < 0),
        _check_neg_pow),
    Law("pow-half", _eq("pow-half", [a, x], power(x, num(a)), sqrt(x), when=a == _real(Fraction(1, 2))),
        lambda r: ((u := _pos(r)) ** 0.5, math.sqrt(u))),
]

LAWS: list[Law] = _RING + _DIVISION + _SUMS + _EXP + _MAX + _POW


# ---- the subexpression predicate ---------------------------------------------------------------------
def _argument_facts(f, arity: int, prefix=()) -> list:
    """Each argument of f is a subexpression of the term f builds (Mirage's x <= f(x, ...))."""
    args = list(z3.Consts(" ".join(f"t{i}" for i in range(arity)), T)) if arity > 1 else \
        [z3.Const("t0", T)]
    term = f(*prefix, *args)
    facts = z3.And([sub(v, term) for v in args]) if arity > 1 else sub(args[0], term)
    return [z3.ForAll(list(prefix) + args, facts, patterns=[term], qid=f"sub-args-{f.name()}")]


def _predicate_axioms() -> list:
    axioms = [z3.ForAll([x], sub(x, x), patterns=[sub(x, x)], qid="sub-refl"),
              z3.ForAll([x, y, z], z3.Implies(z3.And(sub(x, y), sub(y, z)), sub(x, z)),
                        patterns=[z3.MultiPattern(sub(x, y), sub(y, z))], qid="sub-trans")]
    for f, arity in ((add, 2), (mul, 2), (inv, 1), (exp, 1), (vmax, 2), (vmin, 2), (power, 2),
                     (concat, 2), (sqrt, 1)):
        axioms += _argument_facts(f, arity)
    for f in (rsum, maxr):
        axioms += _argument_facts(f, 1, prefix=(n,))
    return axioms


# ---- opaque functions, created on first use -------------------------------------------------------
_FUNCTIONS: dict[tuple, z3.FuncDeclRef] = {}
_DYNAMIC_AXIOMS: list = []


def opaque(kind: Fn, extra: tuple, arity: int) -> z3.FuncDeclRef:
    """The uninterpreted function of an opaque op (with its argument facts registered)."""
    if kind is Fn.SQRT and not extra and arity == 1:
        return sqrt
    key = (kind, extra, arity)
    if key not in _FUNCTIONS:
        name = kind.value + "".join(f"_{e}" for e in extra) + f"/{arity}"
        f = z3.Function(name, *([T] * arity), T)
        _FUNCTIONS[key] = f
        _DYNAMIC_AXIOMS.extend(_argument_facts(f, arity))
    return _FUNCTIONS[key]


_STATIC_AXIOMS = [ax for law in LAWS for ax in law.axioms] + _predicate_axioms()


def axioms(erasing: bool = True) -> list:
    """Every axiom: the laws, the subexpression predicate, and the opaque functions' facts.

    `erasing=False` leaves out the equations that drop a term (0*x = 0, x**0 = 1) and the two
    that fold a reduction of a constant (sum(n, 0) = 0, maxr(n, c) = c: they make the E-graph
    cyclic and the merge laws loop). The subexpression predicate needs that: with 0*x = 0,
    x = x + 0*c makes every term c a subexpression of every x. Without them both sides of every
    law hold the same variables, so a proved "a is a subexpression of b" keeps its meaning.
    """
    every = _STATIC_AXIOMS + _DYNAMIC_AXIOMS
    return every if erasing else [q for q in every if q.qid() not in ERASING]


# ---- encoding ----------------------------------------------------------------------------------------------
def _leaf(e: Expr):
    if e.op is Op.VAR:
        name, shape = e.param
        return z3.Const(f"{name}{list(shape)}", T)
    if e.op is Op.ACCESS:
        name, index = e.param
        return _tensor(name, len(index))(*[index_term(a) for a in index])
    if isinstance(e.param, Fraction):
        return num(_real(e.param))
    return z3.Const(f"const_{e.param}", T)


def _fold(f, args):
    result = args[0]
    for arg in args[1:]:
        result = f(result, arg)
    return result


def _fold_right(f, args):
    result = args[-1]
    for arg in reversed(args[:-1]):
        result = f(arg, result)
    return result


ENCODE = {
    Op.ADD: lambda e, s: _fold(add, s),
    Op.MUL: lambda e, s: _fold(mul, s),
    Op.INV: lambda e, s: inv(s[0]),
    Op.EXP: lambda e, s: exp(s[0]),
    Op.SUM: lambda e, s: rsum(z3.IntVal(e.param), s[0]),
    Op.MAXR: lambda e, s: maxr(z3.IntVal(e.param), s[0]),
    Op.MAX: lambda e, s: _fold(vmax, s),
    Op.MIN: lambda e, s: _fold(vmin, s),
    Op.POW: lambda e, s: power(s[0], s[1]),
    Op.FN: lambda e, s: opaque(e.param[0], tuple(e.param[1:]), len(s))(*s),
    Op.CONCAT: lambda e, s: _fold_right(concat, s),
    Op.REDUCE: lambda e, s: _reduction(e),
}


# ---- the index-aware check's terms: tensors of integer indices, reductions of a body --------------
def _tensor(name: str, rank: int) -> z3.FuncDeclRef:
    """One uninterpreted function per input tensor: its elements, by integer index."""
    return _declared(("tensor", name, rank),
                     lambda: z3.Function(f"tensor#{len(_FUNCTIONS)} {name}", *[z3.IntSort()] * rank, T))


def _reduction(e: Expr) -> z3.ExprRef:
    """One opaque value per canonical reduction (`reductions.py`): Z3 may take two reductions
    as equal only when they are the same canonical form, which is when they are equal. (No
    congruence over bodies: a body's bound variables would be Z3 constants, and equal bodies at
    one value of them say nothing about the rest of the range.)"""
    return _declared(("reduce", e), lambda: z3.Const(f"reduce#{len(_FUNCTIONS)}", T))


def _declared(key, make):
    """A Z3 symbol per key; names carry a serial number, so distinct keys never share a symbol."""
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = make()
    return _FUNCTIONS[key]


def index_var(v) -> z3.ArithRef:
    """The Z3 integer of an index variable: one per variable and range."""
    return _declared(("index", v), lambda: z3.Int(f"#{len(_FUNCTIONS)} {v!r}"))


def index_term(a) -> z3.ArithRef:
    """The Z3 integer term of an affine index."""
    return z3.Sum([z3.IntVal(a.const)] + [c * index_var(v) for v, c in a.terms])


def index_ranges(variables) -> list:
    """0 <= v < size (and v < limit) for every index variable: the hypotheses of an index proof."""
    facts = []
    for v in variables:
        facts += [index_var(v) >= 0, index_var(v) < v.size]
        if v.limit is not None:
            facts.append(index_var(v) < index_term(v.limit))
    return facts

_ENCODED: "weakref.WeakKeyDictionary[Expr, z3.ExprRef]" = weakref.WeakKeyDictionary()


def encode(e: Expr) -> z3.ExprRef:
    """The Z3 term of an abstract expression (memoised)."""
    for t in subterms([e]):
        if t not in _ENCODED:
            _ENCODED[t] = _leaf(t) if not t.args else ENCODE[t.op](t, [_ENCODED[u] for u in t.args])
    return _ENCODED[e]


# ---- queries --------------------------------------------------------------------------------------------------
_CONJUNCTIONS: dict = {}   # erasing -> (axiom count, And(axioms)); rebuilt as opaque functions appear


def _all_axioms(erasing: bool) -> z3.BoolRef:
    current = axioms(erasing)
    found = _CONJUNCTIONS.get(erasing)
    if found is None or found[0] != len(current):
        found = _CONJUNCTIONS[erasing] = (len(current), z3.And(current))
    return found[1]


def _solve(goal: z3.BoolRef, rlimit: int, erasing: bool = True, hypotheses=()) -> bool:
    """Whether the axioms (and `hypotheses`) entail `goal`. Each query gets a fresh Z3 context:
    E-matching follows term ids, so a shared context would make answers depend on the queries
    asked before."""
    ctx = z3.Context()
    s = z3.Solver(ctx=ctx)
    s.set("rlimit", int(rlimit))
    s.set("smt.mbqi", False)   # E-matching only: MBQI never proves these goals, it only burns budget
    s.add(_all_axioms(erasing).translate(ctx))
    for fact in hypotheses:
        s.add(fact.translate(ctx))
    s.add(z3.Not(goal).translate(ctx))
    return s.check() == z3.unsat


def z3_equal(lhs: Expr, rhs: Expr, rlimit: int, hypotheses=()) -> bool:
    """Z3 proves lhs = rhs from all the axioms (and `hypotheses`) within `rlimit` (unknown or
    sat: not proved)."""
    return _solve(encode(lhs) == encode(rhs), rlimit, hypotheses=hypotheses)


def z3_subexpression(e: Expr, targets, rlimit: int) -> bool:
    """Z3 proves `e` a subexpression of one of `targets` under the non-erasing laws, within `rlimit`."""
    term = encode(e)
    return _solve(z3.Or([sub(term, encode(t)) for t in targets]), rlimit, erasing=False)
