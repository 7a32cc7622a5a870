"""The fast normaliser: abstract expressions to a canonical polynomial form, and "is part of" on it.

A normal form is a `Poly`: a sum of `Term`s with like terms combined. A term is
`coeff * sum(size, num atoms * exp(E)) / sum(den_size, den atoms [* exp(D)])`: + and * are
flattened and sorted, products are distributed, constants are folded exactly, nested sums are
merged (sizes multiply), a sum's body is pulled apart by the abstraction's law
sum(n, x*y) = sum(n, x)*y (so a term carries one reduction size, not one per factor), all
exponentials of a term merge into one exp of a polynomial, inverses of products split, and
nested max-reductions merge; a sum under a division stays whole as a group, with its common
factor taken out and its first coefficient made 1. Every step is an instance of a law in
`axioms.py`; the Hypothesis tests cross-check the normaliser against Z3. "Is part of" (the search's
pruning question) is a factor of a term, a sub-sum, or a sub-sum times a factor, anywhere inside
a normal form. Two deliberate incompletenesses keep the abstraction
from collapsing: numerator and denominator factors never cancel (x/x stays), and an exp that is
the only factor under a denominator sum stays there (so softmax e/sum(n, e) does not become
1/sum(n, 1)).
"""
from __future__ import annotations

import weakref
from fractions import Fraction

from mugraph.verify.abstract.expr import Expr, Fn, Interned, Op, stable_digest
from mugraph.verify.abstract import expr as E

MAX_TERMS = 4096        # a product expanding past this many terms is left to Z3
MAX_INT_POWER = 8       # x ** k for integer |k| <= this expands into a product

# An atom whose kind is Op.ADD is a polynomial kept whole: it only occurs in denominators.
GROUP = Op.ADD


class Overflow(Exception):
    """A polynomial grew past MAX_TERMS: the fast path gives up (the caller falls back or says no)."""


# ---- the normal-form records ---------------------------------------------------------------------
class Atom(Interned):
    """A factor without algebraic laws of its own: a variable, max, opaque function, or a group."""

    __slots__ = ("kind", "param", "args", "digest")

    def __new__(cls, kind: Op, param=None, args: tuple = ()):
        def build(obj):
            digest = stable_digest("atom", kind.value, E._param_text(param),
                                   tuple(a.digest for a in args))
            for name, value in (("kind", kind), ("param", param), ("args", args), ("digest", digest)):
                object.__setattr__(obj, name, value)

        return cls._intern((kind, param, tuple(args)), build)

    @classmethod
    def _rebuild(cls, kind, param, args):
        return cls(kind, param, args)


class Term(Interned):
    """coeff * sum(size, num * exp(exp)) / sum(den_size, den * exp(den_exp)); see the module doc."""

    __slots__ = ("coeff", "size", "num", "exp", "den_size", "den", "den_exp", "mono", "mono_digest",
                 "digest")

    def __new__(cls, coeff: Fraction, size: int, num: tuple, exp, den_size: int, den: tuple, den_exp):
        mono = (size, num, exp, den_size, den, den_exp)

        def build(obj):
            mono_digest = stable_digest("term", size, den_size, tuple(a.digest for a in num),
                                        tuple(a.digest for a in den), _digest(exp), _digest(den_exp))
            values = (coeff, size, num, exp, den_size, den, den_exp, mono, mono_digest,
                      stable_digest(mono_digest, str(coeff)))
            for name, value in zip(cls.__slots__, values):
                object.__setattr__(obj, name, value)

        return cls._intern((coeff, *mono), build)

    @classmethod
    def _rebuild(cls, coeff, *mono):
        return cls(coeff, *mono)

    @property
    def is_constant(self) -> bool:
        return self.mono == _CONST_MONO


class Poly(Interned):
    """A sum of terms with distinct monomials, sorted: the normal form of an expression."""

    __slots__ = ("terms", "digest", "termset")

    def __new__(cls, terms: tuple):
        def build(obj):
            object.__setattr__(obj, "terms", terms)
            object.__setattr__(obj, "digest", stable_digest("poly", tuple(t.digest for t in terms)))
            object.__setattr__(obj, "termset", frozenset(terms))

        return cls._intern((terms,), build)

    @classmethod
    def _rebuild(cls, terms):
        return cls(terms)

    def __len__(self) -> int:
        return len(self.terms)

    def __str__(self) -> str:
        return E.format_expr(render(self))


def _digest(poly) -> int:
    return 0 if poly is None else poly.digest


