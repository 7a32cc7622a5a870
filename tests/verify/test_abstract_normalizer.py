"""The fast normaliser against Z3 (the judge) and against a model of the axioms, on random expressions.

Soundness: whenever normal forms are equal, Z3 proves the expressions equal; whenever the fast
path says "part of", Z3 proves the candidate's normal form a subexpression of the spec polynomial
it names (a polynomial inside the normal form of a spec subterm); and both
sides agree numerically in the uniform model (sum(n, x) = n*x, maxr(n, x) = x), where every law
holds. The default run draws a few hundred expressions; MUGRAPH_ABSTRACT_EXAMPLES=3000 draws
thousands, and MUGRAPH_ABSTRACT_REPORT=3000 prints the agreement and completeness-gap figures.
"""
from __future__ import annotations

import math
import os
import random
from fractions import Fraction

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mugraph.verify.abstract import axioms as A
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.expr import Expr, Fn, Op
from mugraph.verify.abstract.query import _z3_targets, spec_index

EXAMPLES = int(os.environ.get("MUGRAPH_ABSTRACT_EXAMPLES", "0")) or None
RLIMIT = 1_000_000          # generous: positive proofs here take ~1e4-1e5
SEEDS = st.integers(0, 2 ** 31)

# ---- random expressions and rewrites ------------------------------------------------------------
VARS = [E.var(n) for n in "xyz"]
CONSTS = [E.const(c) for c in (1, 2, -1, 0.5, 3)]
UNARY = [E.neg, E.exp, E.inv, E.sqrt, lambda a: E.fn(Fn.TANH, a)]
BINARY = [E.add, E.mul, E.sub, E.div, E.maximum]


def random_expr(rng: random.Random, depth: int = 3) -> Expr:
    """A random term over x, y, z and a few constants (about 60 % of draws are depth 3)."""
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(VARS) if rng.random() < 0.75 else rng.choice(CONSTS)
    roll = rng.random()
    if roll < 0.15:
        head = rng.choice([E.reduce_sum, E.reduce_max])
        return head(rng.choice([2, 4]) if head is E.reduce_max else rng.choice([2, 3, 4]),
                    random_expr(rng, depth - 1))
    if roll < 0.35:
        return rng.choice(UNARY)(random_expr(rng, depth - 1))
    if roll < 0.4:
        return E.power(random_expr(rng, depth - 1), E.const(rng.choice([2, -1, 0.5, 1.5])))
    return rng.choice(BINARY)(random_expr(rng, depth - 1), random_expr(rng, depth - 1))


def _rewrites(e: Expr) -> list:
    """Equations of the theory applicable at the root of `e`, each as a thunk giving the result."""
    op, a, out = e.op, e.args, []
    if op in (Op.ADD, Op.MUL, Op.MAX) and len(a) == 2:
        f = {Op.ADD: E.add, Op.MUL: E.mul, Op.MAX: E.maximum}[op]
        out.append(lambda: f(a[1], a[0]))
        if a[1].op is op and len(a[1].args) == 2:
            out.append(lambda: f(f(a[0], a[1].args[0]), a[1].args[1]))
    if op is Op.MUL and a[1].op is Op.ADD and len(a[1].args) == 2:
        out.append(lambda: E.add(a[0] * a[1].args[0], a[0] * a[1].args[1]))
    if op is Op.EXP and a[0].op is Op.ADD and len(a[0].args) == 2:
        out.append(lambda: E.exp(a[0].args[0]) * E.exp(a[0].args[1]))
    if op is Op.SUM and a[0].op in (Op.MUL, Op.ADD) and len(a[0].args) == 2:
        u, v = a[0].args
        out.append(lambda: E.reduce_sum(e.param, u) * v if a[0].op is Op.MUL else
                   E.reduce_sum(e.param, u) + E.reduce_sum(e.param, v))
    if op in (Op.SUM, Op.MAXR) and e.param == 4:
        head = E.reduce_sum if op is Op.SUM else E.reduce_max
        out.append(lambda: head(2, head(2, a[0])))
    if op is Op.INV and a[0].op is Op.MUL and len(a[0].args) == 2:
        out.append(lambda: E.inv(a[0].args[0]) * E.inv(a[0].args[1]))
    out.append(lambda: E.const(1) * e)
    return out


def _replace(e: Expr, target: Expr, new: Expr) -> Expr:
    if e is target:
        return new
    if not e.args:
        return e
    return Expr(e.op, tuple(_replace(a, target, new) for a in e.args), e.param)


