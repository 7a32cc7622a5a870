"""The arithmetic under the finite-field test: random safe-prime fields of about 2^51, exact
modular products, sums and matmuls (float64 arithmetic, error-free by construction), keyed
hashing onto Z_p exactly uniformly, a keyed pseudo-random permutation of Z_p, and the (Z_p, Z_q)
value pairs."""
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
# 2^50 < p < 2^51: every residue is exact in float64, a product's quotient by p is found from
# float64 within one (`mulmod`), and every field has q >= Q_MIN = 2^49, so that one test's
# collision terms (pairs of exps in an attention row: C(8192, 2) of them) stay far below 1.
Q_MIN = 1 << 49
P_LIMIT = 1 << 51
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)   # deterministic below 3.1e23 > 2^51
_SMALL_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73,
                 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157)


def is_prime(n: int) -> bool:
    """Deterministic primality for n < 3.1e23 (Miller–Rabin with the first twelve primes)."""
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
        if not (self.p < P_LIMIT and (self.p - 1) % self.q == 0 and self.g % self.p != 1
                and pow(self.g, self.q, self.p) == 1):
            raise InvalidInput(f"Field(p={self.p}, q={self.q}, g={self.g}) is not a test field",
                               hint="use p < 2^51 prime, q | p-1 prime, g of order q mod p")

    def residues(self, value: float) -> tuple[int, int]:
        """(value mod p, value mod q) exactly: a float is a dyadic rational m·2^e."""
        return _residues(float(value), self.p, self.q)

    def exp_tables(self) -> tuple[np.ndarray, ...]:
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


EXP_SPLIT = 17             # g^a = T0[a mod 2^17] · T1[(a >> 17) mod 2^17] · T2[a >> 34], a < 2^51


@functools.lru_cache(maxsize=32)
def _exp_tables(p: int, g: int) -> tuple[np.ndarray, ...]:
    size = 1 << EXP_SPLIT
    return tuple(_powers(pow(g, 1 << (EXP_SPLIT * k), p), size, p) for k in range(3))


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """[base^0, ..., base^(count-1)] mod p, by doubling the table (count a power of two)."""
    table = np.ones(1, np.int64)
    while len(table) < count:
        table = np.concatenate([table, mulmod(table, np.int64(pow(base, len(table), p)), p)])
    return table


def power_of_g(field: Field, e: np.ndarray) -> np.ndarray:
    """g^e mod p elementwise, for exponents 0 <= e < q."""
    t0, t1, t2 = field.exp_tables()
    e = np.asarray(e, np.int64)
    mask = (1 << EXP_SPLIT) - 1
    low = mulmod(t0[e & mask], t1[(e >> EXP_SPLIT) & mask], field.p)
    return mulmod(low, t2[e >> (2 * EXP_SPLIT)], field.p)


# ---- values --------------------------------------------------------------------------------------
# A value with an exponent image is a record (p: its Z_p residue, q: its Z_q residue, or -1 for ⊥,
# "no exponent image"); a value of a test that needs no exponent image is the bare Z_p residue.
VALUE = np.dtype([("p", np.int64), ("q", np.int64)])


def p_part(v) -> np.ndarray:
    return np.asarray(v)["p"]


def q_part(v) -> np.ndarray:
    """The Z_q residue (-1 where the value has none)."""
    return np.asarray(v)["q"]


def is_bottom(v) -> np.ndarray:
    return np.asarray(v)["q"] < 0


def join(p, q, bottom=None) -> np.ndarray:
    """Pair residues; where `bottom` holds, the value has no exponent image (⊥)."""
    p, q = np.broadcast_arrays(np.asarray(p, np.int64), np.asarray(q, np.int64))
    out = np.empty(p.shape, VALUE)
    out["p"] = p
    out["q"] = q if bottom is None else np.where(bottom, -1, q)
    return out


def without_image(p) -> np.ndarray:
    """Residues with no exponent image (⊥)."""
    p = np.asarray(p, np.int64)
    out = np.empty(p.shape, VALUE)
    out["p"] = p
    out["q"] = -1
    return out


# ---- exact modular kernels -----------------------------------------------------------------------
# Residues are below 2^51, so they, their sums of up to 2^12 terms and a product's quotient estimate
# stay exact where they must: see `mulmod` and `exact_matmul`.
SUM_CHUNK = 1 << 12


