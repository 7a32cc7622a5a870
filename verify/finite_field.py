"""Exact random testing over Z_p × Z_q: a finite-field semantics plugged into the reference
interpreter (block graphs run with their real tiling), the Schwartz–Zippel bound, the tests.

A value is packed into one int64, (a_p << 32) | a_q, so the interpreter's slicing, concatenation,
transposes and output writes work on it unchanged. What it cannot see: anything equal in exact
arithmetic but not in floating point (a softmax shifted by a wrong but consistent value,
overflow, cancellation, rounding); a constant folded in floating point (x·(1/3) vs x/3) is a
false rejection. The float differential test (`float_diff.py`) covers the first class.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import math
import os
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mugraph.ir.block import BlockGraph
from mugraph.ir.errors import InvalidInput, MugraphError, VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.ir.thread import evaluate as evaluate_thread

# Safe primes p = 2q + 1 just below 2^31 (q ≈ 2^30). p < 2^31 keeps a product of two residues
# below 2^62 in int64; q ≈ 2^30 bounds the per-test error by degree/2^30. `tests/verify` re-checks
# every entry with a deterministic Miller–Rabin.
SAFE_PRIMES = (2147483579, 2147483123, 2147482763, 2147481563, 2147481143, 2147480927,
               2147480327, 2147479823, 2147479787, 2147478899, 2147478083, 2147477807,
               2147477687, 2147477159, 2147473283, 2147473127)
PRIME_PAIRS = tuple((p, (p - 1) // 2) for p in SAFE_PRIMES)

MASK32 = (1 << 32) - 1
SENTINEL = 1 << 31          # a_p = 0, a_q = 2^31 >= q: not a field element; the max identity
TARGET_BOUND = 2.0 ** -40   # default bound on the chance that a non-equivalent pair passes
MIN_TESTS = 3
MAX_TESTS = 16
MAX_REDRAWS = 6
_LIMB = 16
_K_CHUNK = 64               # 64·(2^31 − 1)·(2^16 − 1) < 2^53: float64 sums stay exact
_EXP_SPLIT = 15             # exp tables: g^a = T_hi[a >> 15] · T_lo[a & 0x7fff]


class ZeroDivisorDrawn(MugraphError):
    """A random draw hit a zero divisor (p-component); the test is redrawn with fresh inputs."""


# ---- the field -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """Z_p × Z_q with q | p − 1, and g of order q in Z_p* (the image of exp)."""

    p: int
    q: int
    g: int

    def __post_init__(self):
        if not (self.p < 2 ** 31 and (self.p - 1) % self.q == 0 and self.g % self.p != 1
                and pow(self.g, self.q, self.p) == 1):
            raise InvalidInput(f"Field(p={self.p}, q={self.q}, g={self.g}) is not a test field",
                               hint="use p < 2^31 prime, q | p-1 prime, g of order q mod p")

    def image(self, value: float) -> int:
        """The packed field element of a float, exactly (a float is a dyadic rational)."""
        return _image(float(value), self.p, self.q)

    def exp_tables(self) -> tuple[np.ndarray, np.ndarray]:
        return _exp_tables(self.p, self.g)


@functools.lru_cache(maxsize=4096)
def _image(value: float, p: int, q: int) -> int:
    frac = Fraction(value)
    ap = frac.numerator * pow(frac.denominator, -1, p) % p
    aq = frac.numerator * pow(frac.denominator, -1, q) % q
    return (ap << 32) | aq


@functools.lru_cache(maxsize=32)
def _exp_tables(p: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    size = 1 << _EXP_SPLIT
    return _powers(g, size, p), _powers(pow(g, size, p), size, p)


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """[base^0, ..., base^(count-1)] mod p, by doubling the table (count a power of two)."""
    table = np.ones(1, np.int64)
    while len(table) < count:
        table = np.concatenate([table, table * pow(base, len(table), p) % p])
    return table


def pack(ap, aq) -> np.ndarray:
    return (np.asarray(ap, np.int64) << 32) | np.asarray(aq, np.int64)


def unpack(v) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(v, np.int64)
    return v >> 32, v & MASK32


def field_for_draw(rng: np.random.Generator, pair_index: int) -> Field:
    """The test field: a prime pair from the list and a random generator of the order-q group."""
    p, q = PRIME_PAIRS[pair_index % len(PRIME_PAIRS)]
    g = 1
    while g == 1:  # squares of Z_p* form the subgroup of order q; only ±1 square to 1
        g = pow(int(rng.integers(2, p - 1)), 2, p)
    return Field(p, q, g)


# ---- exact modular kernels -----------------------------------------------------------------------
def powmod(a: np.ndarray, e: int, m: int) -> np.ndarray:
    """a^e mod m elementwise for e >= 0 (square and multiply; products stay below 2^62)."""
    result = np.ones(np.shape(a), np.int64)
    base = np.asarray(a, np.int64) % m
    while e:
        if e & 1:
            result = result * base % m
        base = base * base % m
        e >>= 1
    return result


def _inverse(a: np.ndarray, m: int) -> np.ndarray:
    return powmod(a, m - 2, m)  # Fermat; maps 0 to 0


def exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """(a @ b) mod m exactly, for m < 2^31 (NumPy batch broadcasting).

    b is split into 16-bit limbs and one float64 matmul per chunk of K computes a·b_lo and
    a·b_hi together; with a < 2^31 and K <= 64 every partial sum stays below 2^53, so BLAS is
    exact whatever order it sums in.
    """
    a = (a % m).astype(np.float64)
    limbs, n = _limbs(b % m), b.shape[-1]
    total = np.zeros((), np.int64)
    for start in range(0, a.shape[-1], _K_CHUNK):
        c = np.matmul(a[..., start:start + _K_CHUNK], limbs[..., start:start + _K_CHUNK, :])
        c = c.astype(np.int64)
        total = (total + c[..., :n] + (c[..., n:] % m << _LIMB)) % m
    return total


def _limbs(b: np.ndarray) -> np.ndarray:
    """[b mod 2^16, b div 2^16] side by side in float64, written in place (b may be 100s of MiB)."""
    n = b.shape[-1]
    limbs = np.empty(b.shape[:-1] + (2 * n,), np.float64)
    low, high = limbs[..., :n], limbs[..., n:]
    np.multiply(b, 1.0 / (1 << _LIMB), out=high)  # exact: b < 2^31, a power-of-two scale
    np.floor(high, out=high)
    np.multiply(high, -float(1 << _LIMB), out=low)
    np.add(low, b, out=low)
    return limbs


@functools.lru_cache(maxsize=1)
def _blas_thread_setter():
    """OpenBLAS's thread-local thread-count setter when NumPy bundles OpenBLAS, else None."""
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            setter = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
        return setter
    return None


