"""The finite-field semantics: exact arithmetic at the field's extremes, random safe primes, the
laws it keeps (exp's homomorphism on exponent images, max/min semilattices, consistent
uninterpreted functions) and the ones it must not invent, ⊥ propagation, zero divisors, the bound,
and that every op has a finite-field meaning that tells it apart from other ops."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import BOp, KNode, KOp, TOp
from mugraph.ir.errors import VerificationError
from mugraph.ir.ops import BINARY, TERNARY, UNARY
from mugraph.verify import field_bound, finite_field as ff
from mugraph.verify.field import (Q_MIN, SUM_CHUNK, Field, Permutation, exact_matmul,
                                  field_for_draw, inverse_mod, is_bottom, join, mulmod, p_part,
                                  powmod, q_part, random_safe_prime, shifted_sum_mod, sum_mod,
                                  uniform_below)
from mugraph.verify.field_semantics import (FF_ELEMENTWISE, UNINTERPRETED, FiniteFieldSemantics,
                                            ZeroDivisorDrawn)
from mugraph.verify.finite_field import finite_field_test
from tests.ir.samples import block_sample, kernel_sample


def _is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (more bases than the code under test uses)."""
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


def _sem(seed: int = 0, exponents: bool = True) -> FiniteFieldSemantics:
    return FiniteFieldSemantics(field_for_draw(np.random.default_rng(seed)), key=1234 + seed,
                                exponents=exponents)


