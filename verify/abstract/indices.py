"""Index arithmetic of the index-aware check: index variables, affine index expressions, tile division.

An `IVar` ranges over 0..size-1 (and below `limit`, an affine bound, for a running max's
prefix). An `Aff` is an exact integer affine form in IVars, kept canonical (sorted, no zero
coefficients), so two indices are equal as functions exactly when their Affs are equal.
`divide(e, d)` is the one non-affine step, e // d and e % d for a tile size d: it is resolved
only when interval bounds make it exact, otherwise it asks (by raising `Refine`) for a
variable to be split, v = k*q + r, a bijection of its range that the variable's binder applies.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


class Unproved(Exception):
    """The index-aware check cannot continue (an op without index meaning, a timeout, ...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Refine(Exception):
    """A request to the binder of `var`: split it as factor*q + r (factor given), or case by case."""

    def __init__(self, var: "IVar", factor: int | None):
        super().__init__(f"refine {var!r} by {factor or 'cases'}")
        self.var = var
        self.factor = factor


@dataclass(frozen=True)
class IVar:
    """An index variable over 0..size-1, below `limit` too when one is given."""

    name: str
    size: int
    limit: "Aff | None" = None

    def __repr__(self) -> str:
        bound = "" if self.limit is None else f"&<{self.limit!r}"
        return f"{self.name}<{self.size}{bound}"

    @property
    def key(self) -> tuple:
        return (self.name, self.size, repr(self.limit))


_FRESH = itertools.count()


def fresh(size: int, limit: "Aff | None" = None) -> IVar:
    """A new variable no other binder uses."""
    return IVar(f"v{next(_FRESH)}", int(size), limit)


@dataclass(frozen=True)
class Aff:
    """sum(coeff * var) + const, with terms sorted by variable and no zero coefficient."""

    terms: tuple = ()
    const: int = 0

    @staticmethod
    def of(var: IVar) -> "Aff":
        return Aff(((var, 1),), 0)

    @staticmethod
    def constant(c: int) -> "Aff":
        return Aff((), int(c))

    @staticmethod
    def build(coeffs: dict, const: int) -> "Aff":
        terms = tuple(sorted(((v, c) for v, c in coeffs.items() if c), key=lambda t: t[0].key))
        return Aff(terms, int(const))

    def coeffs(self) -> dict:
        return dict(self.terms)

    def coeff(self, var: IVar) -> int:
        return self.coeffs().get(var, 0)

    @property
    def vars(self) -> frozenset:
        return frozenset(v for v, _ in self.terms)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def __add__(self, other) -> "Aff":
        other = other if isinstance(other, Aff) else Aff.constant(other)
        coeffs = self.coeffs()
        for v, c in other.terms:
            coeffs[v] = coeffs.get(v, 0) + c
        return Aff.build(coeffs, self.const + other.const)

    def __sub__(self, other) -> "Aff":
        other = other if isinstance(other, Aff) else Aff.constant(other)
        return self + other * -1

    def __mul__(self, k: int) -> "Aff":
        return Aff.build({v: c * k for v, c in self.terms}, self.const * k)

    def substitute(self, mapping: dict) -> "Aff":
        """Simultaneous substitution var -> Aff."""
        if not any(v in mapping for v, _ in self.terms):
            return self
        out = Aff.constant(self.const)
        for v, c in self.terms:
            out = out + (mapping[v] * c if v in mapping else Aff(((v, c),), 0))
        return out

    def bounds(self) -> tuple[int, int]:
        """The least and greatest value over the variables' ranges."""
        lo = hi = self.const
        for v, c in self.terms:
            lo += min(0, c * (v.size - 1))
            hi += max(0, c * (v.size - 1))
        return lo, hi

    def value(self, env: dict) -> int:
        return self.const + sum(c * env[v] for v, c in self.terms)

    def __repr__(self) -> str:
        parts = [(f"{c}*" if c != 1 else "") + v.name for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


ZERO = Aff.constant(0)


def divide(e: Aff, d: int) -> tuple[Aff, Aff]:
    """(e // d, e % d) as Affs, exact over the variables' ranges; else `Refine` or `Unproved`.

    e = d*high + low where high collects the terms whose coefficient d divides; when low stays in
    0..d-1 over its range, e // d = high and e % d = low. Otherwise a variable v of low with
    coefficient c is split by k = d / gcd(c, d) (v = k*q + r: c*k*q joins high) when k divides
    its size; an index that no split makes exact is not modelled.
    """
    if d == 1:
        return e, ZERO
    high = {v: c // d for v, c in e.terms if c % d == 0}
    low = {v: c for v, c in e.terms if c % d}
    q, r = Aff.build(high, e.const // d), Aff.build(low, e.const % d)
    lo, hi = r.bounds()
    if lo >= 0 and hi < d:
        return q, r
    for v, c in sorted(low.items(), key=lambda t: -abs(t[1])):
        k = d // math.gcd(c, d)
        if c > 0 and v.limit is None and 1 < k < v.size and v.size % k == 0:
            raise Refine(v, k)
    raise Unproved(f"index ({e!r}) // {d} is not exact over the index ranges")


def split(var: IVar, k: int, names: tuple[str, str] | None = None) -> tuple[IVar, IVar, Aff]:
    """var = k*q + r with q over 0..size/k-1 and r over 0..k-1: (q, r, the Aff k*q + r)."""
    if names is None:
        q, r = fresh(var.size // k), fresh(k)
    else:
        q, r = IVar(names[0], var.size // k), IVar(names[1], k)
    return q, r, Aff.of(q) * k + Aff.of(r)