@contextlib.contextmanager
def single_threaded_blas():
    """Run BLAS on the calling thread only (thread-local, restored on exit).

    The interpreter multiplies small tiles; a BLAS thread pool only adds hand-offs there, and on
    a loaded machine (pytest -n 2, a search) spinning pool threads made them 10-100x slower.
    """
    setter = _blas_thread_setter()
    previous = setter(1) if setter is not None else None
    try:
        yield
    finally:
        if setter is not None:
            setter(previous)


# ---- keyed hashing (opaque functions and the max order) ------------------------------------------
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a bijection of uint64 with good avalanche."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def derive_key(key: int, *parts) -> int:
    """A 64-bit sub-key of `key` for a purpose (an op and its parameters, the order, ...)."""
    text = "|".join(repr(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8, key=key.to_bytes(16, "little")).digest()
    return int.from_bytes(digest, "little")


def _u64(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.int64).astype(np.uint64)


# ---- the semantics -------------------------------------------------------------------------------
class FiniteFieldSemantics:
    """The interpreter's semantics interface over Z_p × Z_q (values: packed int64 arrays)."""

    def __init__(self, field: Field, key: int):
        self.field = field
        self.key = key
        self.name = f"finite-field(p={field.p}, q={field.q})"
        self.order_key = np.uint64(derive_key(key, "max-order"))
        self.constant_values: dict[int, float] = {}   # packed image -> float (POW exponents)
        self._op_keys: dict = {}

    # leaves and storage: values are exact, so dtypes and casts do not change them
    def cast(self, x, dtype) -> np.ndarray:
        return np.asarray(x, np.int64)

    def input(self, array, dtype) -> np.ndarray:
        return np.asarray(array, np.int64)

    def constant(self, value: float, shape, dtype) -> np.ndarray:
        if not math.isfinite(value):  # +-inf: a symbol, a keyed random element of this test
            return np.full(shape, int(self.opaque_element("constant", repr(float(value)))), np.int64)
        image = self.field.image(value)
        self.constant_values.setdefault(image, float(value))
        return np.full(shape, image, np.int64)

    def opaque_element(self, *parts) -> np.int64:
        """One keyed pseudo-random field element named by `parts` (the same on both sides)."""
        h = np.uint64(derive_key(self.key, *parts))
        return pack(int(h % np.uint64(self.field.p)),
                    int(mix64(h) % np.uint64(self.field.q)))

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, np.int64)

    def max_identity(self, shape) -> np.ndarray:
        return np.full(shape, SENTINEL, np.int64)

    def empty(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, np.int64)

    # arithmetic
    def elementwise(self, op: TOp, args, arg, dtype) -> np.ndarray:
        return FF_ELEMENTWISE[op](self, *args, arg)

    def matmul(self, a, b, dtype, operand_dtype=None) -> np.ndarray:
        (ap, aq), (bp, bq) = unpack(a), unpack(b)
        return pack(exact_matmul(ap, bp, self.field.p), exact_matmul(aq, bq, self.field.q))

    def reduce_sum(self, x, dim: int, dtype) -> np.ndarray:
        # residues < 2^32 summed in int64: exact for fewer than 2^31 terms
        if np.shape(x)[dim] >= 1 << 31:
            raise VerificationError(f"a sum of {np.shape(x)[dim]} terms is too long for int64")
        xp, xq = unpack(x)
        return pack(xp.sum(axis=dim, keepdims=True) % self.field.p,
                    xq.sum(axis=dim, keepdims=True) % self.field.q)

    def reduce_max(self, x, dim: int, dtype) -> np.ndarray:
        x = np.asarray(x, np.int64)
        best = np.argmax(self.rank(x), axis=dim, keepdims=True)
        return np.take_along_axis(x, best, axis=dim)

    # helpers of the op table
    def rank(self, v: np.ndarray) -> np.ndarray:
        """The keyed total order: a bijective hash of the element; SENTINEL is below all."""
        v = np.asarray(v, np.int64)
        return np.where(v == SENTINEL, np.uint64(0), mix64(_u64(v) ^ self.order_key))

    def opaque(self, op: TOp, params, *values) -> np.ndarray:
        """The same pseudo-random function of (op, params, elements) on both sides of a test."""
        k = self._op_keys.get((op, params))
        if k is None:
            k = self._op_keys[(op, params)] = np.uint64(derive_key(self.key, op.value, params))
        h = mix64(_u64(values[0]) ^ k)
        for v in values[1:]:
            h = mix64(h ^ _u64(v))
        h2 = mix64(h ^ np.uint64(0x9E3779B97F4A7C15))
        return pack((h % np.uint64(self.field.p)).astype(np.int64),
                    (h2 % np.uint64(self.field.q)).astype(np.int64))

    def inverse(self, v: np.ndarray) -> np.ndarray:
        vp, vq = unpack(v)
        vp, vq = vp % self.field.p, vq % self.field.q
        if not np.all(vp):
            raise ZeroDivisorDrawn("a divisor is zero in Z_p for this draw")
        return pack(_inverse(vp, self.field.p), _inverse(vq, self.field.q))

    def power(self, v: np.ndarray, e: int) -> np.ndarray:
        if e < 0:
            return self.power(self.inverse(v), -e)
        vp, vq = unpack(v)
        return pack(powmod(vp, e, self.field.p), powmod(vq, e, self.field.q))

    def exponent_value(self, y: np.ndarray) -> float | None:
        """The float a uniform POW exponent stands for: a constant of this run, or a small
        half-integer however it was computed (e.g. 1.0 + 1.0); None otherwise."""
        y = np.asarray(y, np.int64)
        if y.size == 0 or not np.all(y == y.flat[0]):
            return None
        element = int(y.flat[0])
        found = self.constant_values.get(element)
        return found if found is not None else _half_integers(self.field).get(element)