_CONST_MONO = (1, (), None, 1, (), None)
ZERO = Poly(())


def _sorted(atoms) -> tuple:
    return tuple(sorted(atoms, key=lambda a: a.digest))


def make_term(coeff, size, num, exp, den_size, den, den_exp) -> Term:
    """A canonical term: sorted factors, empty exps dropped, a movable denominator exp moved up."""
    exp = None if exp is None or exp is ZERO else exp
    den_exp = None if den_exp is None or den_exp is ZERO else den_exp
    if den_exp is not None and (den_size == 1 or den):
        # inv(exp(D)) = exp(-D) once no denominator sum needs the exp as its only factor
        exp = add(exp or ZERO, scale(den_exp, Fraction(-1)))
        exp, den_exp = (None if exp is ZERO else exp), None
    return Term(Fraction(coeff), size, _sorted(num), exp, den_size, _sorted(den), den_exp)


def const_term(c) -> Term:
    return Term(Fraction(c), *_CONST_MONO)


def atom_poly(atom: Atom) -> Poly:
    return Poly((Term(Fraction(1), 1, (atom,), None, 1, (), None),))


def constant(c) -> Poly:
    return ZERO if c == 0 else Poly((const_term(c),))


def bare_atom(p: Poly):
    """The atom `p` consists of (coefficient 1, nothing else), or None."""
    if len(p.terms) != 1:
        return None
    t = p.terms[0]
    if t.coeff == 1 and t.size == 1 and len(t.num) == 1 and t.exp is None and t.den_size == 1 \
            and not t.den and t.den_exp is None:
        return t.num[0]
    return None


def constant_value(p: Poly):
    """The rational value of a constant polynomial, or None."""
    if p is ZERO:
        return Fraction(0)
    if len(p.terms) == 1 and p.terms[0].is_constant:
        return p.terms[0].coeff
    return None


# ---- polynomial arithmetic -----------------------------------------------------------------------
def from_terms(terms) -> Poly:
    """Combine like terms (same monomial), drop zeros, sort."""
    coeffs: dict[tuple, Fraction] = {}
    for t in terms:
        coeffs[t.mono] = coeffs.get(t.mono, Fraction(0)) + t.coeff
    out = [Term(c, *mono) for mono, c in coeffs.items() if c != 0]
    return Poly(tuple(sorted(out, key=lambda t: t.mono_digest)))


def add(*ps: Poly) -> Poly:
    if len(ps) == 1:
        return ps[0]
    return from_terms(t for p in ps for t in p.terms)


def scale(p: Poly, c: Fraction) -> Poly:
    return from_terms(Term(t.coeff * c, *t.mono) for t in p.terms)


def term_mul(s: Term, t: Term) -> Term:
    return make_term(s.coeff * t.coeff, s.size * t.size, s.num + t.num, _add_opt(s.exp, t.exp),
                     s.den_size * t.den_size, s.den + t.den, _add_opt(s.den_exp, t.den_exp))


def _add_opt(a, b):
    if a is None or b is None:
        return a if b is None else b
    return add(a, b)


def mul(*ps: Poly) -> Poly:
    result = ps[0]
    for p in ps[1:]:
        if len(result.terms) * len(p.terms) > MAX_TERMS:
            raise Overflow(f"a product of {len(result.terms)} and {len(p.terms)} terms")
        result = from_terms(term_mul(s, t) for s in result.terms for t in p.terms)
    return result


def inv(p: Poly) -> Poly:
    """1/p: a monomial inverts factor by factor; a sum's common factor comes out, the rest stays
    whole as a denominator group."""
    if len(p.terms) == 1 and p.terms[0].coeff != 0:
        return _inv_term(p.terms[0])
    common, rest = content(p)
    group = Poly((make_term(1, 1, (), None, 1, (Atom(GROUP, None, (rest,)),), None),))
    return group if common is None else mul(_inv_term(common), group)


def content(p: Poly):
    """(c, q) with p = c*q, c the common factor of p's terms and q's first coefficient 1 (or None, p)."""
    if len(p.terms) < 2:
        return None, p
    ts = p.terms
    size = ts[0].size if all(t.size == ts[0].size for t in ts) else 1
    den_size = ts[0].den_size if all(t.den_size == ts[0].den_size for t in ts) else 1
    common = make_term(1, size, _common(t.num for t in ts), None, den_size,
                       _common(t.den for t in ts), None)
    rest = from_terms(term_quotient(t, common) for t in ts)
    lead = rest.terms[0].coeff      # in the quotient's own order, so normalising q again keeps it
    if common.is_constant and lead == 1:
        return None, p
    return make_term(lead, *common.mono), scale(rest, 1 / lead)


