"""The verifier's front door: `check` combines the exact finite-field tests, the float differential
test and the formal proof into one report; `quick_equivalent` is the search's cheap yes/no.

By default a candidate is equivalent when the finite-field tests AND the float differential test
pass. The formal proof (Z3 over abstract expressions) is run and recorded as proved / not proved,
but does not veto: its abstraction is coarse (it misses valid tilings and algebra the tests
accept), so "not proved" is information, not a counterexample. `require_proof=True` makes it veto.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from mugraph.ir.errors import InvalidInput, MugraphError, VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.verify.finite_field import (TARGET_BOUND, FiniteFieldResult, finite_field_test)
from mugraph.verify.float_diff import FloatResult, float_diff


@dataclass(frozen=True)
class VerificationReport:
    """Everything `check` found: the verdict, the bound, and each method's own record."""

    equivalent: bool
    error_bound: float                        # P(a non-equivalent pair passes the field tests)
    finite_field: FiniteFieldResult | None
    float: FloatResult | None
    formal: object | None                     # mugraph.verify.abstract.ProofResult
    formal_status: str                        # proved / not proved / skipped / unavailable / error
    seconds: float
    seed: int
    reason: str | None = None                 # why not equivalent

    def __str__(self) -> str:
        verdict = "EQUIVALENT" if self.equivalent else "NOT EQUIVALENT"
        lines = [f"{verdict} (seed {self.seed}, {self.seconds:.2f}s)"]
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        if self.finite_field is not None:
            lines.append(f"  {self.finite_field}")
        if self.float is not None:
            lines.extend(f"  {line}" for line in str(self.float).splitlines())
        formal = self.formal_status
        if self.formal is not None:
            formal += f" ({self.formal.method}, {self.formal.seconds:.2f}s)"
        lines.append(f"  formal: {formal}")
        lines.append(f"  error bound: {self.error_bound:.3g}")
        return "\n".join(lines)


def interface_mismatch(spec: KernelGraph, candidate: KernelGraph) -> str | None:
    """Why the two graphs cannot be compared (inputs by name, outputs by position), or None."""
    if not isinstance(spec, KernelGraph) or not isinstance(candidate, KernelGraph):
        raise InvalidInput(f"check compares two KernelGraphs, got {type(spec).__name__} and "
                           f"{type(candidate).__name__}")
    s_in = {n.arg[0]: (n.shape, n.dtype) for n in spec.inputs}
    c_in = {n.arg[0]: (n.shape, n.dtype) for n in candidate.inputs}
    if s_in.keys() != c_in.keys():
        return f"inputs differ: spec {sorted(s_in)}, candidate {sorted(c_in)}"
    for name, (shape, dtype) in s_in.items():
        if c_in[name] != (shape, dtype):
            return (f"input {name!r} is {dtype.short}{list(shape)} in the spec, "
                    f"{c_in[name][1].short}{list(c_in[name][0])} in the candidate")
    if len(spec.outputs) != len(candidate.outputs):
        return f"the spec has {len(spec.outputs)} outputs, the candidate {len(candidate.outputs)}"
    for i, (s, c) in enumerate(zip(spec.outputs, candidate.outputs)):
        if (s.shape, s.dtype) != (c.shape, c.dtype):
            return (f"output {i} is {s.dtype.short}{list(s.shape)} in the spec, "
                    f"{c.dtype.short}{list(c.shape)} in the candidate")
    return None


def check(spec: KernelGraph, candidate: KernelGraph, *, tests: int | None = None,
          seed: int | None = None, shapes: str = "given", formal: bool = True,
          scale: float = 1.0, target: float = TARGET_BOUND, rlimit: int | None = None,
          require_proof: bool = False) -> VerificationReport:
    """Verify `candidate` against `spec`.

    tests: finite-field tests (default: enough for a bound <= `target`, at least 3).
    seed: makes the run reproducible (default: fresh, recorded in the report).
    shapes: "given" (the graphs' own shapes; the only mode: graphs carry concrete shapes).
    formal: also run the Z3 proof (recorded; it vetoes only with require_proof=True).
    scale: the float test's inputs are N(0, 1) · scale (keep exp-heavy programs finite).
    """
    start = time.perf_counter()
    if shapes != "given":
        raise InvalidInput(f"check(shapes={shapes!r}) is not supported",
                           hint='graphs carry concrete shapes; use shapes="given" and build the '
                                'graphs at the shapes to test (e.g. Workload.small())')
    seed = secrets.randbits(63) if seed is None else seed
    if not isinstance(seed, int) or seed < 0:
        raise InvalidInput(f"seed={seed!r} is not a non-negative int",
                           hint="pass None for a fresh seed (it is recorded in the report)")
    mismatch = interface_mismatch(spec, candidate)
    if mismatch is not None:
        return VerificationReport(False, 1.0, None, None, None, "skipped",
                                  time.perf_counter() - start, seed, mismatch)
    ff, ff_error = _finite_field(spec, candidate, tests, seed, target)
    fl = float_diff(spec, candidate, seed=seed, scale=scale)
    proof, status = _formal(spec, candidate, rlimit) if formal else (None, "skipped")
    reason = _reason(ff, ff_error, fl, status, require_proof)
    bound = ff.error_bound if ff is not None else 1.0
    return VerificationReport(reason is None, bound, ff, fl, proof, status,
                              time.perf_counter() - start, seed, reason)


def _finite_field(spec, candidate, tests, seed, target):
    try:
        return finite_field_test(spec, candidate, tests=tests, seed=seed, target=target), None
    except VerificationError as e:
        return None, str(e)


def _formal(spec, candidate, rlimit):
    try:
        from mugraph.verify.abstract import prove_equivalent
    except ImportError as e:  # the abstract layer is optional at run time
        return None, f"unavailable ({e})"
    try:
        result = prove_equivalent(spec, candidate, rlimit=rlimit)
    except MugraphError as e:
        return None, f"error ({type(e).__name__}: {e.message})"
    return result, "proved" if result.proved else "not proved"


def _reason(ff, ff_error, fl, status, require_proof) -> str | None:
    if ff is None:
        return f"finite-field test could not run: {ff_error}"
    if not ff.passed:
        return f"finite-field test failed: {ff.failure}"
    if not fl.passed:
        failed = [m for m in fl.modes if not m.passed]
        return "float differential test failed: " + "; ".join(str(m) for m in failed)
    if require_proof and status != "proved":
        return f"formal proof required, status: {status}"
    return None


def quick_equivalent(spec: KernelGraph, candidate: KernelGraph, *, tests: int = 1,
                     seed: int = 0) -> bool:
    """Finite-field tests only (the spec's outputs are cached per seed): the search's filter.

    A draw that hits a zero divisor is redrawn; a candidate that cannot be tested is rejected.
    """
    if interface_mismatch(spec, candidate) is not None:
        return False
    try:
        return finite_field_test(spec, candidate, tests=tests, seed=seed).passed
    except VerificationError:
        return False
