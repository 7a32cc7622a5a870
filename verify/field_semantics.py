"""The finite-field meaning of every op: the semantics object the reference interpreter runs one
test under, and the op table, written once in terms of the semantics' primitives (the bound's
symbolic pass in `field_bound.py` runs the same table). The design is in `finite_field.py`."""
from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from mugraph.ir.errors import MugraphError, VerificationError
from mugraph.ir.ops import TOp
from mugraph.verify.field import (VALUE, Field, Permutation, as_u64, derive_key, exact_matmul,
                                  inverse_mod, is_bottom, join, mix64, mulmod, p_part, power_of_g,
                                  powmod, q_part, sum_mod, uniform_below, without_image)

_Q_SALT = np.uint64(0x9E3779B97F4A7C15)


class ZeroDivisorDrawn(MugraphError):
    """A random draw hit a zero divisor (p-component); the test is redrawn with fresh inputs."""


class NeedsExponents(Exception):
    """An exp was reached in a run without exponent images: the test reruns with them."""


class Roundings:
    """Which values the spec's program holds in each 16-bit dtype: the operands of its casts to
    it, its inputs of it, and the value of every node it stores in it (an fp16 node's value is
    rounded to fp16 by the program, cast or not). Recorded by the spec's run, read by the
    candidate's: a candidate's rounding of such a value to that dtype is the program's own, and
    kept exact; any other is a new rounding (`FiniteFieldSemantics.rounding`). Stored values are
    kept up to STORED_LIMIT elements per run (a cast of a value past it counts as new: a false
    rejection at most)."""

    STORED_LIMIT = 1 << 20          # 8 MB of residues per run (the spec's runs are cached)

    def __init__(self):
        self._tables: dict = {}     # (kind, dtype) -> [residue arrays], then one sorted array
        self._stored = 0

    def add(self, dtype, residues, kind: str = "cast") -> None:
        residues = np.asarray(residues, np.int64).reshape(-1)
        if kind == "stored":
            if self._stored + residues.size > self.STORED_LIMIT:
                return
            self._stored += residues.size
            residues = residues.copy()      # the run may reuse its buffers
        self._tables.setdefault((kind, dtype), []).append(residues)

    def holds(self, dtype, residues) -> np.ndarray:
        """Which of `residues` the program holds in `dtype` (a cast's operand first: the other
        tables are sorted only when needed)."""
        residues = np.asarray(residues, np.int64)
        found = np.zeros(residues.shape, bool)
        for kind in ("cast", "input", "stored"):
            found |= _member(self._sorted((kind, dtype)), residues)
            if found.all():
                break
        return found

    def _sorted(self, key) -> np.ndarray:
        parts = self._tables.get(key)
        if parts is None:
            return np.zeros(0, np.int64)
        if isinstance(parts, list):   # sorted with repeats: searchsorted needs no more
            parts = self._tables[key] = np.sort(np.concatenate(parts))
        return parts


def _member(sorted_values: np.ndarray, residues: np.ndarray) -> np.ndarray:
    if sorted_values.size == 0:
        return np.zeros(residues.shape, bool)
    at = np.minimum(np.searchsorted(sorted_values, residues), sorted_values.size - 1)
    return sorted_values[at] == residues


