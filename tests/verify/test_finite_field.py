"""The finite-field semantics: exact arithmetic at the field's extremes, the laws it must keep
(exp homomorphism, total order for max, consistent opaque functions), zero-divisor redraws, the
error bound, and that every op has a finite-field meaning."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import BOp, KOp, TOp
from mugraph.ir.errors import VerificationError
from mugraph.verify import finite_field as ff
from mugraph.verify.finite_field import (FF_ELEMENTWISE, PRIME_PAIRS, SENTINEL, Field,
                                         FiniteFieldSemantics, degree_bound, error_bound,
                                         exact_matmul, finite_field_test, pack, unpack)
from tests.ir.samples import block_sample, kernel_sample

P, Q = PRIME_PAIRS[0]


def _is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (these bases suffice)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n in bases:
        return True
    if any(n % b == 0 for b in bases):
        return False
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
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


def _sem(seed: int = 0) -> FiniteFieldSemantics:
    rng = np.random.default_rng(seed)
    return FiniteFieldSemantics(ff.field_for_draw(rng, seed), key=1234 + seed)


def _random(sem, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return pack(rng.integers(0, sem.field.p, shape), rng.integers(0, sem.field.q, shape))


def _pairs(v) -> list:
    p, q = unpack(v)
    return list(zip(p.ravel().tolist(), q.ravel().tolist()))


# ---- the primes ----------------------------------------------------------------------------------
def test_prime_pairs_are_safe_primes_below_2_31():
    assert len(set(PRIME_PAIRS)) == len(PRIME_PAIRS) >= 8
    for p, q in PRIME_PAIRS:
        assert _is_prime(p) and _is_prime(q), (p, q)
        assert p == 2 * q + 1 and p < 2 ** 31 and q > 2 ** 29


def test_field_rejects_a_generator_of_the_wrong_order():
    with pytest.raises(ir.InvalidInput):
        Field(P, Q, P - 1)  # -1 has order 2, not q


# ---- exactness at the extremes -------------------------------------------------------------------
@pytest.mark.parametrize("m", [P, Q])
def test_matmul_is_exact_at_the_largest_residues(m):
    k = 8192
    a = np.full((3, k), m - 1, np.int64)
    b = np.full((k, 2), m - 1, np.int64)
    expected = k * (m - 1) * (m - 1) % m  # Python big ints
    assert (exact_matmul(a, b, m) == expected).all()


def test_matmul_matches_big_int_arithmetic_on_random_residues():
    rng = np.random.default_rng(0)
    a = rng.integers(P - 2 ** 20, P, (2, 5, 300))
    b = rng.integers(P - 2 ** 20, P, (300, 4))
    exact = (a.astype(object) @ b.astype(object)) % P
    assert (exact_matmul(a, b, P) == exact.astype(np.int64)).all()


@pytest.mark.parametrize("k", [1, 63, 64, 65, 8192 + 5])
def test_matmul_is_exact_across_chunk_boundaries(k):
    a = np.full((2, 1, k), P - 1, np.int64)   # a batch dim broadcast against b
    b = np.full((k, 3), P - 2, np.int64)
    assert (exact_matmul(a, b, P) == k * (P - 1) * (P - 2) % P).all()
    assert exact_matmul(a, b, P).shape == (2, 1, 3)


def test_sums_and_products_are_exact_at_the_largest_residues():
    sem = _sem()
    p, q = sem.field.p, sem.field.q
    x = pack(np.full((4, 8192), p - 1), np.full((4, 8192), q - 1))
    assert _pairs(sem.reduce_sum(x, 1, None))[0] == (8192 * (p - 1) % p, 8192 * (q - 1) % q)
    sq = sem.elementwise(TOp.MUL, [x, x], None, None)
    assert _pairs(sq)[0] == ((p - 1) ** 2 % p, (q - 1) ** 2 % q)
    assert _pairs(sem.elementwise(TOp.ADD, [x, x], None, None))[0] == (p - 2, q - 2)


@pytest.mark.parametrize("value", [0.5, -3.25, 1e-6, 4096.0, 0.125, 1 / 3, -0.0])
def test_constants_map_their_exact_dyadic_value(value):
    field = Field(P, Q, 4)
    frac = Fraction(value)
    got = unpack(np.int64(field.image(value)))
    assert int(got[0]) * frac.denominator % P == frac.numerator % P
    assert int(got[1]) * frac.denominator % Q == frac.numerator % Q


# ---- laws ----------------------------------------------------------------------------------------
def test_exp_is_a_homomorphism_into_the_order_q_subgroup():
    sem = _sem(1)
    a, b = _random(sem, (64,), 1), _random(sem, (64,), 2)
    exp = lambda v: sem.elementwise(TOp.EXP, [v], None, None)
    mul = lambda u, v: sem.elementwise(TOp.MUL, [u, v], None, None)
    add = lambda u, v: sem.elementwise(TOp.ADD, [u, v], None, None)
    neg = lambda v: sem.elementwise(TOp.NEG, [v], None, None)
    assert (exp(add(a, b)) == mul(exp(a), exp(b))).all()
    assert (mul(exp(a), exp(neg(a))) == pack(1, 1)).all()
    assert (exp(sem.zeros((3,))) == pack(1, 1)).all()
    assert all(pow(ep, sem.field.q, sem.field.p) == 1 for ep, _ in _pairs(exp(a)))


def test_division_inverts_multiplication_and_x_over_x_is_one():
    sem = _sem(2)
    a, b = _random(sem, (50,), 3), _random(sem, (50,), 4)
    div = lambda u, v: sem.elementwise(TOp.DIV, [u, v], None, None)
    mul = lambda u, v: sem.elementwise(TOp.MUL, [u, v], None, None)
    assert (mul(div(a, b), b) == a).all()
    assert (div(b, b) == pack(1, 1)).all()


def test_a_zero_divisor_is_detected_not_mapped_to_a_value():
    sem = _sem()
    with pytest.raises(ff.ZeroDivisorDrawn):
        sem.elementwise(TOp.DIV, [pack(3, 3), pack(0, 5)], None, None)


def test_a_zero_q_component_divides_as_a_meadow():
    # exp(a) - exp(b) is 0 mod q for every a, b: the q-component must not block such forms
    sem = _sem()
    out = sem.elementwise(TOp.DIV, [pack(3, 3), pack(5, 0)], None, None)
    assert int(unpack(out)[1]) == 0


def test_max_is_a_total_order_with_the_sentinel_below_everything():
    sem = _sem(3)
    a, b, c = (_random(sem, (200,), s) for s in (5, 6, 7))
    mx = lambda u, v: sem.elementwise(TOp.MAX, [u, v], None, None)
    mn = lambda u, v: sem.elementwise(TOp.MIN, [u, v], None, None)
    assert (mx(a, b) == mx(b, a)).all() and (mx(a, a) == a).all()
    assert (mx(mx(a, b), c) == mx(a, mx(b, c))).all()
    assert (mx(sem.max_identity((200,)), a) == a).all()
    assert ((mx(a, b) == a) ^ (mn(a, b) == a) | (a == b)).all()
    # max(x, 0) is informative: where 0 falls in the keyed order varies with the test's key
    zero = np.zeros((), np.int64)
    kept = [(_sem(s).elementwise(TOp.MAX, [a, zero], None, None) == a).mean() for s in range(20)]
    assert all(0 < k < 1 for k in kept) and 0.3 < np.mean(kept) < 0.7


def test_any_tiling_of_a_max_reduction_gives_the_same_element():
    sem = _sem(4)
    x = _random(sem, (3, 64), 8)
    whole = sem.reduce_max(x, 1, None)
    tiles = [sem.reduce_max(x[:, i:i + 16], 1, None) for i in range(0, 64, 16)]
    running = sem.max_identity((3, 1))
    for t in tiles[::-1]:
        running = sem.elementwise(TOp.MAX, [running, t], None, None)
    assert (running == whole).all()


def test_opaque_functions_are_consistent_and_keyed():
    a = _random(_sem(), (100,), 9)
    same = [FiniteFieldSemantics(Field(P, Q, 4), key=7) for _ in range(2)]
    other = FiniteFieldSemantics(Field(P, Q, 4), key=8)
    silu = lambda sem, v: sem.elementwise(TOp.SILU, [v], None, None)
    assert (silu(same[0], a) == silu(same[1], a)).all()
    assert (silu(same[0], a) != silu(other, a)).mean() > 0.99
    assert (silu(same[0], a) != same[0].elementwise(TOp.GELU, [a], None, None)).mean() > 0.99
    assert (silu(same[0], a[:10]) == silu(same[0], a)[:10]).all()  # elementwise, not positional


def test_integer_and_half_powers_keep_their_identities():
    sem = _sem(5)
    x = _random(sem, (40,), 10)
    power = lambda e: sem.elementwise(TOp.POW, [x, sem.constant(e, (1,), None)], None, None)
    mul = lambda u, v: sem.elementwise(TOp.MUL, [u, v], None, None)
    assert (power(3.0) == mul(mul(x, x), x)).all()
    assert (power(-1.0) == sem.elementwise(TOp.DIV, [sem.constant(1.0, (1,), None), x],
                                           None, None)).all()
    assert (power(0.5) == sem.elementwise(TOp.SQRT, [x], None, None)).all()
    assert (power(-0.5) == sem.elementwise(TOp.RSQRT, [x], None, None)).all()
    assert (power(1.5) != power(2.5)).all()


def test_a_computed_integer_exponent_is_still_an_exact_power():
    x = ir.input("X", (4, 8), "float32")
    two = ir.constant(1.0, (1, 1)) + ir.constant(1.0, (1, 1))
    assert finite_field_test(ir.KernelGraph([x * x]), ir.KernelGraph([x ** two]), seed=0).passed


def test_relu_and_clamp_follow_max_and_min():
    sem = _sem(6)
    x = _random(sem, (40,), 11)
    zero = sem.constant(0.0, (1,), None)
    assert (sem.elementwise(TOp.RELU, [x], None, None) ==
            sem.elementwise(TOp.MAX, [x, zero], None, None)).all()
    lo, hi = sem.constant(-1.0, (1,), None), sem.constant(2.0, (1,), None)
    clamp = sem.elementwise(TOp.MIN, [sem.elementwise(TOp.MAX, [x, lo], None, None), hi],
                            None, None)
    assert (sem.elementwise(TOp.CLAMP, [x], (-1.0, 2.0), None) == clamp).all()


# ---- every op has a finite-field meaning ---------------------------------------------------------
def test_every_elementwise_op_has_a_field_meaning_and_a_degree():
    assert set(FF_ELEMENTWISE) == set(TOp)
    assert set(ff.DEGREE_ELEMENTWISE) == set(TOp)


def test_every_structural_op_has_a_degree_rule():
    assert set(KOp) - set(ff.KERNEL_DEGREE) == {KOp.INPUT, KOp.CUSTOM}
    assert set(BOp) - set(ff.BLOCK_DEGREE) - set(ff.ACC_DEGREE) == {BOp.INPUT}


@pytest.mark.parametrize("op", list(KOp) + list(TOp), ids=str)
def test_every_kernel_op_runs_in_the_field(op):
    graph = kernel_sample(op)
    assert finite_field_test(graph, graph, tests=1, seed=0).passed


@pytest.mark.parametrize("op", list(BOp) + list(TOp), ids=str)
def test_every_block_op_runs_in_the_field(op):
    graph = block_sample(op)
    assert finite_field_test(graph, graph, tests=1, seed=0).passed


# ---- tests, draws and the bound ------------------------------------------------------------------
def _xy(shape=(4, 8)):
    return ir.input("X", shape, "float32"), ir.input("Y", shape, "float32")


def test_inputs_are_fresh_per_tensor_and_per_test():
    x, y = _xy()
    graph = ir.KernelGraph([x + y])
    d0, d1 = ff.make_draw(0, 0, 0), ff.make_draw(0, 1, 0)
    first = ff.draw_inputs(graph, d0)
    assert not np.array_equal(first["X"], first["Y"])
    assert not np.array_equal(first["X"], ff.draw_inputs(graph, d1)["X"])
    assert d0.field.p != d1.field.p
    assert np.array_equal(first["X"], ff.draw_inputs(graph, ff.make_draw(0, 0, 0))["X"])


def test_default_tests_use_distinct_primes_and_meet_the_target_bound():
    x, y = _xy()
    result = finite_field_test(ir.KernelGraph([x * y]), ir.KernelGraph([y * x]), seed=3)
    assert result.passed and result.tests >= 3
    assert len({p for p, _ in result.primes}) == result.tests
    assert result.error_bound <= 2.0 ** -40 and result.log2_bound <= -40


def test_a_wrong_identity_is_caught_with_its_location():
    x, y = _xy()
    spec = ir.KernelGraph([(x + y) * (x + y)])
    result = finite_field_test(spec, ir.KernelGraph([x * x + y * y]), seed=0)
    assert not result.passed and "output 0 differs at (0, 0)" in result.failure


def test_a_tiled_block_matmul_equals_the_kernel_matmul():
    x, w = ir.input("X", (8, 64), "float16"), ir.input("W", (64, 32), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    tx, tw = b.input(x, imap=None, fmap=1), b.input(w, imap=(1,), fmap=0)
    (out,) = b.finish([((tx @ tw).acc_sum(), (1,))])
    assert finite_field_test(ir.KernelGraph([x @ w]), ir.KernelGraph([out], [x, w]), seed=1).passed


def test_online_softmax_rescaling_verifies_exactly():
    s, v = ir.input("S", (4, 64), "float32"), ir.input("V", (64, 8), "float32")
    e = (s - s.amax(1)).exp()
    spec = ir.KernelGraph([(e @ v) / e.sum(1)])
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    ts, tv = b.input(s, fmap=1), b.input(v, fmap=0)
    m = ts.acc_max_last()
    et = (ts - m).exp()
    out = (et @ tv).acc_sum_rescale(m) / et.acc_sum_last_rescale(m)
    (o,) = b.finish([(out, (None,))])
    assert finite_field_test(spec, ir.KernelGraph([o], [s, v]), seed=2).passed


def test_an_identically_zero_divisor_exhausts_the_redraws():
    x, _ = _xy()
    graph = ir.KernelGraph([x / (x - x)])
    with pytest.raises(VerificationError, match="zero divisor"):
        finite_field_test(graph, graph, tests=1, seed=0, max_redraws=2)


def test_degree_of_simple_graphs():
    x, y = _xy()
    assert ff.output_degrees(ir.KernelGraph([x * y + x])) == [(2, 0)]
    assert ff.output_degrees(ir.KernelGraph([x / y])) == [(1, 1)]
    assert ff.output_degrees(ir.KernelGraph([(x / y).sum(1)])) == [(1 + 7, 8)]
    assert ff.output_degrees(ir.KernelGraph([(x * y).exp() * x])) == [(2, 0)]
    assert degree_bound(ir.KernelGraph([x / y]), ir.KernelGraph([x * y])) == 3
    two = ir.constant(1.0, (1, 1)) + ir.constant(1.0, (1, 1))
    assert ff.output_degrees(ir.KernelGraph([(x * y) ** two])) == [(4, 0)]
    assert ff.output_degrees(ir.KernelGraph([x ** -3.0])) == [(0, 3)]
    assert ff.output_degrees(ir.KernelGraph([x ** 1.5])) == [(1, 0)]


def test_error_bound_and_tests_needed():
    q = min(q for _, q in PRIME_PAIRS)
    assert error_bound(10, [q, q]) == pytest.approx((10 / q) ** 2)
    assert error_bound(2 * q, [q]) == 1.0
    assert ff.tests_needed(3) == 3
    d = 2 ** 19  # per test about 2^-11: four tests for 2^-40
    assert ff.tests_needed(d) == 4
    assert ff.tests_needed(2 * q) == ff.MAX_TESTS


def test_a_test_count_below_one_is_refused():
    x, y = _xy()
    with pytest.raises(ir.InvalidInput):
        finite_field_test(ir.KernelGraph([x]), ir.KernelGraph([x]), tests=0)


def test_sentinel_is_not_a_field_element():
    assert int(unpack(np.int64(SENTINEL))[1]) >= max(q for _, q in PRIME_PAIRS)
