"""Canonical reductions for the index-aware check: sum and max over index variables, in one normal form.

`reduction(kind, vars, body)` builds sum (or max) of `body` over every value of `vars` and puts
it in a canonical form, so that two reductions computing the same function are, as often as
possible, the same interned `Expr(Op.REDUCE)`. Each step is an identity of real arithmetic over
finite index ranges (the sound-steps list below); none needs more than the ranges themselves.

Sums (the body is first put in the normaliser's polynomial form, see `normalize.py`):
  1. a variable the body does not mention multiplies by its range size;
  2. linearity: the sum of a polynomial is the polynomial of the sums of its terms;
  3. a factor that mentions none of the summed variables moves out;
  4. the rest splits into connected groups of factors (two factors are connected when they
     share a summed variable): sum over u,w of f(u)*g(w) = (sum over u of f)*(sum over w of g);
  5. a factor that is itself a sum is absorbed: sum_u f(u) * (sum_w g(u, w)) = sum_{u,w} f*g;
  6. split loops merge: when every index mentions u and w only as c*(B*u + w) (B the size of
     w), the pair is one variable k = B*u + w over A*B values (a bijection of the ranges);
  7. the bound variables get canonical names (the permutation with the least digest).
Maxima: 1 (dropped: the range is never empty), max_u (A + f(u)) = A + max_u f(u) for A free of
u, max_u (c*f) = c*max_u f for a constant c > 0, nested maxima flatten, 6 and 7.

Bound variables are named `_h<height>_<j>`, height = 1 + the greatest height of a reduction
inside the body, so a reduction's names never capture those of a reduction it contains.
"""
from __future__ import annotations

import itertools
import weakref
from fractions import Fraction

from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract import normalize as N
from mugraph.verify.abstract.expr import Expr, Op
from mugraph.verify.abstract.indices import Aff, IVar, Unproved, fresh

SUM, MAX = "sum", "max"
MAX_PERMUTED = 5       # canonical naming tries every order of up to this many bound variables
_MEMO: dict = {}
_MEMO_SIZE = 1 << 16


def clear_memo() -> None:
    _MEMO.clear()


# ---- walking expressions that hold indices ---------------------------------------------------------
_FREE: "weakref.WeakKeyDictionary[Expr, frozenset]" = weakref.WeakKeyDictionary()


def free_vars(e: Expr) -> frozenset:
    """The index variables `e` depends on (a reduction's own variables are bound in it)."""
    found = _FREE.get(e)
    if found is None:
        if e.op is Op.ACCESS:
            found = frozenset().union(*(a.vars for a in e.param[1]))
        elif e.op is Op.REDUCE:
            own = e.param[2]
            found = (free_vars(e.args[0]) - set(own)).union(*(_limit_vars(v) for v in own))
        else:
            found = frozenset().union(*(free_vars(a) for a in e.args))
        _FREE[e] = found
    return found


def _limit_vars(v: IVar) -> frozenset:
    return frozenset() if v.limit is None else v.limit.vars


def indices(e: Expr) -> list[Aff]:
    """Every index inside `e`: access indices and the limits of bound variables."""
    out = []
    for t in E.subterms([e]):
        if t.op is Op.ACCESS:
            out.extend(t.param[1])
        elif t.op is Op.REDUCE:
            out.extend(v.limit for v in t.param[2] if v.limit is not None)
    return out


def height(e: Expr) -> int:
    """The greatest height of a reduction inside `e` (0 without one)."""
    return max((t.param[1] for t in E.subterms([e]) if t.op is Op.REDUCE), default=0)


def rebuild(e: Expr, index_map) -> Expr:
    """`e` with `index_map` (Aff -> Aff) applied to every index outside the reductions' own
    variables; reductions are rebuilt through `reduction`, so they stay canonical."""
    done: dict = {}
    for t in E.subterms([e]):
        done[t] = _rebuild_one(t, done, index_map)
    return done[e]


def _rebuild_one(t: Expr, done: dict, index_map) -> Expr:
    if t.op is Op.ACCESS:
        name, index = t.param
        new = tuple(index_map(a) for a in index)
        return t if new == index else Expr(Op.ACCESS, (), (name, new))
    if t.op is Op.REDUCE:
        return _rebuild_reduction(t, index_map)
    args = tuple(done[a] for a in t.args)
    return t if args == t.args else Expr(t.op, args, t.param)