@functools.lru_cache(maxsize=32)
def _half_integers(field: Field) -> dict[int, float]:
    return {field.image(k / 2): k / 2 for k in range(-64, 65)}


# ---- the op table: the finite-field column of every TOp ------------------------------------------
# + − × NEG SQUARE, integer POW: componentwise ring operations (matmul and sums: exact_matmul).
# DIV: times the inverse. A zero p-component divisor is detected (ZeroDivisorDrawn) and the test
#   redrawn; in the q-component x/0 = 0 (a "meadow"): exp sends everything to q-component 1, so
#   exp(a) − exp(b) vanishes mod q identically and a strict check would reject valid softmaxes.
# EXP: (g^{a_q} mod p, 1) with g of order q, so exp(a + b) = exp(a)·exp(b), exp(−a) = 1/exp(a)
#   and exp(0) = 1 hold exactly: the online-softmax rescaling identities verify.
# MAX/MIN: the larger/smaller element in a keyed pseudo-random total order. Any total order is
#   associative, commutative and idempotent, so every tiling of a max-reduction yields the
#   spec's element; the running max's −inf is SENTINEL, below every element. RELU = max(x, 0)
#   and CLAMP = min(max(x, lo), hi) are real identities; the keyed order keeps them informative
#   (max(x, 0) is x for some elements and 0 for others, differently per test).
# SQRT LOG SILU GELU SIGMOID TANH ERF IS_FINITE LEAKY_RELU, non-integer POW: one keyed
#   pseudo-random function of (op, params, elements) per test, the same on both sides:
#   consistent, not an approximation. RSQRT = 1 / SQRT and POW ±0.5 = SQRT / RSQRT keep the real
#   identities between them, as do LOG1P = LOG(1 + x), EXPM1 = EXP(x) − 1, SOFTPLUS =
#   LOG(1 + EXP(x)) and ABS = MAX(x, −x).
# Comparisons: one keyed function G(a, b) standing for [a > b]; the rest are its real identities
#   (lt(a, b) = G(b, a), ge = 1 − lt, le = 1 − gt, eq = 1 − G(a, b) − G(b, a), ne = 1 − eq).
#   Never the keyed order of MAX: ties (a = b) have probability ~1/p here, so gt and ge would
#   agree on every draw and a program that confuses them would pass.
# SELECT(c, a, b) = b + T(c)·(a − b), T a keyed function of c standing for [c != 0]: exact in
#   a and b (tilings and factorings of the branches verify), and sound for any c, not only 0/1
#   masks. A polynomial identity in the free symbols G, T, ... holds for their real values too.
# ±inf constants are keyed symbols of the test (atoms), like the outputs of opaque functions.
# Constants: a float is a dyadic rational m·2^e, mapped exactly to m·inv(2)^(−e) (`Field.image`).
def _componentwise(fp, fq):
    def apply(sem, a, b, arg):
        (ap, aq), (bp, bq) = unpack(a), unpack(b)
        return pack(fp(ap, bp) % sem.field.p, fq(aq, bq) % sem.field.q)
    return apply