def _common(atom_lists) -> tuple:
    lists = [list(a) for a in atom_lists]
    shared = []
    for atom in lists[0]:
        if all(atom in rest for rest in lists[1:]):
            shared.append(atom)
            for rest in lists[1:]:
                rest.remove(atom)
    return tuple(shared)


def _inv_term(t: Term) -> Poly:
    groups = [a.args[0] for a in t.den if a.kind is GROUP]
    plain = tuple(a for a in t.den if a.kind is not GROUP)
    base = make_term(1 / t.coeff, t.den_size, plain, t.den_exp, t.size, t.num, t.exp)
    return mul(Poly((base,)), *groups) if groups else Poly((base,))


def exp(p: Poly) -> Poly:
    """exp(p) as one merged factor: exp(a + b) = exp(a)*exp(b) is then a merge of terms."""
    return constant(1) if p is ZERO else Poly((make_term(1, 1, (), p, 1, (), None),))


def reduce_sum(n: int, p: Poly) -> Poly:
    """sum(n, p): sums distribute over +, merge (sizes multiply), and take constants out."""
    return from_terms(make_term(t.coeff, t.size * n, t.num, t.exp, t.den_size, t.den, t.den_exp)
                      for t in p.terms)


def reduce_max(n: int, p: Poly) -> Poly:
    """maxr(n, c*x) = c*maxr(n, x) for c > 0; maxr(a, maxr(b, x)) = maxr(a*b, x); maxr(1, x) = x;
    maxr(n, c) = c."""
    if n == 1 or is_constant(p):
        return p
    if len(p.terms) == 1 and p.terms[0].coeff > 0 and p.terms[0].coeff != 1:
        c = p.terms[0].coeff
        return scale(reduce_max(n, scale(p, 1 / c)), c)
    inner = bare_atom(p)
    if inner is not None and inner.kind is Op.MAXR:
        return atom_poly(Atom(Op.MAXR, n * inner.param, inner.args))
    return atom_poly(Atom(Op.MAXR, n, (p,)))


def extremum(kind: Op, ps) -> Poly:
    """max / min: associative, commutative, idempotent (flattened, deduplicated, sorted)."""
    args = set()
    for p in ps:
        inner = bare_atom(p)
        args.update(inner.args if inner is not None and inner.kind is kind else (p,))
    if len(args) == 1:
        return next(iter(args))
    return atom_poly(Atom(kind, None, tuple(sorted(args, key=lambda a: a.digest))))


def power(base: Poly, exponent: Poly) -> Poly:
    """Constant exponents: small integers expand to products, +-1/2 become sqrt; else opaque."""
    k = constant_value(exponent)
    if k is not None and k.denominator == 1 and abs(k) <= MAX_INT_POWER:
        if k == 0:
            return constant(1)
        product = mul(*[base] * int(abs(k)))
        return product if k > 0 else inv(product)
    if k is not None and abs(k) == Fraction(1, 2):
        root = atom_poly(Atom(Op.FN, (Fn.SQRT,), (base,)))
        return root if k > 0 else inv(root)
    return atom_poly(Atom(Op.POW, None, (base, exponent)))


# ---- normalising expressions -----------------------------------------------------------------------
def _const(e: Expr, args) -> Poly:
    if isinstance(e.param, Fraction):
        return constant(e.param)
    return atom_poly(Atom(Op.CONST, e.param))


NORMALIZE = {
    Op.VAR: lambda e, a: atom_poly(Atom(Op.VAR, e.param)),
    Op.CONST: _const,
    Op.ADD: lambda e, a: add(*a),
    Op.MUL: lambda e, a: mul(*a),
    Op.INV: lambda e, a: inv(a[0]),
    Op.EXP: lambda e, a: exp(a[0]),
    Op.SUM: lambda e, a: reduce_sum(e.param, a[0]),
    Op.MAXR: lambda e, a: reduce_max(e.param, a[0]),
    Op.MAX: lambda e, a: extremum(Op.MAX, a),
    Op.MIN: lambda e, a: extremum(Op.MIN, a),
    Op.POW: lambda e, a: power(a[0], a[1]),
    Op.FN: lambda e, a: atom_poly(Atom(Op.FN, e.param, tuple(a))),
    Op.CONCAT: lambda e, a: atom_poly(Atom(Op.CONCAT, None, tuple(a))),
    Op.ACCESS: lambda e, a: atom_poly(Atom(Op.ACCESS, e.param)),
    Op.REDUCE: lambda e, a: atom_poly(Atom(Op.REDUCE, e.param, tuple(a))),
}