def _rebuild_reduction(t: Expr, index_map) -> Expr:
    kind, _, own = t.param
    new_own = [v if v.limit is None else IVar(v.name, v.size, index_map(v.limit)) for v in own]
    renamed = {v: Aff.of(n) for v, n in zip(own, new_own) if n != v}
    body = rebuild(t.args[0], lambda a: index_map(a).substitute(renamed) if renamed else index_map(a))
    if body is t.args[0] and not renamed:
        return t
    return reduction(kind, new_own, body)


def substitute(e: Expr, mapping: dict) -> Expr:
    """`e` with index variables replaced (simultaneously) by Affs."""
    if not mapping or not (free_vars(e) & set(mapping)):
        return e
    return rebuild(e, lambda a: a.substitute(mapping))


# ---- the constructor ----------------------------------------------------------------------------------
def reduction(kind: str, bound, body: Expr) -> Expr:
    """sum (kind "sum") or max ("max") of `body` over every value of the variables `bound`."""
    key = (kind, tuple(bound), body)
    found = _MEMO.get(key)
    if found is None:
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.clear()
        found = _MEMO[key] = _reduce(kind, list(bound), body)
    return found


def _reduce(kind: str, bound: list, body: Expr) -> Expr:
    bound, body = _settle(bound, body)
    used = free_vars(body).union(*(_limit_vars(v) for v in bound))
    dropped = [v for v in bound if v not in used]
    bound = [v for v in bound if v in used]
    if kind == SUM:
        if any(v.limit is not None for v in dropped + bound):
            raise Unproved("a sum over a prefix of its loop is not modelled")
        scale = 1
        for v in dropped:
            scale *= v.size
        return _times(scale, _sum(bound, body) if bound else body)
    return _max(bound, body) if bound else body


def _times(c, e: Expr) -> Expr:
    return e if c == 1 else E.mul(E.const(Fraction(c)), e)


def _settle(bound: list, body: Expr) -> tuple[list, Expr]:
    """Constant limits become sizes; variables with one value become 0."""
    mapping, out = {}, []
    for v in bound:
        n = v
        if v.limit is not None and v.limit.is_constant:
            n = IVar(v.name, min(v.size, max(1, v.limit.const)))
        if n.size == 1:
            mapping[v] = Aff.constant(0)
        else:
            out.append(n)
            if n != v:
                mapping[v] = Aff.of(n)
    return out, substitute(body, mapping)


# ---- sums ------------------------------------------------------------------------------------------------
def _sum(bound: list, body: Expr) -> Expr:
    p = N.normalize(body)
    if p is None:
        return _canonical(SUM, bound, body)
    return E.add(*[_sum_term(bound, t) for t in p.terms]) if p.terms else E.const(0)


def _sum_term(bound: list, t: N.Term) -> Expr:
    """One term of the body, summed: steps 1, 3 and 4 of the module doc."""
    factors = _factors(t)
    inside = set(bound)
    deps = [free_vars(f) & inside for f in factors]
    scale = t.coeff
    for v in inside - set().union(*deps):
        scale *= v.size
    outside = [f for f, d in zip(factors, deps) if not d]
    groups = _connected([(f, d) for f, d in zip(factors, deps) if d])
    sums = [_sum_group(sorted(vs, key=lambda v: v.key), fs) for vs, fs in groups]
    return E.mul(*([E.const(scale)] if scale != 1 or not (outside or sums) else []), *outside, *sums)


def _factors(t: N.Term) -> list[Expr]:
    """The factors of a term (coefficient aside); an exp of a sum is one factor per summand."""
    if t.size != 1 or t.den_size != 1 or t.den_exp is not None:
        raise Unproved("an index-free reduction inside an index expression")
    out = [N.render_atom(a) for a in t.num] + [E.inv(N.render_atom(a)) for a in t.den]
    if t.exp is not None:
        out += [E.exp(N.render(N.from_terms([s]))) for s in t.exp.terms]
    return out


def _connected(items) -> list[tuple[set, list]]:
    """Group (factor, variables) pairs into components that share variables."""
    groups: list[tuple[set, list]] = []
    for f, d in items:
        touching = [g for g in groups if g[0] & d]
        merged = (set(d).union(*(g[0] for g in touching)), [x for g in touching for x in g[1]] + [f])
        groups = [g for g in groups if not any(g is h for h in touching)] + [merged]
    return groups