def _random(sem, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return join(rng.integers(0, sem.field.p, shape), rng.integers(0, sem.field.q, shape))


def _op(sem, op, *args, arg=None):
    return sem.elementwise(op, list(args), arg, None)


# ---- primes and fields ---------------------------------------------------------------------------
def test_each_draw_is_a_random_safe_prime_in_range():
    rng = np.random.default_rng(0)
    primes = [random_safe_prime(rng) for _ in range(12)]
    assert len(set(primes)) == len(primes)
    for p, q in primes:
        assert _is_prime(p) and _is_prime(q) and p == 2 * q + 1
        assert Q_MIN <= q < 2 * Q_MIN and p < 2 ** 51


def test_field_rejects_a_generator_of_the_wrong_order():
    p, q = random_safe_prime(np.random.default_rng(1))
    with pytest.raises(ir.InvalidInput):
        Field(p, q, p - 1)  # -1 has order 2, not q


def test_draws_differ_per_test_and_repeat_per_seed():
    assert ff.make_draw(0, 0, 0).field != ff.make_draw(0, 1, 0).field
    assert ff.make_draw(0, 0, 0).field != ff.make_draw(0, 0, 1).field
    assert ff.make_draw(5, 2, 0) == ff.make_draw(5, 2, 0)


# ---- exactness -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2047, 2048, 2049, 8192 + 5])
def test_matmul_is_exact_at_the_largest_residues_across_chunks(k):
    p, _ = random_safe_prime(np.random.default_rng(2))
    a = np.full((2, 1, 3, k), p - 1, np.int64)    # a batch dim broadcast against b
    b = np.full((k, 2), p - 2, np.int64)
    got = exact_matmul(a, b, p)
    assert got.shape == (2, 1, 3, 2) and (got == k * (p - 1) * (p - 2) % p).all()


@pytest.mark.parametrize("shapes", [((3, 300), (300, 50)), ((40, 300), (300, 2)),
                                    ((2, 5, 70), (70, 4))])
def test_matmul_matches_big_int_arithmetic_whichever_operand_is_split(shapes):
    p, _ = random_safe_prime(np.random.default_rng(3))
    rng = np.random.default_rng(0)
    a, b = rng.integers(p - 2 ** 20, p, shapes[0]), rng.integers(0, p, shapes[1])
    exact = (a.astype(object) @ b.astype(object)) % p
    assert (exact_matmul(a, b, p) == exact.astype(np.int64)).all()


def _edge_residues(m: int, rng) -> np.ndarray:
    """The residues where float64 quotient estimates are tightest, and random ones."""
    edges = [0, 1, 2, m - 1, m - 2, m // 2, m // 2 + 1, (1 << 50) - 1, (1 << 26) - 1, 1 << 26]
    return np.array([e % m for e in edges] + list(rng.integers(0, m, 200)), np.int64)


def test_modular_products_powers_and_inverses_match_big_ints():
    rng = np.random.default_rng(11)
    for _ in range(3):
        p, q = random_safe_prime(rng)
        for m in (p, q):
            a = _edge_residues(m, rng)
            b = a[rng.permutation(len(a))]
            assert mulmod(a, b, m).tolist() == [int(x) * int(y) % m for x, y in zip(a, b)]
            assert powmod(a[:20], m - 3, m).tolist() == [pow(int(x), m - 3, m) for x in a[:20]]
            for n in (5, 63, 64, 65, len(a)):               # Fermat, and the batch tree
                inv = inverse_mod(a[:n], m)
                assert inv.tolist() == [pow(int(x), -1, m) if x else 0 for x in a[:n]]


def test_shifted_sums_of_limb_products_are_exact():
    # one matmul chunk of K = 1024: 17-bit limbs of a times 26-bit limbs of w, summed over K
    rng = np.random.default_rng(12)
    p, _ = random_safe_prime(rng)
    for a, w in ((np.full(1024, p - 1), np.full(1024, p - 1)),
                 (rng.integers(0, p, 1024), rng.integers(p - 2 ** 30, p, 1024))):
        limbs = [(a >> (17 * i)) & (2 ** 17 - 1) for i in range(3)]
        wide = [w & (2 ** 26 - 1), w >> 26]
        parts = [np.array([float(np.dot(li.astype(np.float64), wj.astype(np.float64)))])
                 for wj in wide for li in limbs]
        shifts = [17 * i + 26 * j for j in range(2) for i in range(3)]
        expected = sum(int(x) * int(y) for x, y in zip(a, w)) % p
        assert shifted_sum_mod(parts, shifts, p).tolist() == [expected]


def test_long_sums_reduce_between_chunks():
    p, _ = random_safe_prime(np.random.default_rng(13))
    x = np.full((2, 3 * SUM_CHUNK + 7), p - 1, np.int64)
    assert (sum_mod(x, 1, p) == x.shape[1] * (p - 1) % p).all()


def test_hashes_map_exactly_uniformly_onto_the_field():
    p, _ = random_safe_prime(np.random.default_rng(14))
    top = np.array([2 ** 64 - 1, 2 ** 64 - 2, 0, p, 2 ** 63], np.uint64)   # the first two rehash
    v = uniform_below(top, p)
    assert ((0 <= v) & (v < p)).all() and v[2] == 0 and v[3] == 0
    assert uniform_below(np.uint64(5), p).shape == ()


def test_sums_and_products_are_exact_at_the_largest_residues():
    sem = _sem()
    p, q = sem.field.p, sem.field.q
    x = join(np.full((4, 8192), p - 1), np.full((4, 8192), q - 1))
    total = sem.reduce_sum(x, 1, None)
    assert (p_part(total) == 8192 * (p - 1) % p).all() and (q_part(total) == 8192 * (q - 1) % q).all()
    square = _op(sem, TOp.MUL, x, x)
    assert (p_part(square) == (p - 1) ** 2 % p).all() and (q_part(square) == (q - 1) ** 2 % q).all()


@pytest.mark.parametrize("value", [0.5, -3.25, 1e-6, 4096.0, 0.125, 1 / 3, -0.0])
def test_constants_map_their_exact_dyadic_value(value):
    field = field_for_draw(np.random.default_rng(4))
    frac = Fraction(value)
    rp, rq = field.residues(value)
    assert rp * frac.denominator % field.p == frac.numerator % field.p
    assert rq * frac.denominator % field.q == frac.numerator % field.q


# ---- exp and exponent images ---------------------------------------------------------------------
def test_exp_is_a_homomorphism_on_exponent_images():
    sem = _sem(1)
    a, b = _random(sem, (64,), 1), _random(sem, (64,), 2)
    exp = lambda v: _op(sem, TOp.EXP, v)
    assert (exp(_op(sem, TOp.ADD, a, b)) == _op(sem, TOp.MUL, exp(a), exp(b))).all()
    assert (p_part(_op(sem, TOp.MUL, exp(a), exp(_op(sem, TOp.NEG, a)))) == 1).all()
    assert (p_part(exp(sem.zeros((3,)))) == 1).all()
    assert all(pow(int(v), sem.field.q, sem.field.p) == 1 for v in p_part(exp(a)))


def test_an_exp_has_no_exponent_image_and_bottom_absorbs():
    sem = _sem(2)
    a, b = _random(sem, (8, 16), 3), _random(sem, (16, 4), 4)
    e = _op(sem, TOp.EXP, a)
    assert is_bottom(e).all() and (q_part(e) == -1).all()
    assert is_bottom(_op(sem, TOp.ADD, e, a)).all() and not is_bottom(_op(sem, TOp.ADD, a, a)).any()
    mixed = a.copy()
    mixed[2, 5] = e[2, 5]                    # one element of row 2 depends on an exp
    out = sem.matmul(mixed, b, None)
    assert is_bottom(out[2]).all() and not is_bottom(np.delete(out, 2, axis=0)).any()
    assert is_bottom(sem.reduce_sum(mixed, 1, None)[:, 0]).tolist() == [r == 2 for r in range(8)]


def test_an_exp_of_an_exp_sees_its_argument():
    sem = _sem(3)
    x = _random(sem, (200,), 5)
    once = _op(sem, TOp.EXP, x)
    twice = _op(sem, TOp.EXP, once)
    other = _op(sem, TOp.EXP, _op(sem, TOp.EXP, _op(sem, TOp.ADD, x, x)))
    assert len(np.unique(p_part(twice))) > 190          # not a constant, as the old image 1 made it
    assert (p_part(twice) != p_part(other)).mean() > 0.99
    again = _op(sem, TOp.EXP, _op(sem, TOp.ADD, once, sem.constant(1.0, (1,), None)))
    assert (p_part(again) != p_part(twice)).mean() > 0.99


def test_a_zero_divisor_is_a_bad_draw_and_a_zero_image_is_bottom():
    sem = _sem()
    with pytest.raises(ZeroDivisorDrawn):
        _op(sem, TOp.DIV, join(3, 3), join(0, 5))
    out = _op(sem, TOp.DIV, join(3, 3), join(5, 0))
    assert is_bottom(out) and p_part(out) == 3 * pow(5, -1, sem.field.p) % sem.field.p


def test_division_inverts_multiplication():
    sem = _sem(2)
    a, b = _random(sem, (50,), 3), _random(sem, (50,), 4)
    assert (_op(sem, TOp.MUL, _op(sem, TOp.DIV, a, b), b) == a).all()
    assert (p_part(_op(sem, TOp.DIV, b, b)) == 1).all()


# ---- max and min ---------------------------------------------------------------------------------
def test_max_and_min_are_semilattices_that_select_neither_operand():
    sem = _sem(3)
    a, b, c = (_random(sem, (300,), s) for s in (5, 6, 7))
    mx = lambda u, v: _op(sem, TOp.MAX, u, v)
    assert (mx(a, b) == mx(b, a)).all() and (p_part(mx(a, a)) == p_part(a)).all()
    assert (mx(mx(a, b), c) == mx(a, mx(b, c))).all()
    assert (p_part(mx(sem.max_identity((300,)), a)) == p_part(a)).all()
    assert (p_part(mx(a, b)) != p_part(a)).mean() > 0.99 and (p_part(mx(a, b)) != p_part(b)).mean() > 0.99
    assert (mx(a, b) != _op(sem, TOp.MIN, a, b)).mean() > 0.99
    assert (p_part(_op(sem, TOp.RELU, a)) == p_part(mx(a, sem.constant(0.0, (1,), None)))).all()


def test_any_tiling_of_a_max_reduction_gives_the_same_value():
    sem = _sem(4)
    x = _random(sem, (3, 64), 8)
    whole = sem.reduce_max(x, 1, None)
    running = sem.max_identity((3, 1))
    for start in (48, 0, 32, 16):
        running = _op(sem, TOp.MAX, running, sem.reduce_max(x[:, start:start + 16], 1, None))
    assert (running == whole).all()
    assert (sem.reduce_max(x[:, 1:], 1, None) != whole).all()   # one element less: another value


def test_the_permutation_is_a_bijection_with_its_inverse():
    p, _ = random_safe_prime(np.random.default_rng(5))
    perm = Permutation(99, p)
    x = np.concatenate([np.arange(5000), np.arange(p - 5000, p)])
    y = perm(x)
    assert (y >= 0).all() and (y < p).all() and len(np.unique(y)) == len(x)
    assert (perm.inverse(y) == x).all()
    assert abs(np.mean(y) / p - 0.5) < 0.05    # not the identity or an affine map of it


# ---- uninterpreted functions ---------------------------------------------------------------------
def test_uninterpreted_functions_are_consistent_keyed_and_elementwise():
    field = field_for_draw(np.random.default_rng(6))
    a = _random(_sem(6), (100,), 9)
    same = [FiniteFieldSemantics(field, key=7) for _ in range(2)]
    other = FiniteFieldSemantics(field, key=8)
    silu = lambda sem, v: _op(sem, TOp.SILU, v)
    assert (silu(same[0], a) == silu(same[1], a)).all()
    assert (silu(same[0], a) != silu(other, a)).mean() > 0.99
    assert (silu(same[0], a) != _op(same[0], TOp.GELU, a)).mean() > 0.99
    assert (silu(same[0], a[:10]) == silu(same[0], a)[:10]).all()


def test_integer_and_half_powers_keep_their_identities():
    sem = _sem(5)
    x = _random(sem, (40,), 10)
    power = lambda e: _op(sem, TOp.POW, x, sem.constant(e, (1,), None))
    assert (power(3.0) == _op(sem, TOp.MUL, _op(sem, TOp.MUL, x, x), x)).all()
    assert (power(-1.0) == _op(sem, TOp.DIV, sem.constant(1.0, (1,), None), x)).all()
    assert (power(0.5) == _op(sem, TOp.SQRT, x)).all()
    assert (power(-0.5) == _op(sem, TOp.RSQRT, x)).all()
    assert (power(1.5) != power(2.5)).all()


def test_a_computed_integer_exponent_is_still_an_exact_power():
    x = ir.input("X", (4, 8), "float32")
    two = ir.constant(1.0, (1, 1)) + ir.constant(1.0, (1, 1))
    assert finite_field_test(ir.KernelGraph([x * x]), ir.KernelGraph([x ** two]), seed=0).passed


# ---- every op: a meaning, a bound rule, and one that tells it from other ops ----------------------
def test_every_op_has_a_field_meaning_and_a_bound_rule():
    assert set(FF_ELEMENTWISE) == set(TOp)
    assert set(UNINTERPRETED) <= set(TOp)
    assert set(KOp) - set(field_bound.STRUCTURAL) == {KOp.INPUT, KOp.CUSTOM}
    assert set(BOp) - set(field_bound.STRUCTURAL) - set(field_bound.ACCUMULATOR) == {BOp.INPUT}


def _swapped(graph, op):
    """The sample with its last op replaced by another op of the same arity (a ternary select
    with its branches exchanged; a clamp with another range)."""
    node = graph.outputs[0]
    if op is TOp.CLAMP:
        return ir.KernelGraph([node.srcs[0].clamp(-1.0, 2.0)])
    if op in TERNARY:
        c, a, b = node.srcs
        return ir.KernelGraph([KNode(op, (c, b, a), node.arg)])
    group = UNARY if op in UNARY else BINARY
    other = min(group - {op, TOp.CLAMP, TOp.CAST}, key=lambda o: o.value)
    return ir.KernelGraph([KNode(other, node.srcs, None)])


@pytest.mark.parametrize("op", sorted(TOp, key=lambda o: o.value), ids=str)
def test_every_elementwise_op_is_told_apart_from_another_op(op):
    graph = kernel_sample(op)
    other = _swapped(graph, op)
    result = finite_field_test(graph, other, seed=0)
    assert not result.passed, f"{op.value} cannot be told from {other.outputs[0].op.value}"


@pytest.mark.parametrize("op", list(KOp), ids=str)
def test_every_kernel_op_runs_in_the_field_and_a_shift_is_seen(op):
    graph = kernel_sample(op)
    shifted = ir.KernelGraph([graph.outputs[0] + 0.5], graph.inputs)
    assert not finite_field_test(graph, shifted, tests=1, seed=0).passed


@pytest.mark.parametrize("op", list(BOp), ids=str)
def test_every_block_op_runs_in_the_field_and_a_shift_is_seen(op):
    graph = block_sample(op)
    shifted = ir.KernelGraph([graph.outputs[0] + 0.5], graph.inputs)
    assert not finite_field_test(graph, shifted, tests=1, seed=0).passed


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
    assert np.array_equal(first["X"], ff.draw_inputs(graph, ff.make_draw(0, 0, 0))["X"])


def test_default_tests_meet_the_target_bound():
    x, y = _xy()
    result = finite_field_test(ir.KernelGraph([x * y]), ir.KernelGraph([y * x]), seed=3)
    assert result.passed and result.established and result.error_bound <= 2.0 ** -40
    assert result.tests == field_bound.tests_needed(
        field_bound.pair_bound(ir.KernelGraph([x * y]), ir.KernelGraph([y * x])), 2.0 ** -40, 24)


def test_a_bound_that_cannot_reach_the_target_is_not_established():
    x, _ = _xy((1, 8))
    spec = ir.KernelGraph([x ** 3e13])              # degree 3e13: one test bounds 3e13/2^49
    result = finite_field_test(spec, spec, seed=0, max_tests=3)
    assert result.passed and not result.established and result.error_bound > 2.0 ** -40
    assert "not established" in str(result)


def test_a_degree_beyond_the_field_gives_bound_one():
    x, _ = _xy((1, 8))
    spec = ir.KernelGraph([x ** float(2 ** 51)])     # d >= q: no test bounds anything
    result = finite_field_test(spec, spec, seed=0, tests=2)
    assert result.passed and result.error_bound == 1.0 and not result.established
    assert finite_field_test(spec, spec, seed=0).tests == 3   # more tests would not help


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
    result = finite_field_test(spec, ir.KernelGraph([o], [s, v]), seed=2)
    assert result.passed and result.established


def test_an_identically_zero_divisor_exhausts_the_redraws():
    x, _ = _xy()
    graph = ir.KernelGraph([x / (x - x)])
    with pytest.raises(VerificationError, match="zero divisor"):
        finite_field_test(graph, graph, tests=1, seed=0, max_redraws=2)


def test_degrees_share_a_denominator_that_does_not_vary_along_the_sum():
    x, y = _xy()
    assert ff.output_degrees(ir.KernelGraph([x * y + x])) == [(2, 0)]
    assert ff.output_degrees(ir.KernelGraph([x / y])) == [(1, 1)]
    assert ff.output_degrees(ir.KernelGraph([(x / y).sum(1)])) == [(1 + 7, 8)]     # y varies
    assert ff.output_degrees(ir.KernelGraph([(x / y.sum(1)).sum(1)])) == [(1, 1)]  # it does not
    w = ir.input("W", (8, 5), "float32")
    assert ff.output_degrees(ir.KernelGraph([x.rms_norm(1) @ w])) == [(2, 1)]
    assert ff.output_degrees(ir.KernelGraph([(x / y) @ w])) == [(2 + 7, 8)]
    assert ff.output_degrees(ir.KernelGraph([x ** -3.0])) == [(1, 3)]   # exact, or an oracle
    assert ff.output_degrees(ir.KernelGraph([x.exp() * x])) == [(2, 0)]


def test_collisions_are_counted_in_one_output_elements_cone():
    s, v = ir.input("S", (4, 64), "float32"), ir.input("V", (64, 8), "float32")
    e = (s - s.amax(1)).exp()
    bound = field_bound.pair_bound(ir.KernelGraph([(e @ v) / e.sum(1)]),
                                   ir.KernelGraph([(e @ v) / e.sum(1)]))
    pools = {pool: n for pool, n, _ in bound.collisions}
    assert pools["exp"] == 2 * 64             # one row's exps, in each of the two programs
    assert pools["max"] == 2 * (64 + 1)       # Φ of one row, and the digest
    assert bound.terms()["exp collisions"] == pytest.approx(
        (128 * 127 / 2) * bound.collisions[0][2] / Q_MIN)


def test_error_bound_is_the_product_of_the_per_test_bounds():
    x, y = _xy()
    spec, cand = ir.KernelGraph([(x / y).sum(1)]), ir.KernelGraph([(x / y).sum(1)])
    result = finite_field_test(spec, cand, seed=4, tests=3)
    bound = field_bound.pair_bound(spec, cand)
    assert result.error_bound == pytest.approx(np.prod([bound.per_test(p, q)
                                                        for p, q in result.primes]))


def test_a_test_count_below_one_is_refused():
    x, y = _xy()
    with pytest.raises(ir.InvalidInput):
        finite_field_test(ir.KernelGraph([x]), ir.KernelGraph([x]), tests=0)


@pytest.mark.parametrize("k", [64, 65, 1024, 1025, 2049])
def test_matmul_is_exact_where_limb_products_are_largest(k):
    # residues whose limbs are all ones maximise every partial sum of every chunk: rows of the
    # narrow operand with 17- or 21-bit limbs all ones below the top, the wide operand's two
    # 26-bit limbs
    p, _ = random_safe_prime(np.random.default_rng(9))
    ones = [((p - 1) >> b << b) | ((1 << b) - 1) for b in (34, 42)]
    wide = (((p - 1) >> 26) << 26) - 1
    a = np.array([[v] * k for v in ones + [p - 1]], np.int64)   # fewer elements: narrow
    b = np.full((k, 4), wide, np.int64)
    rng = np.random.default_rng(k)
    b[rng.integers(0, k, 5), 0] = rng.integers(0, p, 5)
    exact = (a.astype(object) @ b.astype(object)) % p
    assert (exact_matmul(a, b, p) == exact.astype(np.int64)).all()
    assert (exact_matmul(b.T.copy(), a.T.copy(), p) == exact.T.astype(np.int64)).all()