def _neg(sem, x, arg):
    xp, xq = unpack(x)
    return pack(-xp % sem.field.p, -xq % sem.field.q)


def _exp(sem, x, arg):
    lo_table, hi_table = sem.field.exp_tables()
    e = unpack(x)[1] % sem.field.q
    low = (1 << _EXP_SPLIT) - 1
    return pack(hi_table[e >> _EXP_SPLIT] * lo_table[e & low] % sem.field.p,
                np.ones(np.shape(e), np.int64))


def _div(sem, a, b, arg):
    return _MUL(sem, a, sem.inverse(b), None)


def _max(sem, a, b, arg):
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    return np.where(sem.rank(a) >= sem.rank(b), a, b)


def _min(sem, a, b, arg):
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    return np.where(sem.rank(a) <= sem.rank(b), a, b)


def _relu(sem, x, arg):
    return _max(sem, x, np.zeros((), np.int64), None)


def _clamp(sem, x, arg):
    lo, hi = (np.int64(sem.field.image(v)) for v in arg)
    return _min(sem, _max(sem, x, lo, None), hi, None)


def _opaque(op):
    return lambda sem, x, arg: sem.opaque(op, arg, x)


def _rsqrt(sem, x, arg):
    return sem.inverse(sem.opaque(TOp.SQRT, None, x))


def _pow(sem, x, y, arg):
    e = sem.exponent_value(y)
    if e is None:
        return sem.opaque(TOp.POW, None, *np.broadcast_arrays(x, y))
    if e == int(e) and abs(e) <= 2 ** 62:
        return sem.power(x, int(e))
    if e == 0.5:
        return sem.opaque(TOp.SQRT, None, x)
    if e == -0.5:
        return _rsqrt(sem, x, None)
    return sem.opaque(TOp.POW, e, x)


_ADD = _componentwise(lambda a, b: a + b, lambda a, b: a + b)
_SUB = _componentwise(lambda a, b: a - b, lambda a, b: a - b)
_MUL = _componentwise(lambda a, b: a * b, lambda a, b: a * b)
_ONE = np.int64((1 << 32) | 1)   # the packed 1 (1 in Z_p and in Z_q)


def _abs(sem, x, arg):
    return _max(sem, x, _neg(sem, x, None), None)


def _log1p(sem, x, arg):
    return sem.opaque(TOp.LOG, None, _ADD(sem, x, _ONE, None))


def _softplus(sem, x, arg):
    return sem.opaque(TOp.LOG, None, _ADD(sem, _exp(sem, x, None), _ONE, None))


def _opaque2(op):
    return lambda sem, x, y, arg: sem.opaque(op, None, *np.broadcast_arrays(x, y))


def _greater(sem, a, b):
    """The one opaque order test: gt(a, b) for elements a, b."""
    return sem.opaque(TOp.GT, None, *np.broadcast_arrays(a, b))


def _not(sem, mask):
    return _SUB(sem, _ONE, mask, None)