# ---- the semantics -------------------------------------------------------------------------------
class FiniteFieldSemantics:
    """One test's semantics for the interpreter: values are Z_p residues (`exponents=False`) or
    (Z_p, Z_q ∪ {⊥}) records (`exponents=True`, needed as soon as a program has an exp)."""

    def __init__(self, field: Field, key: int, exponents: bool = True,
                 roundings: Roundings | None = None):
        self.field = field
        self.key = key
        self.exponents = exponents
        self.name = f"finite-field(p={field.p}, q={field.q}{', exponents' * exponents})"
        self.constant_values: dict[int, float] = {}   # p residue -> float (POW exponents)
        self._oracle_keys: dict = {}
        self._permutations: dict = {}
        # the spec's run records its roundings; a candidate's run reads the spec's
        self.recorded = Roundings() if roundings is None else None
        self.roundings = roundings
        self.new_roundings_made = 0   # elements a candidate's casts rounded as the program does not

    # -- the interpreter's interface: leaves, storage, structure --------------------------------
    def cast(self, x, dtype) -> np.ndarray:
        # storing to a node's dtype: exact (its rounding is the float test's)
        return self._stored(self._value(x), dtype)

    def input(self, array, dtype) -> np.ndarray:
        value = self._value(array)
        if self.recorded is not None and dtype is not None and dtype.is_16bit:
            self.recorded.add(dtype, self.residue(value), "input")
        return value

    def _stored(self, value, dtype):
        """The spec's run records what it stores in a 16-bit dtype (`Roundings`)."""
        if self.recorded is not None and dtype is not None and dtype.is_16bit:
            self.recorded.add(dtype, self.residue(value), "stored")
        return value

    def _value(self, x) -> np.ndarray:
        x = np.asarray(x)
        return x if x.dtype == (VALUE if self.exponents else np.int64) else x.astype(np.int64)

    def constant(self, value: float, shape, dtype) -> np.ndarray:
        return np.full(shape, self.element(value), VALUE if self.exponents else np.int64)

    def table(self, arg) -> np.ndarray:
        """A TABLE leaf: a 0/1 mask exactly; other values drawn per element from a hash keyed by
        the table's content (like an input: the same in every program of one test)."""
        values, shape, _ = arg
        if values.is_mask:
            one, zero = self.element(1.0), self.element(0.0)
            return np.where(values.array(shape) == 1.0, one, zero)
        key = np.uint64(derive_key(self.key, "table", values.digest))
        h = mix64(mix64(as_u64(np.arange(math.prod(shape), dtype=np.int64).reshape(shape)) ^ key))
        residues = uniform_below(h, self.field.p)
        if not self.exponents:
            return residues
        return join(residues, uniform_below(mix64(h ^ _Q_SALT), self.field.q))

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, VALUE if self.exponents else np.int64)

    def empty(self, shape, dtype) -> np.ndarray:
        return self.zeros(shape)

    def max_identity(self, shape) -> np.ndarray:
        return np.full(shape, self.lattice_identity("max"), VALUE if self.exponents else np.int64)

    def elementwise(self, op: TOp, args, arg, dtype) -> np.ndarray:
        value = FF_ELEMENTWISE[op](self, *args, arg)
        return value if op is TOp.CAST else self._stored(value, dtype)

    def matmul(self, a, b, dtype, operand_dtype=None) -> np.ndarray:
        return self._stored(self._matmul(a, b), dtype)

    def _matmul(self, a, b) -> np.ndarray:
        if not self.exponents:
            return exact_matmul(a, b, self.field.p)
        rp = exact_matmul(p_part(a), p_part(b), self.field.p)
        bottom = (np.any(is_bottom(a), axis=-1, keepdims=True)
                  | np.any(is_bottom(b), axis=-2, keepdims=True))
        if np.all(bottom):  # e.g. exp(S) @ V: no exponent image to compute
            return without_image(rp)
        rq = exact_matmul(np.maximum(q_part(a), 0), np.maximum(q_part(b), 0), self.field.q)
        return join(rp, rq, np.broadcast_to(bottom, rp.shape))

    def reduce_sum(self, x, dim: int, dtype) -> np.ndarray:
        return self._stored(self._reduce_sum(x, dim), dtype)

    def _reduce_sum(self, x, dim: int) -> np.ndarray:
        if not self.exponents:
            return sum_mod(x, dim, self.field.p)
        rp = sum_mod(p_part(x), dim, self.field.p)
        bottom = np.any(is_bottom(x), axis=dim, keepdims=True)
        if np.all(bottom):
            return without_image(rp)
        rq = sum_mod(np.maximum(q_part(x), 0), dim, self.field.q)
        return join(rp, rq, bottom)

    def reduce_max(self, x, dim: int, dtype) -> np.ndarray:
        perm = self.permutation("max")
        digest = sum_mod(perm(self.residue(x)), dim, self.field.p)
        return self._stored(self.lattice_value("max", perm.inverse(digest)), dtype)

    # -- primitives the op table is written in ---------------------------------------------------
    def residue(self, v) -> np.ndarray:
        """The Z_p component."""
        return p_part(v) if self.exponents else np.asarray(v, np.int64)

    def element(self, value: float):
        """A constant: its exact residues; ±inf and NaN are keyed symbols of the test."""
        if not math.isfinite(value):
            return self.oracle("constant", repr(float(value)))
        rp, rq = self.field.residues(value)
        self.constant_values.setdefault(rp, float(value))
        return join(rp, rq)[()] if self.exponents else np.int64(rp)

    def add(self, a, b):
        return self._ring(_add, a, b)

    def sub(self, a, b):
        return self._ring(_sub, a, b)

    def mul(self, a, b):
        return self._ring(mulmod, a, b)

    def neg(self, a):
        return self._ring(_sub, self.element(0.0), a)

    def _ring(self, fn, a, b) -> np.ndarray:
        if not self.exponents:
            return fn(np.asarray(a, np.int64), np.asarray(b, np.int64), self.field.p)
        rp = fn(p_part(a), p_part(b), self.field.p)
        bottom = is_bottom(a) | is_bottom(b)
        if bottom.all():    # e.g. arithmetic on exps: no exponent image to compute
            return without_image(rp)
        rq = fn(np.maximum(q_part(a), 0), np.maximum(q_part(b), 0), self.field.q)
        return join(rp, rq, bottom if bottom.any() else None)

    def inverse(self, v) -> np.ndarray:
        """1/v; a zero Z_p component is a bad draw (redrawn), a zero Z_q component gives ⊥."""
        vp = self.residue(v)
        if not np.all(vp):
            raise ZeroDivisorDrawn("a divisor is zero in Z_p for this draw")
        ip = inverse_mod(vp, self.field.p)
        if not self.exponents:
            return ip
        vq = q_part(v)
        bottom = vq <= 0
        if bottom.all():
            return without_image(ip)
        return join(ip, inverse_mod(np.maximum(vq, 0), self.field.q), bottom)

    def power(self, v, e: int) -> np.ndarray:
        if e < 0:
            return self.power(self.inverse(v), -e)
        if not self.exponents:
            return powmod(v, e, self.field.p)
        bottom = is_bottom(v)
        rp = powmod(p_part(v), e, self.field.p)
        if bottom.all():
            return without_image(rp)
        return join(rp, powmod(np.maximum(q_part(v), 0), e, self.field.q), bottom)

    def exp(self, v) -> np.ndarray:
        """g^(v's Z_q image): exp(a + b) = exp(a)·exp(b) exactly. Where v has no image (⊥), an
        uninterpreted function of v's Z_p residue. The result has no exponent image."""
        if not self.exponents:
            raise NeedsExponents()
        v = np.asarray(v)
        exponent = q_part(v)
        bottom = exponent < 0
        if np.any(bottom):
            fallback = uniform_below(self._hash("exp", None, [p_part(v)]), self.field.q)
            exponent = np.where(bottom, fallback, exponent)
        return without_image(power_of_g(self.field, exponent))

    def rounding(self, x, dtype) -> np.ndarray:
        """A CAST to `dtype`. To fp32 (the widest dtype) nothing is rounded: x. To a 16-bit dtype
        in the spec's run: x, recorded (the program's own roundings are what a candidate may
        skip or repeat). In a candidate's run: x where the program holds the same value in that
        dtype (`Roundings`), else an uninterpreted function of x: a rounding the program does
        not make changes the value, so `cast(e·2^-18, f16)·2^18` never equals e."""
        if not dtype.is_16bit:
            return x
        residue = self.residue(x)
        if self.roundings is None:
            self.recorded.add(dtype, residue, "cast")
            return x
        kept = self.roundings.holds(dtype, residue)
        if kept.all():
            return x
        self.new_roundings_made += int(kept.size - np.count_nonzero(kept))
        return np.where(kept, x, self.oracle("round", dtype.value, x))

    def oracle(self, op, params, *args) -> np.ndarray:
        """An uninterpreted function: a keyed random function of (op, params, the arguments'
        Z_p residues), the same on both sides of a test; its value has fresh residues, each
        uniform (`uniform_below`)."""
        h = self._hash(op, params, [self.residue(a) for a in np.broadcast_arrays(*args)]
                       if args else [np.int64(0)])
        rp = uniform_below(h, self.field.p)
        if not self.exponents:
            return rp
        return join(rp, uniform_below(mix64(h ^ _Q_SALT), self.field.q))

    def _hash(self, op, params, residues) -> np.ndarray:
        k = self._oracle_keys.get((op, params))
        if k is None:
            name = op.value if isinstance(op, TOp) else op
            k = self._oracle_keys[(op, params)] = np.uint64(derive_key(self.key, name, params))
        h = mix64(as_u64(residues[0]) ^ k)
        for r in residues[1:]:
            h = mix64(h ^ as_u64(r))
        return h

    def lattice(self, kind: str, a, b) -> np.ndarray:
        """max or min: Φ⁻¹(Φ(a) + Φ(b)) with Φ a keyed random permutation of Z_p, and x ∨ x = x."""
        perm = self.permutation(kind)
        ap, bp = np.broadcast_arrays(self.residue(a), self.residue(b))
        joined = perm.inverse((perm(ap) + perm(bp)) % self.field.p)
        return self.lattice_value(kind, np.where(ap == bp, ap, joined))

    def lattice_identity(self, kind: str):
        """The element x with x ∨ y = y for every y: Φ⁻¹(0) (the running max's start)."""
        value = self.permutation(kind).inverse(np.zeros(1, np.int64))
        return self.lattice_value(kind, value)[0]

    def lattice_value(self, kind: str, residue: np.ndarray) -> np.ndarray:
        """A max/min result: its Z_p residue and, as its exponent image, a keyed function of it."""
        if not self.exponents:
            return residue
        h = self._hash("lattice-image", kind, [residue])
        return join(residue, uniform_below(h, self.field.q))

    def permutation(self, kind: str) -> Permutation:
        perm = self._permutations.get(kind)
        if perm is None:
            perm = self._permutations[kind] = Permutation(derive_key(self.key, kind), self.field.p)
        return perm

    def exponent_value(self, y) -> float | None:
        """The float a uniform POW exponent stands for: a constant of this run, or a small
        half-integer however it was computed (e.g. 1.0 + 1.0); None otherwise."""
        y = self.residue(y)
        if y.size == 0 or not np.all(y == y.flat[0]):
            return None
        residue = int(y.flat[0])
        found = self.constant_values.get(residue)
        return found if found is not None else _half_integers(self.field).get(residue)


