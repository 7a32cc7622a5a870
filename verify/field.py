"""The arithmetic under the finite-field test: random safe-prime fields, exact modular matmul,
keyed hashing and a keyed pseudo-random permutation of Z_p, and the packed (Z_p, Z_q) values."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mugraph.ir.errors import InvalidInput

# ---- primes --------------------------------------------------------------------------------------
# Each test draws a safe prime p = 2q + 1 with q uniform among the primes in [Q_MIN, 2·Q_MIN), so
# p < 2^31 (a product of two residues stays below 2^62 in int64) and every field has q >= Q_MIN.
Q_MIN = 1 << 29
_MR_BASES = (2, 3, 5, 7)      # deterministic Miller–Rabin below 3,215,031,751 > 2^31
_SMALL_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73)


def is_prime(n: int) -> bool:
    """Deterministic primality for n < 3,215,031,751 (Miller–Rabin with bases 2, 3, 5, 7)."""
    if n < 2:
        return False
    for b in _MR_BASES:
        if n % b == 0:
            return n == b
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def random_safe_prime(rng: np.random.Generator) -> tuple[int, int]:
    """(p, q): q a uniformly random prime in [Q_MIN, 2·Q_MIN) with p = 2q + 1 prime."""
    while True:
        q = int(rng.integers(Q_MIN, 2 * Q_MIN)) | 1
        if any(q % s == 0 or (2 * q + 1) % s == 0 for s in _SMALL_PRIMES):
            continue
        if is_prime(q) and is_prime(2 * q + 1):
            return 2 * q + 1, q


# ---- the field -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """Z_p with q | p − 1 and g of order q in Z_p* (the image of exp is the order-q subgroup)."""

    p: int
    q: int
    g: int

    def __post_init__(self):
        if not (self.p < 2 ** 31 and (self.p - 1) % self.q == 0 and self.g % self.p != 1
                and pow(self.g, self.q, self.p) == 1):
            raise InvalidInput(f"Field(p={self.p}, q={self.q}, g={self.g}) is not a test field",
                               hint="use p < 2^31 prime, q | p-1 prime, g of order q mod p")

    def residues(self, value: float) -> tuple[int, int]:
        """(value mod p, value mod q) exactly: a float is a dyadic rational m·2^e."""
        return _residues(float(value), self.p, self.q)

    def exp_tables(self) -> tuple[np.ndarray, np.ndarray]:
        return _exp_tables(self.p, self.g)


def field_for_draw(rng: np.random.Generator) -> Field:
    """A random test field: a random safe prime and a random generator of the order-q group."""
    p, q = random_safe_prime(rng)
    g = 1
    while g == 1:  # the squares of Z_p* form the subgroup of order q; only ±1 square to 1
        g = pow(int(rng.integers(2, p - 1)), 2, p)
    return Field(p, q, g)


@functools.lru_cache(maxsize=4096)
def _residues(value: float, p: int, q: int) -> tuple[int, int]:
    frac = Fraction(value)
    return (frac.numerator * pow(frac.denominator, -1, p) % p,
            frac.numerator * pow(frac.denominator, -1, q) % q)


EXP_SPLIT = 15             # g^a = T_hi[a >> 15] · T_lo[a & 0x7fff] for a < 2^30


@functools.lru_cache(maxsize=32)
def _exp_tables(p: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    size = 1 << EXP_SPLIT
    return _powers(g, size, p), _powers(pow(g, size, p), size, p)


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """[base^0, ..., base^(count-1)] mod p, by doubling the table (count a power of two)."""
    table = np.ones(1, np.int64)
    while len(table) < count:
        table = np.concatenate([table, table * pow(base, len(table), p) % p])
    return table


def power_of_g(field: Field, e: np.ndarray) -> np.ndarray:
    """g^e mod p elementwise, for exponents 0 <= e < q."""
    lo, hi = field.exp_tables()
    e = np.asarray(e, np.int64)
    return hi[e >> EXP_SPLIT] * lo[e & ((1 << EXP_SPLIT) - 1)] % field.p


# ---- packed values -------------------------------------------------------------------------------
# A value with an exponent image is one int64: the Z_p residue in bits 0-30, the Z_q residue in
# bits 32-62, and the sign bit for ⊥ ("no exponent image": the q bits are then 0). A value of a
# test that needs no exponent image is the bare Z_p residue.
P_BITS = np.int64((1 << 32) - 1)
Q_BITS = np.int64((1 << 31) - 1)
BOTTOM = np.int64(-(1 << 63))


def p_part(v) -> np.ndarray:
    return np.asarray(v, np.int64) & P_BITS


def q_part(v) -> np.ndarray:
    return (np.asarray(v, np.int64) >> 32) & Q_BITS


def is_bottom(v) -> np.ndarray:
    return np.asarray(v, np.int64) < 0


def join(p, q, bottom=None) -> np.ndarray:
    """Pack residues; where `bottom` holds, the value has no exponent image (⊥)."""
    v = np.asarray(p, np.int64) | (np.asarray(q, np.int64) << 32)
    if bottom is None:
        return v
    return np.where(bottom, np.asarray(p, np.int64) | BOTTOM, v)


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


def inverse_mod(a: np.ndarray, m: int) -> np.ndarray:
    return powmod(a, m - 2, m)  # Fermat; maps 0 to 0


# (limb bits, limbs, K per chunk): every partial sum of a chunk, (K)·(2^bits − 1)·(2^31 − 1), stays
# below 2^53, so float64 BLAS is exact whatever order it sums in. Two 16-bit limbs for short K
# (one chunk up to 64), three 11-bit limbs with chunks of 2048 otherwise.
_SHORT = (16, 2, 64)
_LONG = (11, 3, 1 << 11)


def exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """(a @ b) mod m exactly, for residues 0 <= a, b < m < 2^31 (NumPy batch broadcasting).

    The operand with fewer elements is split into limbs, the other is converted to float64, and
    one float64 matmul per chunk along K computes every limb's product exactly.
    """
    if np.size(a) <= np.size(b):
        return _matmul_split_left(np.asarray(a, np.int64), np.asarray(b, np.int64), m)
    swapped = _matmul_split_left(np.swapaxes(np.asarray(b, np.int64), -1, -2),
                                 np.swapaxes(np.asarray(a, np.int64), -1, -2), m)
    return np.ascontiguousarray(np.swapaxes(swapped, -1, -2))


def _matmul_split_left(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    rows, k = a.shape[-2], a.shape[-1]
    bits, count, chunk = _SHORT if k <= _SHORT[2] else _LONG
    limbs = np.concatenate([(a >> (bits * i)) & ((1 << bits) - 1) for i in range(count)],
                           axis=-2).astype(np.float64)
    right = b.astype(np.float64)
    total = None
    for start in range(0, k, chunk):
        c = np.matmul(limbs[..., start:start + chunk], right[..., start:start + chunk, :])
        part = _fmod(c[..., (count - 1) * rows:, :], m)
        for i in reversed(range(count - 1)):   # Horner on reduced limbs: below 2^48 throughout
            part = _fmod(part * (1 << bits) + _fmod(c[..., i * rows:(i + 1) * rows, :], m), m)
        total = part if total is None else _fmod(total + part, m)
    if total is None:  # K = 0
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (rows, b.shape[-1])
        return np.zeros(shape, np.int64)
    return total.astype(np.int64)


def _fmod(x: np.ndarray, m: int) -> np.ndarray:
    """x mod m for integers 0 <= x < 2^53 held in float64, exactly: the quotient from one
    rounded division is off by at most one, which one correction fixes."""
    r = x - np.floor(x * (1.0 / m)) * m
    np.add(r, m, out=r, where=r < 0)
    np.subtract(r, m, out=r, where=r >= m)
    return r


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


# ---- keyed hashing -------------------------------------------------------------------------------
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a bijection of uint64 with good avalanche."""
    z = np.asarray(z, np.uint64)
    if z.ndim == 0:  # NumPy warns on scalar overflow, not on arrays: wrapping is the point
        return mix64(z.reshape(1))[0]
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def derive_key(key: int, *parts) -> int:
    """A 64-bit sub-key of `key` for a purpose (an op and its parameters, a permutation, ...)."""
    text = "|".join(repr(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8, key=key.to_bytes(16, "little")).digest()
    return int.from_bytes(digest, "little")


def as_u64(v) -> np.ndarray:
    return np.asarray(v, np.int64).astype(np.uint64)


# ---- a keyed pseudo-random permutation of Z_p ----------------------------------------------------
_ROUNDS = 4


class Permutation:
    """A keyed pseudo-random permutation of [0, p): a 4-round unbalanced Feistel network on
    p.bit_length()-bit words (round function: keyed multiply-xorshift), restricted to [0, p) by
    cycle walking. It has no algebraic relation to the field operations, which is what lets max
    and min be modelled with it."""

    def __init__(self, key: int, p: int):
        bits = p.bit_length()
        self.low_bits = np.uint64(bits // 2)
        self.low = np.uint64((1 << (bits // 2)) - 1)
        self.high = np.uint64((1 << (bits - bits // 2)) - 1)
        keys = [derive_key(key, "feistel", r) for r in range(2 * _ROUNDS)]
        self.keys = [(np.uint64(keys[2 * r]), np.uint64(keys[2 * r + 1] | 1))
                     for r in range(_ROUNDS)]
        self.p = np.uint64(p)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._walk(as_u64(x), self._forward)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        return self._walk(as_u64(y), self._backward)

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        y = step(x)
        outside = y >= self.p
        while outside.any():
            y[outside] = step(y[outside])
            outside = y >= self.p
        return y.astype(np.int64)

    @staticmethod
    def _round(x: np.ndarray, salt, odd) -> np.ndarray:
        z = (x ^ salt) * odd
        return z ^ (z >> np.uint64(29))

    def _forward(self, x: np.ndarray) -> np.ndarray:
        high, low = x >> self.low_bits, x & self.low
        for r, (salt, odd) in enumerate(self.keys):
            if r % 2 == 0:
                high = high ^ ((self._round(low, salt, odd) >> np.uint64(32)) & self.high)
            else:
                low = low ^ ((self._round(high, salt, odd) >> np.uint64(32)) & self.low)
        return (high << self.low_bits) | low

    def _backward(self, y: np.ndarray) -> np.ndarray:
        high, low = y >> self.low_bits, y & self.low
        for r in reversed(range(_ROUNDS)):
            salt, odd = self.keys[r]
            if r % 2 == 0:
                high = high ^ ((self._round(low, salt, odd) >> np.uint64(32)) & self.high)
            else:
                low = low ^ ((self._round(high, salt, odd) >> np.uint64(32)) & self.low)
        return (high << self.low_bits) | low