def _eq(sem, a, b, arg):
    return _SUB(sem, _not(sem, _greater(sem, a, b)), _greater(sem, b, a), None)


def _select(sem, c, a, b, arg):
    """b + T(c)·(a − b), T(c) a keyed function of the predicate standing for [c != 0]."""
    c, a, b = np.broadcast_arrays(c, a, b)
    return _ADD(sem, b, _MUL(sem, sem.opaque(TOp.SELECT, None, c), _SUB(sem, a, b, None), None),
                None)

FF_ELEMENTWISE = {
    TOp.EXP: _exp,
    TOp.LOG: _opaque(TOp.LOG),
    TOp.SQUARE: lambda sem, x, arg: _MUL(sem, x, x, None),
    TOp.SQRT: _opaque(TOp.SQRT),
    TOp.RSQRT: _rsqrt,
    TOp.SILU: _opaque(TOp.SILU),
    TOp.GELU: _opaque(TOp.GELU),
    TOp.RELU: _relu,
    TOp.SIGMOID: _opaque(TOp.SIGMOID),
    TOp.TANH: _opaque(TOp.TANH),
    TOp.ERF: _opaque(TOp.ERF),
    TOp.NEG: _neg,
    TOp.CLAMP: _clamp,
    TOp.ADD: _ADD,
    TOp.SUB: _SUB,
    TOp.MUL: _MUL,
    TOp.DIV: _div,
    TOp.POW: _pow,
    TOp.MAX: _max,
    TOp.MIN: _min,
    TOp.ABS: _abs,
    TOp.LOG1P: _log1p,
    TOp.EXPM1: lambda sem, x, arg: _SUB(sem, _exp(sem, x, None), _ONE, None),
    TOp.SOFTPLUS: _softplus,
    TOp.LEAKY_RELU: _opaque2(TOp.LEAKY_RELU),
    TOp.GT: lambda sem, a, b, arg: _greater(sem, a, b),
    TOp.LT: lambda sem, a, b, arg: _greater(sem, b, a),
    TOp.GE: lambda sem, a, b, arg: _not(sem, _greater(sem, b, a)),
    TOp.LE: lambda sem, a, b, arg: _not(sem, _greater(sem, a, b)),
    TOp.EQ: _eq,
    TOp.NE: lambda sem, a, b, arg: _not(sem, _eq(sem, a, b, None)),
    TOp.IS_FINITE: _opaque(TOp.IS_FINITE),
    TOp.SELECT: _select,
}


# ---- the degree bound (Schwartz–Zippel) ----------------------------------------------------------
# Every output element is a rational function N/D of "atoms": the input elements, each opaque
# function's outputs and each exp's outputs, every atom of degree 1. Spec and candidate agree on
# an element iff N_s·D_c − N_c·D_s = 0, a polynomial of degree d <= max(n_s + d_c, n_c + d_s),
# which the tables below bound per node as (numerator, denominator) degrees. Conservative: a sum
# of n rational terms may need the product of their n denominators; max/min take the larger of
# their operands' degrees (they select one). If the graphs differ, that polynomial is nonzero and
# Schwartz–Zippel gives P[agree] <= d/|S| with atoms uniform on S: inputs and opaque outputs on
# Z_p, exp outputs on the order-q subgroup, so d/q per test and Π d/q_i over independent tests
# (fresh inputs, keys and primes). Rigorous for +, −, ×, /, matmul, sums, integer powers and
# constants, given a coefficient of the difference not divisible by p (p > 2^30 and a different
# p per test). Opaque outputs are modelled as a random oracle (fresh uniform values per distinct
# argument) and exp outputs as independent uniform subgroup elements where their exponents
# differ: heuristic, like Li & Wu's conjecture for exponentiation gates. Redraws condition on
# nonzero divisors, which changes the bound by a factor 1 + O(#divisions · d / p).
ATOM = (1, 0)
LEAF = (0, 0)


def _d_add(a, b):
    return (max(a[0] + b[1], b[0] + a[1]), a[1] + b[1])


def _d_mul(a, b):
    return (a[0] + b[0], a[1] + b[1])


def _d_div(a, b):
    return (a[0] + b[1], a[1] + b[0])


def _d_sum(a, n: int):
    return a if a[1] == 0 else (a[0] + (n - 1) * a[1], n * a[1])


def _d_pow(node, a, b):
    e = _fold(node.srcs[1])
    if e is None or e.denominator != 1:
        return (0, 1) if e == Fraction(-1, 2) else ATOM
    e = int(e)
    return (e * a[0], e * a[1]) if e >= 0 else (-e * a[1], -e * a[0])


_FOLD = {TOp.ADD: lambda a, b: a + b, TOp.SUB: lambda a, b: a - b, TOp.MUL: lambda a, b: a * b,
         TOp.DIV: lambda a, b: a / b if b else None, TOp.NEG: lambda a: -a}