def mulmod(a, b, m: int) -> np.ndarray:
    """a·b mod m elementwise, for residues 0 <= a, b < m < 2^51.

    The quotient comes from float64: a and b are exact, and three roundings put a·b·fl(1/m)
    within (a·b/m)·3.01·2^-53 < 2^51·3.01·2^-53 < 0.76 of a·b/m, so its truncation k is within
    one of floor(a·b/m). a·b − k·m, computed in int64 modulo 2^64, then lies in [−m, 2m) and is
    exact; two conditional corrections bring it into [0, m).
    """
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    estimate = a.astype(np.float64)
    estimate *= b
    estimate *= 1.0 / m
    k = estimate.astype(np.int64)
    with np.errstate(over="ignore"):
        r = a * b
        k *= m
    r -= k
    return _into_range(r, m)


def _into_range(r: np.ndarray, m: int) -> np.ndarray:
    """r mod m for r in [−m, 2m), in place (r is a fresh array)."""
    if np.ndim(r) == 0:
        return np.int64(int(r) % m)
    sign = r >> 63
    sign &= m
    r += sign
    r -= m
    np.right_shift(r, 63, out=sign)
    sign &= m
    r += sign
    return r


def sum_mod(x, axis: int, m: int) -> np.ndarray:
    """The sum along `axis` (kept) mod m, for residues below m < 2^51: int64 sums of at most 2^12
    terms (below 2^63), reduced between chunks."""
    x = np.asarray(x, np.int64)
    n = x.shape[axis]
    if n <= SUM_CHUNK:
        return x.sum(axis=axis, keepdims=True) % m
    total = None
    for start in range(0, n, SUM_CHUNK):
        part = np.take(x, np.arange(start, min(start + SUM_CHUNK, n)), axis=axis)
        part = part.sum(axis=axis, keepdims=True) % m
        total = part if total is None else (total + part) % m
    return total


def powmod(a: np.ndarray, e: int, m: int) -> np.ndarray:
    """a^e mod m elementwise for e >= 0 (square and multiply)."""
    result = np.ones(np.shape(a), np.int64)
    base = np.asarray(a, np.int64) % m
    while e:
        if e & 1:
            result = mulmod(result, base, m)
        base = mulmod(base, base, m)
        e >>= 1
    return result


BATCH_INVERSE = 64          # arrays at least this large are inverted by Montgomery's trick


def inverse_mod(a: np.ndarray, m: int) -> np.ndarray:
    """a^-1 mod m elementwise (m prime; 0 maps to 0). Large arrays: Montgomery's trick on a
    binary tree of products (about 3 products per element and one scalar inversion), small
    ones: Fermat."""
    a = np.asarray(a, np.int64)
    if a.size < BATCH_INVERSE:
        return powmod(a, m - 2, m)
    flat = a.reshape(-1)
    zero = flat == 0
    inv = _tree_inverse(np.where(zero, 1, flat), m)
    return np.where(zero, 0, inv).reshape(a.shape)


def _tree_inverse(v: np.ndarray, m: int) -> np.ndarray:
    levels = [v]
    while len(levels[-1]) > 1:
        level = levels[-1]
        if len(level) % 2:
            level = np.append(level, np.int64(1))
            levels[-1] = level
        levels.append(mulmod(level[0::2], level[1::2], m))
    inv = np.array([pow(int(levels[-1][0]), -1, m)], np.int64)
    for level in reversed(levels[:-1]):
        inv = inv[:len(level) // 2]          # the parent level may carry a padding 1
        down = np.empty(len(level), np.int64)
        down[0::2] = mulmod(inv, level[1::2], m)
        down[1::2] = mulmod(inv, level[0::2], m)
        inv = down
    return inv[:len(v)]


def exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """(a @ b) mod m exactly, for residues 0 <= a, b < m < 2^51 (NumPy batch broadcasting).

    The operand with more elements is split into two 26-bit limbs, the other into s-bit limbs
    with s + 26 + log2(chunk of K) <= 53, so every limb product summed over a chunk of K is an
    integer below 2^53 that float64 BLAS computes exactly whatever order it sums in.
    """
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if np.size(a) <= np.size(b):
        return _matmul_split(a, b, m)
    swapped = _matmul_split(np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2), m)
    return np.ascontiguousarray(np.swapaxes(swapped, -1, -2))


WIDE_BITS = 26              # the larger operand's limbs: residues < 2^51 need two
_SMALL_BITS = 27            # s + log2(chunk): the smaller operand's limb width and the K chunk share it
_MAX_CHUNK_BITS = 10        # 17-bit narrow limbs: three cover 51 bits
_COLUMNS = 1 << 11          # the larger operand's limbs are made this many columns at a time