_NF: "weakref.WeakKeyDictionary[Expr, Poly | None]" = weakref.WeakKeyDictionary()


def normalize(e: Expr) -> Poly | None:
    """The normal form of `e` (memoised on the interned expression); None if it overflowed."""
    found = _NF.get(e, False)
    if found is not False:
        return found
    for t in E.subterms([e]):
        if t not in _NF:
            _NF[t] = _normalize_one(t)
    return _NF[e]


def _normalize_one(e: Expr) -> Poly | None:
    args = [_NF[a] for a in e.args]
    if any(a is None for a in args):
        return None
    try:
        return NORMALIZE[e.op](e, args)
    except Overflow:
        return None


# ---- back to expressions ---------------------------------------------------------------------------
def render(p: Poly) -> Expr:
    """A canonical expression whose normal form is `p` (the witness handed to Z3, and printing)."""
    if p is ZERO:
        return E.const(0)
    return E.add(*[_render_term(t) for t in p.terms])


def _render_term(t: Term) -> Expr:
    num = [render_atom(a) for a in t.num] + ([E.exp(render(t.exp))] if t.exp is not None else [])
    coeff = t.coeff
    if t.size > 1:
        if num:
            num[0] = E.reduce_sum(t.size, num[0])
        else:
            num, coeff = [E.reduce_sum(t.size, E.const(coeff))], Fraction(1)
    den = _render_den(t)
    factors = ([E.const(coeff)] if coeff != 1 or not (num or den) else []) + num
    return E.mul(*factors, *[E.inv(d) for d in den])


def _render_den(t: Term) -> list[Expr]:
    """The denominator factors; its sum wraps a plain one (a sum of a group would distribute)."""
    plain = [render_atom(a) for a in t.den if a.kind is not GROUP] + \
        ([E.exp(render(t.den_exp))] if t.den_exp is not None else [])
    groups = [render_atom(a) for a in t.den if a.kind is GROUP]
    if t.den_size > 1:
        plain = [E.reduce_sum(t.den_size, plain[0])] + plain[1:] if plain else \
            [E.reduce_sum(t.den_size, E.const(1))]
    return plain + groups


def render_atom(a: Atom) -> Expr:
    args = [render(p) for p in a.args]
    if a.kind is Op.VAR:
        return E.Expr(Op.VAR, (), a.param)
    if a.kind is Op.CONST:
        return E.Expr(Op.CONST, (), a.param)
    if a.kind is GROUP:
        return args[0]
    if a.kind is Op.MAXR:
        return E.reduce_max(a.param, args[0])
    if a.kind in (Op.MAX, Op.MIN):
        head = E.maximum if a.kind is Op.MAX else E.minimum
        result = args[0]
        for x in args[1:]:
            result = head(result, x)
        return result
    return E.Expr(a.kind, tuple(args), a.param)


# ---- "is part of" on normal forms ---------------------------------------------------------------
def nested_polys(p: Poly) -> list[Poly]:
    """`p` and every polynomial inside it: atom arguments, exp exponents, denominator groups."""
    out, seen, stack = [], set(), [p]
    while stack:
        q = stack.pop()
        if q in seen:
            continue
        seen.add(q)
        out.append(q)
        for t in q.terms:
            stack.extend(x for x in (t.exp, t.den_exp) if x is not None)
            for a in t.num + t.den:
                stack.extend(a.args)
    return out


def sub_sum(c: Poly, q: Poly) -> bool:
    """Every term of `c` (with its coefficient) is a term of `q`."""
    return c.termset <= q.termset


def term_part(c: Term, t: Term) -> bool:
    """`c` is a factor of `t` under AC, sum splitting (c's size divides t's) and exp splitting."""
    if c.coeff != 1 and c.coeff != t.coeff:
        return False
    if t.size % c.size or t.den_size % c.den_size:
        return False
    if not (_sub_multiset(c.num, t.num) and _sub_multiset(c.den, t.den)):
        return False
    return _exp_part(c.exp, t.exp) and _exp_part(c.den_exp, t.den_exp)


def _exp_part(c, t) -> bool:
    return c is None or (t is not None and sub_sum(c, t))