def _fold(node) -> Fraction | None:
    """The exact value of a constant-only expression (an exponent), or None."""
    if node.op in (KOp.CONSTANT, BOp.CONSTANT):
        return Fraction(node.arg[0]) if math.isfinite(node.arg[0]) else None
    if node.op in (KOp.BROADCAST, KOp.RESHAPE, KOp.TRANSPOSE):
        return _fold(node.srcs[0])
    if node.op not in _FOLD:
        return None
    values = [_fold(s) for s in node.srcs]
    return None if None in values else _FOLD[node.op](*values)


def _d_same(node, a, *rest):
    return a


def _d_atom(node, *args):
    return ATOM


def _d_select(node, c, a, b):
    return _d_add(b, _d_mul(ATOM, _d_add(a, b)))


DEGREE_ELEMENTWISE = {
    TOp.EXP: _d_atom, TOp.LOG: _d_atom, TOp.SQRT: _d_atom, TOp.SILU: _d_atom,
    TOp.GELU: _d_atom, TOp.SIGMOID: _d_atom, TOp.TANH: _d_atom, TOp.ERF: _d_atom,
    TOp.LOG1P: _d_atom, TOp.SOFTPLUS: _d_atom, TOp.IS_FINITE: _d_atom, TOp.LEAKY_RELU: _d_atom,
    TOp.GT: _d_atom, TOp.GE: _d_atom, TOp.LT: _d_atom, TOp.LE: _d_atom, TOp.EQ: _d_atom,
    TOp.NE: _d_atom, TOp.SELECT: _d_select,
    TOp.EXPM1: _d_atom, TOp.ABS: _d_same,
    TOp.RSQRT: lambda node, a: (0, 1),
    TOp.SQUARE: lambda node, a: _d_mul(a, a),
    TOp.NEG: _d_same, TOp.RELU: _d_same, TOp.CLAMP: _d_same,
    TOp.ADD: lambda node, a, b: _d_add(a, b),
    TOp.SUB: lambda node, a, b: _d_add(a, b),
    TOp.MUL: lambda node, a, b: _d_mul(a, b),
    TOp.DIV: lambda node, a, b: _d_div(a, b),
    TOp.POW: _d_pow,
    TOp.MAX: lambda node, a, b: (max(a[0], b[0]), max(a[1], b[1])),
    TOp.MIN: lambda node, a, b: (max(a[0], b[0]), max(a[1], b[1])),
}


def _d_matmul(node, a, b):
    return _d_sum(_d_mul(a, b), node.srcs[0].shape[-1])


def _d_rms_norm(node, a):
    return (a[0], a[1] + 1)  # x · 1/sqrt(mean(x^2) + eps): the sqrt is an atom


def _d_concat(node, *args):
    return (max(a[0] for a in args), max(a[1] for a in args))


def _d_constant(node):
    return LEAF if math.isfinite(node.arg[0]) else ATOM   # +-inf is a keyed symbol


KERNEL_DEGREE = {
    KOp.CONSTANT: _d_constant,
    KOp.IOTA: lambda node: LEAF,
    KOp.MATMUL: _d_matmul,
    KOp.REDUCE_SUM: lambda node, a: _d_sum(a, node.srcs[0].shape[node.arg]),
    KOp.REDUCE_MAX: _d_same,
    KOp.RMS_NORM: _d_rms_norm,
    KOp.CONCAT: _d_concat,
    KOp.TRANSPOSE: _d_same, KOp.RESHAPE: _d_same, KOp.BROADCAST: _d_same,
} | DEGREE_ELEMENTWISE


def _d_rescaled(a, iterations: int):
    acc = LEAF
    for _ in range(iterations):  # acc = acc · exp(m_prev − m) + x: one exp atom per iteration
        acc = _d_add(_d_mul(acc, ATOM), a)
    return acc


BLOCK_DEGREE = {
    BOp.CONSTANT: _d_constant,
    BOp.MATMUL: _d_matmul,
    BOp.REDUCE_SUM: lambda node, a: _d_sum(a, node.srcs[0].shape[node.arg]),
    BOp.REDUCE_MAX: _d_same,
    BOp.RMS_NORM: _d_rms_norm,
    BOp.THREAD: lambda node, *a: evaluate_thread(node, a, lambda m, v: BLOCK_DEGREE[m.op](m, *v)),
} | DEGREE_ELEMENTWISE