def rewrite(rng: random.Random, e: Expr, steps: int = 2) -> Expr:
    """`e` after `steps` random law applications at random positions (equal under the axioms)."""
    for _ in range(steps):
        target = rng.choice(E.subterms([e]))
        e = _replace(e, target, rng.choice(_rewrites(target))())
    return e


def random_part(rng: random.Random, e: Expr):
    """A random product of factors of one term somewhere inside e's normal form (or None)."""
    q = rng.choice(N.nested_polys(N.normalize(e)))
    terms = [t for t in q.terms if t.num]
    if not terms:
        return None
    t = rng.choice(terms)
    atoms = rng.sample(list(t.num), rng.randint(1, len(t.num)))
    size = rng.choice([d for d in range(1, t.size + 1) if t.size % d == 0])
    return N.render(N.Poly((N.make_term(1, size, tuple(atoms), None, 1, (), None),)))


def random_candidate(rng: random.Random, spec: Expr):
    """What the search would ask about: a normalised subterm, a part, or an unrelated term."""
    roll = rng.random()
    if roll < 0.35:
        return N.render(N.normalize(rng.choice(E.subterms([spec]))))
    if roll < 0.7:
        return random_part(rng, spec)
    return random_expr(rng, 2)


# ---- the uniform model: every law holds in it ---------------------------------------------------------
def _opaque(kind, *vals) -> float:
    h = sum((i + 1.7) * v for i, v in enumerate(vals))
    return math.sin(h + len(kind.value)) + 2.0


UNIFORM = {
    Op.ADD: lambda e, v: math.fsum(v),
    Op.MUL: lambda e, v: math.prod(v),
    Op.INV: lambda e, v: 1.0 / v[0],
    Op.EXP: lambda e, v: math.exp(v[0]),
    Op.SUM: lambda e, v: e.param * v[0],
    Op.MAXR: lambda e, v: v[0],
    Op.MAX: lambda e, v: max(v),
    Op.MIN: lambda e, v: min(v),
    Op.POW: lambda e, v: _uniform_pow(e, v),
    Op.FN: lambda e, v: _opaque(e.param[0], *v),
    Op.CONCAT: lambda e, v: _opaque(Op.CONCAT, *v),
}


def _uniform_pow(e, v) -> float:
    k = e.args[1].param if e.args[1].op is Op.CONST else None
    if k is not None and k.denominator == 1 and abs(k) <= N.MAX_INT_POWER:
        return v[0] ** int(k)
    if k is not None and abs(k) == Fraction(1, 2):
        root = _opaque(Fn.SQRT, v[0])
        return root if k > 0 else 1.0 / root
    return _opaque(Fn.LOG, *v)  # an opaque pow, distinct from every named function


def uniform_value(e: Expr, env: dict) -> float:
    values: dict = {}
    for t in E.subterms([e]):
        if t.op is Op.VAR:
            values[t] = env[t.param[0]]
        elif t.op is Op.CONST:
            values[t] = float(t.param)
        elif t.op is Op.FN and t.param[0] is Fn.SQRT:
            values[t] = _opaque(Fn.SQRT, values[t.args[0]])
        else:
            values[t] = UNIFORM[t.op](t, [values[a] for a in t.args])
    return values[e]


def _agree(a: Expr, b: Expr, rng: random.Random) -> bool | None:
    env = {n: rng.uniform(0.5, 1.5) for n in "xyz"}
    try:
        u, v = uniform_value(a, env), uniform_value(b, env)
    except (ZeroDivisionError, OverflowError):
        return None
    if not (math.isfinite(u) and math.isfinite(v)):
        return None
    return math.isclose(u, v, rel_tol=1e-7, abs_tol=1e-9)


# ---- properties ---------------------------------------------------------------------------------------------
@settings(max_examples=EXAMPLES or 400)
@given(SEEDS)
def test_normal_forms_are_sound_in_the_uniform_model(seed):
    rng = random.Random(seed)
    e = random_expr(rng, 4)
    p = N.normalize(e)
    assume(p is not None)
    agree = _agree(e, N.render(p), rng)
    assume(agree is not None)
    assert agree, f"{e}  vs normal form  {N.render(p)}"