def _add(a, b, m: int) -> np.ndarray:
    return (a + b) % m


def _sub(a, b, m: int) -> np.ndarray:
    return (a - b) % m


@functools.lru_cache(maxsize=32)
def _half_integers(field: Field) -> dict[int, float]:
    return {field.residues(k / 2)[0]: k / 2 for k in range(-64, 65)}


# ---- the op table --------------------------------------------------------------------------------
# Each entry is f(sem, *operands, arg) in the primitives above, so the numeric run and the bound's
# symbolic run read the same table. Three kinds of entry:
#   * ring and field operations (add, mul, div, integer pow, ...): exact in Z_p and in Z_q;
#   * EXP, the one homomorphism; MAX and MIN, the two semilattices;
#   * an op with no algebraic law: an uninterpreted function of its k operands (and node.arg).
#     Register such an op by adding `TOp.X: k` to UNINTERPRETED: nothing else is needed, in this
#     file or in the bound. An op that is a real identity of others (RSQRT = 1/SQRT) may instead
#     be written in terms of them, as below; its bound then follows from theirs.
UNINTERPRETED = {
    TOp.LOG: 1, TOp.SQRT: 1, TOp.SILU: 1, TOp.GELU: 1, TOp.SIGMOID: 1, TOp.TANH: 1, TOp.ERF: 1,
    TOp.IS_FINITE: 1, TOp.LEAKY_RELU: 2,
}