def _sub_multiset(small: tuple, big: tuple) -> bool:
    if len(small) > len(big):
        return False
    remaining = list(big)
    for a in small:
        if a not in remaining:
            return False
        remaining.remove(a)
    return True


def atom_part(a: Atom, t: Term) -> bool:
    """A bare max-reduction maxr(k, x) is part of maxr(n, x) when k divides n (split the loop)."""
    return any(b.kind is Op.MAXR and b.args == a.args and b.param % a.param == 0 for b in t.num)


def term_quotient(t: Term, c: Term):
    """The term m with m*c == t, or None (no division of factors, sizes or exps is possible)."""
    if c.coeff == 0 or t.size % c.size or t.den_size % c.den_size:
        return None
    if not (_sub_multiset(c.num, t.num) and _sub_multiset(c.den, t.den)):
        return None
    m = make_term(t.coeff / c.coeff, t.size // c.size, _minus(t.num, c.num),
                  _sub_opt(t.exp, c.exp), t.den_size // c.den_size, _minus(t.den, c.den),
                  _sub_opt(t.den_exp, c.den_exp))
    return m if term_mul(m, c) is t else None


def _minus(big: tuple, small: tuple) -> tuple:
    remaining = list(big)
    for a in small:
        remaining.remove(a)
    return tuple(remaining)


def _sub_opt(a, b):
    if b is None:
        return a
    return add(a or ZERO, scale(b, Fraction(-1)))


def multiple_in(c: Poly, t: Term, q: Poly) -> bool:
    """Whether m*c is a sub-sum of q for the m that maps c's first term onto `t` (so c is part of
    q by factoring m out; m's coefficient must be 1 unless c's are, so Z3 finds it as a term)."""
    if len(c.terms) > len(q.terms):
        return False
    m = term_quotient(t, c.terms[0])
    if m is None or (m.coeff != 1 and any(s.coeff != 1 for s in c.terms)):
        return False
    return all(term_mul(m, s) in q.termset for s in c.terms[1:])


def is_constant(p: Poly) -> bool:
    return constant_value(p) is not None


def contains_atom(p: Poly, atom: Atom) -> bool:
    """Whether `atom` occurs anywhere inside `p`."""
    return any(atom in t.num or atom in t.den for q in nested_polys(p) for t in q.terms)


def carries_rescale(x: Poly, m: Poly) -> bool:
    """Every term of `x` has exactly one factor exp(-m) and mentions m nowhere else.

    This is what makes a rescaling accumulator exact (see `lower._lower_accumulator`).
    """
    minus_m = scale(m, Fraction(-1))
    atoms = {a for t in m.terms for a in t.num + t.den}
    for t in x.terms:
        if t.exp is None or not sub_sum(minus_m, t.exp):
            return False
        rest = Poly((make_term(t.coeff, t.size, t.num, add(t.exp, m), t.den_size, t.den,
                               t.den_exp),))
        if any(contains_atom(rest, a) for a in atoms):
            return False
    return True


# ---- pruning's relaxation: a partial max stands for the full one ---------------------------------
_BLIND: "weakref.WeakKeyDictionary[Poly, Poly]" = weakref.WeakKeyDictionary()


def forget_max_sizes(p: Poly) -> Poly:
    """`p` with every maxr(n, x) read as maxr(?, x): a split's or a tile's max as the full max.

    Not a law: exp(s - m_split) is no part of exp(s - m), but a kernel that rescales by
    exp(m_split - m) later cancels the difference (split-KV online softmax), exactly as the
    rescaling accumulators do for the running max inside one loop.
    """
    found = _BLIND.get(p)
    if found is None:
        blind = from_terms(_blind_term(t) for t in p.terms)
        found = _BLIND[p] = _UNCHANGED if blind is p else blind   # a value may not hold its key
    return p if found is _UNCHANGED else found


_UNCHANGED = object()


def _blind_term(t: Term) -> Term:
    return make_term(t.coeff, t.size, tuple(map(_blind_atom, t.num)), _blind_opt(t.exp),
                     t.den_size, tuple(map(_blind_atom, t.den)), _blind_opt(t.den_exp))


def _blind_opt(p):
    return None if p is None else forget_max_sizes(p)


def _blind_atom(a: Atom) -> Atom:
    args = tuple(forget_max_sizes(q) for q in a.args)
    return Atom(a.kind, 0 if a.kind is Op.MAXR else a.param, args)
