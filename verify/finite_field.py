"""Exact random testing: a finite-field semantics run by the reference interpreter (block graphs
with their real tiling), and a stated bound on the chance that a non-equivalent pair passes.

Design
------
A test draws a safe prime p = 2q + 1 (q a random prime in [2^49, 2^50): about 6e11 of them,
so 2^50 < p < 2^51), a generator g of the order-q subgroup G of Z_p*, a 128-bit key, and every
input element uniformly. A value is its residue in Z_p and, when either program has an exp, also
an *exponent image* in Z_q ∪ {⊥} (`field_semantics.py` holds the op table; `field_bound.py` the
bound):

* +, −, ×, ÷, matmul, sums, integer powers, constants (a float is the dyadic rational it
  stores): exact in Z_p and in Z_q. ⊥ absorbs; a zero Z_p divisor discards the draw (it is
  redrawn); a zero Z_q divisor gives ⊥.
* exp(v) = g^image(v), so exp(a + b) = exp(a)·exp(b), exp(−a) = 1/exp(a) and exp(0) = 1 hold
  exactly and safe / online softmax rescaling verifies. The image of an exp is ⊥: no function of
  the argument's image can be exp's image and keep the law (the old constant image 1 made every
  exp of an exp constant, so exp(exp(x)) passed for exp(exp(2x))). An exp of a value without an
  image (one that depends on an exp) is an uninterpreted function of the argument's residue:
  sound, but exp(e1 + e2) = exp(e1)·exp(e2) is not kept when e1 depends on an exp (a candidate
  relying on that is rejected: a false rejection, never a false acceptance).
* max / min: Φ⁻¹(Φ(a) + Φ(b)) with Φ a keyed pseudo-random permutation of Z_p, and a ∨ a = a; a
  reduction sums Φ over the reduced elements. Commutative and associative with an identity (the
  running max's start), so every tiling of a max reduction gives the spec's value; and a random
  function of the multiset reduced, so max(x, y) and x differ (the old keyed order selected an
  operand: relu(x) passed for x half the time). RELU = max(x, 0), CLAMP = min(max(x, lo), hi).
  A max's image is a keyed function of its residue (exp(s − max(s)) keeps its law).
* CAST to fp32 is exact (fp32 is the widest dtype). CAST to a 16-bit dtype is the program's own
  rounding where the spec holds the same value in that dtype (a cast of it, an input, a stored
  16-bit tensor; recorded by the spec's run, `field_semantics.Roundings`): exact, as the spec's
  own casts are (a kernel may skip them). Elsewhere it is a rounding the program does not make:
  an uninterpreted function ("round", dtype) of its operand, so cast(e·2^-18, f16)·2^18 ≠ e.
* every other op — sqrt, log, silu, gelu, sigmoid, tanh, erf, a non-integer pow, and any op in
  `field_semantics.UNINTERPRETED` — is an uninterpreted function: a keyed random function of
  (op, params, the operands' residues) with a fresh residue and image. RSQRT = 1/SQRT and
  POW ±1/2 = SQRT / RSQRT are real identities and are kept.
* Without an exp in either program images are never read; the test then runs on residues only.
Outputs are compared on their residues.

The arithmetic is exact (`field.py`): a product's quotient by p comes from float64 within one of
the truth (residues below 2^51 are exact in float64; three roundings err by under 0.76), and the
remainder is computed in int64 modulo 2^64 and corrected; a matmul splits its operands into limbs
whose products, summed over chunks of K, stay below 2^53, so float64 BLAS is exact in any order;
sums reduce every 2^12 terms; inverses are Fermat's, or Montgomery's batch trick on a tree.
Why fields this large: one output element of attention over 4096 keys reads 4096 exps in each
program, and the collision term (2) below is C(8192, 2)·D/q: about 2^-3 with q >= 2^29, which
took 14-25 tests to reach 2^-40, and about 2^-22 with q >= 2^49, so two tests reach it.

Why a pass means something (proof sketch)
-----------------------------------------
Atoms: the input elements and the value of every exp, max/min and uninterpreted application.
Every value is a rational function N/D of the atoms, and the table keeps only identities that
hold over the reals (field laws; exp's law on images; max/min commutative, associative, with an
identity, x ∨ x = x), so programs that differ as real functions differ as formal expressions in
the atoms. One test then passes a non-equivalent pair only through one of these events:
(1) Degree (Schwartz–Zippel). The two agree on an element iff N_s·D_c − N_c·D_s vanishes, a
    nonzero polynomial of degree d <= max(n_s + d_c, n_c + d_s) (`field_bound.py`'s symbolic
    pass runs the op table on degrees; a sum of n fractions is allowed n different
    denominators). Inputs, uninterpreted and max/min values are uniform on Z_p, exp values on
    G: P <= d/q (d/p without exp). Uniform exactly: inputs come from NumPy's unbiased bounded
    integers and hashed values by rejection (`field.uniform_below`); a bare h mod p would tilt
    each value by up to p/2^64, and SZ's guarantee is per variable, over thousands of them.
(2) Argument collisions. An uninterpreted function (or Φ) applied to two formally different
    arguments that happen to be equal gives both one value, which (1) does not see; likewise two
    exps whose exponent images collide. A pair of arguments differs by a nonzero rational
    function of degree <= D, so it collides with probability <= D/p (exps: D/q). A union over
    the pairs of applications in the cone of one output element, counted for both programs by a
    backward pass (a broadcast operand contributes one element, a reduction its whole dim, a
    block its tiles over every iteration), adds C(n, 2)·D/p + C(n_exp, 2)·D_exp/q.
(3) Zero divisors. Discarding draws with a zero Z_p divisor conditions on their absence: the
    bound is divided by 1 − z, z = (divisor elements)·(divisor degree)/p.
(4) Independent tests. Each test draws its own prime, generator, key and inputs; T tests give
    the product of the per-test bounds ε_t = min(1, ((1) + (2)) / (1 − (3))).
The printed bound is Π ε_t. It rests on three assumptions it does not price:
(A1) the keyed hashes (blake2b-derived keys, splitmix64 mixing, a 4-round Feistel network for
     Φ) behave as random functions and a random permutation;
(A2) exps whose exponents do not collide behave as independent uniform elements of G (for
     exponents linear with small coefficients this is Schwartz–Zippel over G; in general it is
     the conjecture Li & Wu's analysis of exponentiation gates rests on);
(A3) some coefficient of the difference polynomial is not divisible by p: p is drawn from about
     6e11 primes per test, so a coefficient of H bits is divisible by it with probability
     <= H / (50 · 6e11) (constants equal to a fixed prime could not fool the test).
Invisible by design (the float test's job): anything equal in exact arithmetic but not in
floating point — overflow, cancellation, the rounding of ordinary ops and storage, IEEE special
values (explicit casts are modelled, above). A constant folded in floating point (x·(1/3) vs
x/3) is a false rejection.

Registering an op
-----------------
An op with no algebraic law: add `TOp.X: k` (its operand count) to
`field_semantics.UNINTERPRETED`; it is then an uninterpreted function of its k operands and its
node.arg, in the run and in the bound. An op that is a real identity of others may instead be an
`FF_ELEMENTWISE` entry written with the semantics' primitives (add, sub, mul, neg, inverse,
power, exp, lattice, oracle, element); the bound's symbolic pass runs that same entry. A new
structural op needs an interpreter rule and a `field_bound.STRUCTURAL` rule.

Sampling
--------
`finite_field_test(..., sample_blocks=N)` compares N randomly chosen blocks of every output
(see `verify/sampling.py`) instead of every element: the bound then covers the sampled blocks
only, and the result says so.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from mugraph.ir.errors import InvalidInput, VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret
from mugraph.verify.field import (Field, exact_matmul, field_for_draw, join, mix64,
                                  single_threaded_blas)
from mugraph.verify.field_bound import (BLOCK_DEGREE, KERNEL_DEGREE, PairBound, degree_bound,
                                        output_degrees, pair_bound, tests_needed)
from mugraph.verify.field_semantics import (FF_ELEMENTWISE, UNINTERPRETED, FiniteFieldSemantics,
                                            NeedsExponents, ZeroDivisorDrawn)

__all__ = ["BLOCK_DEGREE", "FF_ELEMENTWISE", "KERNEL_DEGREE", "UNINTERPRETED", "Draw", "Field", "FiniteFieldResult",
           "FiniteFieldSemantics", "TARGET_BOUND", "ZeroDivisorDrawn", "clear_caches",
           "degree_bound", "draw_inputs", "evaluate", "exact_matmul", "finite_field_test",
           "make_draw", "mix64", "output_degrees", "pair_bound", "single_threaded_blas"]

TARGET_BOUND = 2.0 ** -40   # default bound on the chance that a non-equivalent pair passes
MAX_TESTS = 64              # the most tests run to reach the target before saying "not established"
MAX_REDRAWS = 6


# ---- draws ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Draw:
    """One random test: its field, its hash key and the seed of its inputs."""

    field: Field
    key: int
    seed: int
    test: int
    attempt: int

    def semantics(self, exponents: bool, roundings=None) -> FiniteFieldSemantics:
        """The test's semantics: the spec's run (recording its roundings), or with `roundings`
        (the spec's) a candidate's run."""
        return FiniteFieldSemantics(self.field, self.key, exponents, roundings)


@functools.lru_cache(maxsize=256)
def make_draw(seed: int, test: int, attempt: int) -> Draw:
    """Deterministic in (seed, test, attempt): a fresh random prime, generator, key and inputs."""
    key_ss, field_ss = (np.random.SeedSequence(seed, spawn_key=(test, attempt, part))
                        for part in (0, 1))
    field = field_for_draw(np.random.default_rng(field_ss))
    key = int.from_bytes(key_ss.generate_state(4, np.uint32).tobytes(), "little")  # 128 bits
    return Draw(field, key, seed, test, attempt)


def draw_inputs(graph: KernelGraph, draw: Draw, exponents: bool = True) -> dict[str, np.ndarray]:
    """Independent uniform elements for every input (one seed per input position)."""
    arrays = {}
    for i, node in enumerate(graph.inputs):
        rng = np.random.default_rng(np.random.SeedSequence(
            draw.seed, spawn_key=(draw.test, draw.attempt, 2, i)))
        residues = _uniform(rng, draw.field.p, node.shape)
        if exponents:
            residues = join(residues, _uniform(rng, draw.field.q, node.shape))
        arrays[node.arg[0]] = residues
    return arrays


def _uniform(rng: np.random.Generator, m: int, shape) -> np.ndarray:
    # NumPy's bounded uint64 draw is unbiased and twice as fast as its int64 one
    return rng.integers(0, m, shape, np.uint64).view(np.int64)


def evaluate(graph: KernelGraph, draw: Draw, inputs=None, exponents: bool = True,
             roundings=None) -> list:
    """`graph`'s outputs for one draw (raises ZeroDivisorDrawn, or NeedsExponents); with
    `roundings` (the spec's, `spec_run`), as a candidate: its casts are the program's roundings
    only where the spec rounds the same values."""
    return _run_graph(graph, draw, inputs, exponents, roundings)[0]


def _run_graph(graph, draw, inputs, exponents, roundings):
    """(outputs, the semantics that ran them: its record, or the new roundings it made)."""
    inputs = draw_inputs(graph, draw, exponents) if inputs is None else inputs
    sem = draw.semantics(exponents, roundings)
    with single_threaded_blas():
        return interpret(graph, inputs, semantics=sem), sem


@functools.lru_cache(maxsize=2)
def _inputs(spec: KernelGraph, seed: int, test: int, attempt: int, exponents: bool) -> dict:
    # few entries: full-shape inputs are large (a 4096² weight is 128 MiB of packed elements)
    return draw_inputs(spec, make_draw(seed, test, attempt), exponents)


@functools.lru_cache(maxsize=32)
def spec_run(spec: KernelGraph, seed: int, test: int, attempt: int, exponents: bool) -> tuple:
    """The spec's outputs for one draw and the roundings it makes (`Roundings`)."""
    # the search checks many candidates against one spec: its outputs are worth caching
    outputs, sem = _run_graph(spec, make_draw(seed, test, attempt),
                              _inputs(spec, seed, test, attempt, exponents), exponents, None)
    return outputs, sem.recorded


def clear_caches() -> None:
    """Forget cached spec inputs and outputs (frees memory; benchmarks time first calls)."""
    _inputs.cache_clear()
    spec_run.cache_clear()


# ---- the result ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FiniteFieldResult:
    """The outcome of the exact random tests and the bound they establish."""

    passed: bool
    tests: int                 # tests run (a failing run stops at the first failing test)
    primes: tuple              # (p, q) of every test run
    degree: int                # d in the Schwartz–Zippel term
    error_bound: float         # Π ε_t over the tests run: meaningful when passed (else 1)
    log2_bound: float
    seconds: float
    target: float = TARGET_BOUND
    per_test: float = 1.0      # the worst ε of one test (smallest q)
    terms: tuple = ()          # (name, value) parts of the worst per-test bound
    redraws: int = 0           # draws discarded because a divisor was zero
    failure: str | None = None
    exponents: bool = False    # the run tracked exponent images (some exp)
    sampled: str | None = None  # what a sampled run compared (None: every output element)

    @property
    def established(self) -> bool:
        """Passed, with a bound at or below the target."""
        return self.passed and self.error_bound <= self.target

    def __str__(self) -> str:
        if not self.passed:
            state = f"FAILED: {self.failure}"
        elif self.established:
            state = "passed"
        else:
            state = (f"passed, bound not established (per test {self.per_test:.3g}; "
                     f"{self.why_weak()})")
        scope = f", sampled {self.sampled}" if self.sampled else ""
        return (f"finite field: {state}; {self.tests} tests, d = {self.degree}, bound "
                f"{self.error_bound:.3g} (2^{self.log2_bound:.1f}) vs target "
                f"2^{math.log2(self.target):.0f}{scope}, {self.redraws} redraws, "
                f"{self.seconds:.2f}s")

    def why_weak(self) -> str:
        name, value = max(self.terms, key=lambda t: t[1], default=("degree", 1.0))
        return f"largest term: {name} {value:.3g}"


def finite_field_test(spec: KernelGraph, candidate: KernelGraph, *, tests: int | None = None,
                      seed: int = 0, target: float = TARGET_BOUND, max_tests: int = MAX_TESTS,
                      max_redraws: int = MAX_REDRAWS,
                      sample_blocks: int | None = None) -> FiniteFieldResult:
    """Independent exact tests until the bound reaches `target` (or `tests` of them); stop at a
    mismatch. If `max_tests` tests cannot reach the target the result is passed but not
    `established`. `sample_blocks`: compare that many random blocks of each output (see
    `verify/sampling.py`); the bound then covers only what was sampled. A test of every element
    that would not fit the memory limit (`ir.memory`) is sampled so, and says so."""
    start = time.perf_counter()
    _check_count("tests", tests)
    _check_count("max_tests", max_tests)
    if sample_blocks is None:       # every element, unless that does not fit the memory limit
        from mugraph.verify.sampling import blocks_for_memory
        sample_blocks = blocks_for_memory(spec, candidate)
    if sample_blocks is not None:
        from mugraph.verify.sampling import sampled_test
        return sampled_test(spec, candidate, sample_blocks, tests=tests, seed=seed, target=target,
                            max_tests=max_tests, max_redraws=max_redraws)
    bound = pair_bound(spec, candidate, trust_forms=True)
    count = tests if tests is not None else default_count(bound, target, max_tests)
    runner = _Runner(spec, candidate, seed, bound.exponents, max_redraws)
    for test in range(count):
        failure = runner.run(test)
        if failure is not None:
            return runner.result(False, bound, target, start, failure)
        if runner.new_roundings and bound != (full := pair_bound(spec, candidate)):
            # a cast the bound took for the program's own (by normal form) rounded a value the
            # program does not hold: count every cast, and run as many tests as that needs
            bound = full
            if tests is None:
                count = max(count, default_count(bound, target, max_tests))
    for test in range(len(runner.primes), count):
        failure = runner.run(test)
        if failure is not None:
            return runner.result(False, bound, target, start, failure)
    return runner.result(True, bound, target, start, None)


def default_count(bound: PairBound, target: float, max_tests: int) -> int:
    """Enough tests for `target`; `max_tests` when more would be needed (the bound then says
    not established); a few when one test bounds nothing (a degree beyond the field), since
    more would not help but may still find a difference."""
    needed = tests_needed(bound, target, max_tests)
    if needed is not None:
        return needed
    return max_tests if bound.worst_per_test() < 1 else min(3, max_tests)


def _check_count(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidInput(f"{name}={value!r} is not a positive number of tests",
                           hint="use None for enough tests to reach the target bound")


class _Runner:
    """Runs the tests of one (spec, candidate) pair; remembers primes and redraws."""

    def __init__(self, spec, candidate, seed, exponents, max_redraws):
        self.spec, self.candidate, self.seed = spec, candidate, seed
        self.exponents, self.max_redraws = exponents, max_redraws
        self.primes: list = []
        self.redraws = 0
        self.new_roundings = 0      # elements the candidate's casts rounded as the program does not

    def run(self, test: int) -> str | None:
        for attempt in range(self.max_redraws + 1):
            try:
                expected, got = self._outputs(test, attempt)
            except ZeroDivisorDrawn:
                self.redraws += 1
                continue
            draw = make_draw(self.seed, test, attempt)
            self.primes.append((draw.field.p, draw.field.q))
            return first_mismatch(expected, got, draw, self.exponents)
        raise VerificationError(
            f"finite-field test {test}: every one of {self.max_redraws + 1} draws hit a zero "
            "divisor", hint="a denominator is identically zero in Z_p (e.g. x - x); simplify "
                            "the graph")

    def _outputs(self, test: int, attempt: int):
        try:
            expected, roundings = spec_run(self.spec, self.seed, test, attempt, self.exponents)
            inputs = _inputs(self.spec, self.seed, test, attempt, self.exponents)
            got, sem = _run_graph(self.candidate, make_draw(self.seed, test, attempt), inputs,
                                  self.exponents, roundings)
            self.new_roundings += sem.new_roundings_made
            return expected, got
        except NeedsExponents:  # an op the bound's pass did not see as an exp: rerun with images
            self.exponents = True
            return self._outputs(test, attempt)

    def result(self, passed, bound: PairBound, target, start, failure) -> FiniteFieldResult:
        if passed:
            error = math.prod(bound.per_test(p, q) for p, q in self.primes)
        else:
            error = 1.0
        log2 = math.log2(error) if error > 0 else -math.inf
        terms = tuple(bound.terms().items())
        return FiniteFieldResult(passed, len(self.primes), tuple(self.primes), bound.degree,
                                 error, log2, time.perf_counter() - start, target,
                                 bound.worst_per_test(), terms, self.redraws, failure,
                                 self.exponents)


def first_mismatch(expected, got, draw: Draw, exponents: bool) -> str | None:
    """Where the residues of the outputs differ first, or None."""
    sem = draw.semantics(exponents)
    for i, (a, b) in enumerate(zip(expected, got)):
        if a.shape != b.shape:
            return f"output {i} has shape {b.shape}, the spec's is {a.shape}"
        ra, rb = sem.residue(a), sem.residue(b)
        bad = np.argwhere(ra != rb)
        if len(bad):
            idx = tuple(int(v) for v in bad[0])
            return (f"test {draw.test} (p={draw.field.p}): output {i} differs at {idx} "
                    f"({len(bad)} of {a.size} elements): spec {int(ra[idx])}, candidate "
                    f"{int(rb[idx])}")
    return None