def _uninterpreted(op: TOp, arity: int):
    def apply(sem, *operands):
        *args, arg = operands
        if len(args) != arity:
            raise VerificationError(f"{op.value} takes {arity} operands, got {len(args)}")
        return sem.oracle(op, arg, *args)
    return apply


def _pow(sem, x, y, arg):
    e = sem.exponent_value(y)
    if e is None:
        return sem.oracle(TOp.POW, None, x, y)
    if e == int(e) and abs(e) <= 2 ** 62:
        return sem.power(x, int(e))
    if e == 0.5:
        return sem.oracle(TOp.SQRT, None, x)
    if e == -0.5:
        return sem.inverse(sem.oracle(TOp.SQRT, None, x))
    return sem.oracle(TOp.POW, Fraction(e), x)


def _clamp(sem, x, arg):
    low, high = (sem.element(v) for v in arg)
    return sem.lattice("min", sem.lattice("max", x, low), high)


def _greater(sem, a, b):
    """The one uninterpreted order test, gt(a, b); the other comparisons are its real identities
    (never the max's permutation: ties have probability ~1/p, so gt and ge would agree)."""
    return sem.oracle(TOp.GT, None, a, b)


def _not(sem, mask):
    return sem.sub(sem.element(1.0), mask)


def _eq(sem, a, b, arg):
    return sem.sub(_not(sem, _greater(sem, a, b)), _greater(sem, b, a))