@settings(max_examples=EXAMPLES or 400)
@given(SEEDS)
def test_normal_forms_are_idempotent(seed):
    e = random_expr(random.Random(seed), 4)
    p = N.normalize(e)
    assume(p is not None)
    assert N.normalize(N.render(p)) is p, f"{e}: {N.render(p)}"


@settings(max_examples=EXAMPLES or 150)
@given(SEEDS)
def test_equal_normal_forms_are_proved_by_z3(seed):
    rng = random.Random(seed)
    e = random_expr(rng)
    other = N.render(N.normalize(e)) if rng.random() < 0.5 else rewrite(rng, e)
    assume(N.normalize(e) is N.normalize(other) and other is not e)
    assert A.z3_equal(e, other, RLIMIT) or A.z3_equal(e, other, 3 * RLIMIT), f"{e} == {other}"


@settings(max_examples=EXAMPLES or 150)
@given(SEEDS)
def test_fast_path_parts_are_proved_by_z3(seed):
    rng = random.Random(seed)
    spec = random_expr(rng)
    c = random_candidate(rng, spec)
    assume(c is not None and N.normalize(c) is not None and not N.is_constant(N.normalize(c)))
    q = spec_index([spec]).witness(N.normalize(c))
    assume(q is not None)
    target, form = N.render(q), N.render(N.normalize(c))
    assert _is_subterm(target, N.render(N.normalize(_source(spec, q))))
    assert A.z3_subexpression(form, [target], RLIMIT), f"{form} <= {target} (in {spec})"


def _source(spec: Expr, q) -> Expr:
    """A raw subterm of the spec whose normal form holds q."""
    return next(s for s in E.subterms([spec]) if q in N.nested_polys(N.normalize(s)))


def _is_subterm(small: Expr, big: Expr) -> bool:
    return small in set(E.subterms([big]))


@settings(max_examples=EXAMPLES or 300)
@given(SEEDS)
def test_the_normaliser_sees_through_law_applications(seed):
    """Completeness, loosely: one law applied at a random place does not change the normal form."""
    rng = random.Random(seed)
    e = random_expr(rng)
    assume(N.normalize(e) is not None)
    assert N.normalize(rewrite(rng, e, steps=1)) is N.normalize(e)


# ---- the figures -------------------------------------------------------------------------------------------
def agreement_report(count: int, seed: int = 0) -> dict:
    """Normaliser vs Z3 on `count` random equality pairs and subexpression questions."""
    rng, eq, sub = random.Random(seed), _counts(), _counts()
    for _ in range(count):
        e = random_expr(rng)
        if N.normalize(e) is None:
            continue
        other = rewrite(rng, e) if rng.random() < 0.7 else random_expr(rng)
        _tally(eq, N.normalize(e) is N.normalize(other),
               lambda budget: A.z3_equal(e, other, budget))
        c = random_candidate(rng, e)
        if c is None or N.normalize(c) is None or N.is_constant(N.normalize(c)):
            continue
        q = spec_index([e]).witness(N.normalize(c))
        form = N.render(N.normalize(c))
        _tally(sub, q is not None, lambda budget: A.z3_subexpression(
            form, [N.render(q)] if q is not None else _z3_targets((e,)), budget))
    return {"equal": eq, "subexpression": sub}


def _counts() -> dict:
    return {"fast yes": 0, "z3 proves fast yes": 0, "fast no": 0, "z3 proves fast no": 0}


def _tally(counts: dict, fast: bool, prove) -> None:
    counts["fast yes" if fast else "fast no"] += 1
    if fast:
        counts["z3 proves fast yes"] += prove(RLIMIT) or prove(3 * RLIMIT)
    else:
        counts["z3 proves fast no"] += prove(A_DEFAULT_RLIMIT)


A_DEFAULT_RLIMIT = 200_000


def test_agreement_report():
    """Every normaliser "yes" is a theorem for Z3. Ten draws in the suite (a few seconds); set
    MUGRAPH_ABSTRACT_REPORT=<count> and run with -s for the measured agreement figures."""
    report = agreement_report(int(os.environ.get("MUGRAPH_ABSTRACT_REPORT") or 10))
    for kind, c in report.items():
        print(f"\n{kind}: normaliser yes {c['fast yes']}, Z3 proves {c['z3 proves fast yes']} of them;"
              f" normaliser no {c['fast no']}, Z3 proves {c['z3 proves fast no']} of them "
              f"(completeness gap)")
        assert c["z3 proves fast yes"] == c["fast yes"]