# accumulators also need the trip count: (node, source degrees..., forloop) -> degree
ACC_DEGREE = {
    BOp.ACC_SUM: lambda node, a, f: _d_sum(a, f),
    BOp.ACC_SUM_LAST: lambda node, a, f: _d_sum(a, f * node.srcs[0].shape[-1]),
    BOp.ACC_RMS_LAST: lambda node, a, f: ATOM,
    BOp.ACC_MAX: lambda node, a, f: a,
    BOp.ACC_MAX_LAST: lambda node, a, f: a,
    BOp.ACC_SUM_RESCALE: lambda node, a, m, f: _d_rescaled(a, f),
    BOp.ACC_SUM_LAST_RESCALE: lambda node, a, m, f: _d_rescaled(
        _d_sum(a, node.srcs[0].shape[-1]), f),
}


def output_degrees(graph: KernelGraph) -> list[tuple[int, int]]:
    """(numerator, denominator) degree of every output of `graph`, in the atoms."""
    degree: dict = {}
    blocks: dict = {}
    for node in graph.nodes:
        if node.op is KOp.INPUT:
            degree[node] = ATOM
        elif node.op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if key not in blocks:
                blocks[key] = _block_degrees(node.arg[0], [degree[s] for s in node.srcs])
            degree[node] = blocks[key][node.arg[1]]
        else:
            degree[node] = KERNEL_DEGREE[node.op](node, *(degree[s] for s in node.srcs))
    return [degree[o] for o in graph.outputs]


def _block_degrees(bg: BlockGraph, inputs: list) -> list:
    degree: dict = {}
    for node in bg.nodes:
        srcs = [degree[s] for s in node.srcs]
        if node.op is BOp.INPUT:
            degree[node] = inputs[node.arg.index]
        elif node.op in ACC_DEGREE:
            degree[node] = ACC_DEGREE[node.op](node, *srcs, bg.forloop)
        else:
            degree[node] = BLOCK_DEGREE[node.op](node, *srcs)
    return [degree[o.node] for o in bg.outputs]


def degree_bound(spec: KernelGraph, candidate: KernelGraph) -> int:
    """d: a degree bound of spec_i − candidate_i (denominators cleared) over every output i."""
    d = 1
    for (ns, ds), (nc, dc) in zip(output_degrees(spec), output_degrees(candidate)):
        d = max(d, ns + dc, nc + ds)
    return d


def error_bound(degree: int, qs) -> float:
    """Π_i min(1, d / q_i): the chance that a non-equivalent pair passes every test."""
    return math.prod(min(1.0, degree / q) for q in qs)


def tests_needed(degree: int, target: float = TARGET_BOUND) -> int:
    """The fewest tests (at least MIN_TESTS, at most MAX_TESTS) whose bound reaches `target`."""
    q = min(q for _, q in PRIME_PAIRS)
    per_test = degree / q
    if per_test >= 1.0:
        return MAX_TESTS
    return max(MIN_TESTS, min(MAX_TESTS, math.ceil(math.log(target) / math.log(per_test))))


# ---- running the tests ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Draw:
    """One random test: its field, its hash key and the seed of its inputs."""

    field: Field
    key: int
    inputs_seed: np.random.SeedSequence
    test: int
    attempt: int

    def semantics(self) -> FiniteFieldSemantics:
        return FiniteFieldSemantics(self.field, self.key)


def make_draw(seed: int, test: int, attempt: int) -> Draw:
    """Deterministic in (seed, test, attempt); a fresh prime pair per test (seeded permutation)."""
    order = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1 << 30,))) \
        .permutation(len(PRIME_PAIRS))
    ss = np.random.SeedSequence(seed, spawn_key=(test, attempt))
    key_ss, field_ss, inputs_ss = ss.spawn(3)
    pair = int(order[(test + attempt) % len(order)])
    field = field_for_draw(np.random.default_rng(field_ss), pair)
    key = int.from_bytes(key_ss.generate_state(4, np.uint32).tobytes(), "little")  # 128 bits
    return Draw(field, key, inputs_ss, test, attempt)


def draw_inputs(graph: KernelGraph, draw: Draw) -> dict[str, np.ndarray]:
    """Independent uniform field elements for every input (one child seed per input)."""
    arrays = {}
    for node, ss in zip(graph.inputs, draw.inputs_seed.spawn(len(graph.inputs))):
        # one uniform integer below p·q in mixed radix is a uniform (a_p, a_q): one RNG call
        flat = np.random.default_rng(ss).integers(0, draw.field.p * draw.field.q, node.shape,
                                                  np.int64)
        arrays[node.arg[0]] = pack(*np.divmod(flat, draw.field.q))
    return arrays