def _select(sem, c, a, b, arg):
    """b + T(c)·(a − b), T(c) an uninterpreted function standing for [c != 0]: exact in a and b
    (tilings and factorings of the branches verify), and sound for any c, not only masks."""
    return sem.add(b, sem.mul(sem.oracle(TOp.SELECT, None, c), sem.sub(a, b)))


def _log_of(sem, x):
    return sem.oracle(TOp.LOG, None, x)


FF_ELEMENTWISE = {
    TOp.ADD: lambda sem, a, b, arg: sem.add(a, b),
    TOp.SUB: lambda sem, a, b, arg: sem.sub(a, b),
    TOp.MUL: lambda sem, a, b, arg: sem.mul(a, b),
    TOp.DIV: lambda sem, a, b, arg: sem.mul(a, sem.inverse(b)),
    TOp.NEG: lambda sem, x, arg: sem.neg(x),
    TOp.SQUARE: lambda sem, x, arg: sem.mul(x, x),
    TOp.POW: _pow,
    TOp.EXP: lambda sem, x, arg: sem.exp(x),
    TOp.MAX: lambda sem, a, b, arg: sem.lattice("max", a, b),
    TOp.MIN: lambda sem, a, b, arg: sem.lattice("min", a, b),
    TOp.RELU: lambda sem, x, arg: sem.lattice("max", x, sem.element(0.0)),
    TOp.CLAMP: _clamp,
    TOp.RSQRT: lambda sem, x, arg: sem.inverse(sem.oracle(TOp.SQRT, None, x)),
    TOp.ABS: lambda sem, x, arg: sem.lattice("max", x, sem.neg(x)),
    TOp.LOG1P: lambda sem, x, arg: _log_of(sem, sem.add(x, sem.element(1.0))),
    TOp.EXPM1: lambda sem, x, arg: sem.sub(sem.exp(x), sem.element(1.0)),
    TOp.SOFTPLUS: lambda sem, x, arg: _log_of(sem, sem.add(sem.exp(x), sem.element(1.0))),
    TOp.GT: lambda sem, a, b, arg: _greater(sem, a, b),
    TOp.LT: lambda sem, a, b, arg: _greater(sem, b, a),
    TOp.GE: lambda sem, a, b, arg: _not(sem, _greater(sem, b, a)),
    TOp.LE: lambda sem, a, b, arg: _not(sem, _greater(sem, a, b)),
    TOp.EQ: _eq,
    TOp.NE: lambda sem, a, b, arg: _not(sem, _eq(sem, a, b, None)),
    TOp.SELECT: _select,
    TOp.CAST: lambda sem, x, arg: sem.rounding(x, arg),   # the program's roundings, or new ones
} | {op: _uninterpreted(op, k) for op, k in UNINTERPRETED.items()}