def _matmul_split(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """a (fewer elements) in narrow limbs, b in two wide ones."""
    k = a.shape[-1]
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if k == 0:
        return np.zeros(shape, np.int64)
    chunk_bits = min(_MAX_CHUNK_BITS, max(0, (k - 1).bit_length()))
    bits = _SMALL_BITS - chunk_bits
    count = -(-51 // bits)
    rows = a.shape[-2]
    limbs = np.concatenate([(a >> (bits * i)) & ((1 << bits) - 1) for i in range(count)],
                           axis=-2).astype(np.float64)
    out = np.empty(shape, np.int64)
    for c0 in range(0, b.shape[-1], _COLUMNS):
        cols = b[..., c0:c0 + _COLUMNS]
        total = None
        for start in range(0, k, 1 << chunk_bits):
            part = _chunk_product(limbs[..., start:start + (1 << chunk_bits)],
                                  cols[..., start:start + (1 << chunk_bits), :], rows, count,
                                  bits, m)
            total = part if total is None else (total + part) % m
        out[..., c0:c0 + _COLUMNS] = total
    return out


def _chunk_product(limbs, cols, rows: int, count: int, bits: int, m: int) -> np.ndarray:
    """Σ over one chunk of K, mod m: the narrow limbs (stacked along rows) times both wide limbs
    (side by side along columns), in one float64 matmul; then the limb products recombined."""
    n = cols.shape[-1]
    wide = np.concatenate([cols & ((1 << WIDE_BITS) - 1), cols >> WIDE_BITS], axis=-1)
    c = np.matmul(limbs, wide.astype(np.float64))
    parts = [c[..., i * rows:(i + 1) * rows, j * n:(j + 1) * n]
             for j in range(2) for i in range(count)]
    shifts = [bits * i + WIDE_BITS * j for j in range(2) for i in range(count)]
    return shifted_sum_mod(parts, shifts, m)


def shifted_sum_mod(parts, shifts, m: int) -> np.ndarray:
    """Σ parts[k]·2^shifts[k] mod m, for integer parts 0 <= parts[k] < 2^53 (float64 or int64)
    whose true sum T is below 2^61·m, with at most eight parts.

    T mod 2^64 is exact in wrapping uint64 arithmetic (a term shifted by 64 or more is 0 there).
    The float64 sum, each term exact (a power-of-two multiple), is within 7·2^-53·T of T, so its
    quotient by m is within 2^61·8·2^-53 = 2^11 of T/m: T − k·m, exact in int64 modulo 2^64, is
    below 2^11·m < 2^62 in magnitude, and a second quotient from its float64 value is within one
    of the truth, as in `mulmod`. In `exact_matmul` T is a chunk's Σ a_k·b_k < 2^10·m·m.
    """
    approx = exact = None
    for part, shift in zip(parts, shifts):
        term = np.array(part, np.float64)
        if shift:
            term *= float(1 << shift)
        approx = term if approx is None else np.add(approx, term, out=approx)
        if shift < 64:
            word = np.asarray(part).astype(np.int64).view(np.uint64)
            if shift:
                word <<= np.uint64(shift)
            exact = word if exact is None else np.add(exact, word, out=exact)
    approx *= 1.0 / m
    with np.errstate(over="ignore"):
        r = exact.view(np.int64) - approx.astype(np.int64) * m
        rough = r.astype(np.float64)
        rough *= 1.0 / m
        r -= np.floor(rough).astype(np.int64) * m
    return _into_range(r, m)


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


_REHASH = np.uint64(0xD6E8FEB86659FD93)


def uniform_below(h: np.ndarray, m: int) -> np.ndarray:
    """Elements of [0, m) exactly uniform if the 64-bit words `h` are: h mod m where h is below
    the largest multiple of m that fits (every residue then has as many preimages), and a rehash
    (splitmix64 of the word) of the rare word above it (probability < m/2^64 < 2^-13). A bare
    h mod m would favour small residues by up to m / 2^64 each, and the bound's uniformity is
    per element."""
    shape = np.shape(h)
    h = np.array(h, np.uint64, copy=True, ndmin=1)
    limit = np.uint64((1 << 64) // m * m)
    out = h >= limit
    while out.any():
        h[out] = mix64(h[out] ^ _REHASH)
        out = h >= limit
    return (h % np.uint64(m)).astype(np.int64).reshape(shape)


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