def _sum_group(bound: list, factors: list[Expr]) -> Expr:
    """One connected group: inner sums absorbed (step 5), split loops merged, named canonically."""
    inner = [f for f in factors if f.op is Op.REDUCE and f.param[0] == SUM]
    if inner:
        rest = [f for f in factors if not any(f is g for g in inner)]
        opened = [_open(f) for f in inner]
        return reduction(SUM, bound + [v for vs, _ in opened for v in vs],
                         E.mul(*rest, *[b for _, b in opened]))
    return _canonical(SUM, *_merge(bound, E.mul(*factors)))


def _open(r: Expr) -> tuple[list, Expr]:
    """A reduction's variables renamed fresh, and its body over them."""
    own = r.param[2]
    new = [fresh(v.size, v.limit) for v in own]
    return new, substitute(r.args[0], {v: Aff.of(n) for v, n in zip(own, new)})


# ---- maxima --------------------------------------------------------------------------------------------------
def _max(bound: list, body: Expr) -> Expr:
    p = N.normalize(body)
    if p is None:
        return _canonical(MAX, bound, body)
    inside = set(bound)
    free = [t for t in p.terms if not (free_vars(N.render(N.from_terms([t]))) & inside)]
    if free and len(free) < len(p.terms):
        rest = N.from_terms([t for t in p.terms if t not in free])
        return E.add(N.render(N.from_terms(free)), reduction(MAX, bound, N.render(rest)))
    if len(p.terms) == 1 and p.terms[0].coeff > 0 and p.terms[0].coeff != 1:
        c = p.terms[0].coeff
        return E.mul(E.const(c), reduction(MAX, bound, N.render(N.scale(p, 1 / c))))
    bare = N.bare_atom(p)
    if bare is not None and bare.kind is Op.REDUCE and bare.param[0] == MAX:
        vs, inner = _open(N.render_atom(bare))
        return reduction(MAX, bound + vs, inner)
    return _canonical(MAX, *_merge(bound, body))


# ---- merging split loops, canonical names ----------------------------------------------------------------
def _merge(bound: list, body: Expr) -> tuple[list, Expr]:
    """Step 6: merge pairs (u, w) that every index reads only as B*u + w, until none is left."""
    while True:
        pair = _mergeable(bound, indices(body))
        if pair is None:
            return bound, body
        u, w = pair
        k = fresh(u.size * w.size)
        body = rebuild(body, lambda a: _merged(a, u, w, k))
        bound = [k if v == u else v for v in bound if v != w]


def _mergeable(bound: list, idx: list[Aff]):
    plain = [v for v in bound if v.limit is None]
    for u, w in itertools.permutations(plain, 2):
        if all(a.coeff(u) == w.size * a.coeff(w) for a in idx) and \
                any(a.coeff(w) for a in idx) and not any(u in _limit_vars(v) or w in _limit_vars(v)
                                                         for v in bound):
            return u, w
    return None


def _merged(a: Aff, u: IVar, w: IVar, k: IVar) -> Aff:
    cw = a.coeff(w)
    if not cw:
        return a
    coeffs = a.coeffs()
    del coeffs[w]
    coeffs.pop(u, None)
    coeffs[k] = coeffs.get(k, 0) + cw
    return Aff.build(coeffs, a.const)


def _canonical(kind: str, bound: list, body: Expr) -> Expr:
    """Step 7: bound variables renamed `_h<height>_<j>` in the order with the least digest."""
    h = height(body) + 1
    orders = itertools.permutations(bound) if len(bound) <= MAX_PERMUTED else \
        [sorted(bound, key=lambda v: (v.size, v.key))]
    best = min((_named(kind, h, order, body) for order in orders), key=lambda c: c[0])
    return best[1]


def _named(kind: str, h: int, order, body: Expr) -> tuple[tuple, Expr]:
    names = {v: IVar(f"_h{h}_{j}", v.size) for j, v in enumerate(order)}
    mapping = {v: Aff.of(n) for v, n in names.items()}
    new = [n if v.limit is None else IVar(n.name, n.size, v.limit.substitute(mapping))
           for v, n in names.items()]
    mapping = {v: Aff.of(n) for v, n in zip(order, new)}
    renamed = substitute(body, mapping)
    p = N.normalize(renamed)
    form = renamed if p is None else N.render(p)
    key = (tuple((v.size, repr(v.limit)) for v in new), form.digest)
    return key, Expr(Op.REDUCE, (form,), (kind, h, tuple(new)))