def evaluate(graph: KernelGraph, draw: Draw, inputs=None) -> list[np.ndarray]:
    """`graph`'s outputs for one draw (raises ZeroDivisorDrawn)."""
    inputs = draw_inputs(graph, draw) if inputs is None else inputs
    with single_threaded_blas():
        return interpret(graph, inputs, semantics=draw.semantics())


@functools.lru_cache(maxsize=2)
def _inputs(spec: KernelGraph, seed: int, test: int, attempt: int) -> dict[str, np.ndarray]:
    # few entries: full-shape inputs are large (a 4096² weight is 128 MiB of packed elements)
    return draw_inputs(spec, make_draw(seed, test, attempt))


@functools.lru_cache(maxsize=32)
def _spec_outputs(spec: KernelGraph, seed: int, test: int, attempt: int) -> list[np.ndarray]:
    # the search checks many candidates against one spec: its outputs are worth caching
    return evaluate(spec, make_draw(seed, test, attempt), _inputs(spec, seed, test, attempt))


def clear_caches() -> None:
    """Forget cached spec inputs and outputs (frees memory; benchmarks time first calls)."""
    _inputs.cache_clear()
    _spec_outputs.cache_clear()


@dataclass(frozen=True)
class FiniteFieldResult:
    """The outcome of the exact random tests and the bound they give."""

    passed: bool
    tests: int                 # tests run (a failing run stops at the first failing test)
    primes: tuple              # (p, q) of every test run
    degree: int                # d in the Schwartz–Zippel bound
    error_bound: float         # Π d/q_i over the tests run (meaningful when passed)
    log2_bound: float
    seconds: float
    redraws: int = 0           # draws discarded because a divisor was zero
    failure: str | None = None

    def __str__(self) -> str:
        state = "passed" if self.passed else f"FAILED: {self.failure}"
        return (f"finite field: {state}; {self.tests} tests, d = {self.degree}, bound "
                f"{self.error_bound:.3g} (2^{self.log2_bound:.1f}), {self.redraws} redraws, "
                f"{self.seconds:.2f}s")


def finite_field_test(spec: KernelGraph, candidate: KernelGraph, *, tests: int | None = None,
                      seed: int = 0, target: float = TARGET_BOUND,
                      max_redraws: int = MAX_REDRAWS) -> FiniteFieldResult:
    """Run `tests` independent exact tests (default: enough for `target`); stop at a mismatch."""
    start = time.perf_counter()
    if tests is not None and (not isinstance(tests, int) or tests < 1):
        raise InvalidInput(f"tests={tests!r} is not a positive number of tests",
                           hint="use None for enough tests to reach the target bound")
    degree = degree_bound(spec, candidate)
    count = tests if tests is not None else tests_needed(degree, target)
    primes, redraws = [], 0
    for test in range(count):
        draw, outcome, used = _run_one(spec, candidate, seed, test, max_redraws)
        redraws += used
        primes.append((draw.field.p, draw.field.q))
        if outcome is not None:
            return _result(False, primes, degree, start, redraws, outcome)
    return _result(True, primes, degree, start, redraws, None)


def _run_one(spec, candidate, seed, test, max_redraws):
    for attempt in range(max_redraws + 1):
        try:
            expected = _spec_outputs(spec, seed, test, attempt)
            draw = make_draw(seed, test, attempt)
            got = evaluate(candidate, draw, _inputs(spec, seed, test, attempt))
        except ZeroDivisorDrawn:
            continue
        return draw, _first_mismatch(expected, got, draw), attempt
    raise VerificationError(
        f"finite-field test {test}: every one of {max_redraws + 1} draws hit a zero divisor",
        hint="a denominator is identically zero in Z_p (e.g. x - x); simplify the graph")


def _first_mismatch(expected, got, draw: Draw) -> str | None:
    for i, (a, b) in enumerate(zip(expected, got)):
        if a.shape != b.shape:
            return f"output {i} has shape {b.shape}, the spec's is {a.shape}"
        bad = np.argwhere(a != b)
        if len(bad):
            idx = tuple(int(v) for v in bad[0])
            (sp, sq), (cp, cq) = unpack(a[idx]), unpack(b[idx])
            return (f"test {draw.test} (p={draw.field.p}, q={draw.field.q}): output {i} differs "
                    f"at {idx} ({len(bad)} of {a.size} elements): spec ({int(sp)}, {int(sq)}), "
                    f"candidate ({int(cp)}, {int(cq)})")
    return None


def _result(passed, primes, degree, start, redraws, failure) -> FiniteFieldResult:
    bound = error_bound(degree, [q for _, q in primes]) if passed else 1.0
    log2 = math.log2(bound) if bound > 0 else -math.inf
    return FiniteFieldResult(passed, len(primes), tuple(primes), degree, bound, log2,
                             time.perf_counter() - start, redraws, failure)
