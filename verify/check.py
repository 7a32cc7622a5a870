"""The verifier's front door: `check` runs the exact finite-field tests, the float differential
test and the formal proof, and decides only on what they established; `quick_equivalent` is the
search's cheap yes/no.

A candidate is EQUIVALENT when the finite-field tests pass with a bound at or below the target
(default 2^-40; more tests are run until it is, up to a limit) and every float case passes; NOT
EQUIVALENT when a float case shows outputs that differ; NOT ESTABLISHED otherwise (a bound above
the target, or a finite-field difference no float case shows). The formal proof (Z3 over
abstract expressions) is run and recorded as proved / not proved; it vetoes only with
`require_proof=True`, since its abstraction misses valid tilings and algebra the tests accept.
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass

from mugraph.ir.errors import InvalidInput, MugraphError, VerificationError
from mugraph.ir.graph import KernelGraph
from mugraph.verify.finite_field import (MAX_TESTS, TARGET_BOUND, FiniteFieldResult,
                                         finite_field_test)
from mugraph.verify.float_diff import FloatResult, float_diff, require_memory

EQUIVALENT, NOT_EQUIVALENT, NOT_ESTABLISHED = "EQUIVALENT", "NOT EQUIVALENT", "NOT ESTABLISHED"


@dataclass(frozen=True)
class MethodResult:
    """One method's outcome in the verdict line: passed, failed, not established, skipped,
    proved or not proved, and why."""

    name: str
    status: str
    why: str

    def __str__(self) -> str:
        return f"{self.name} {self.status} ({self.why})"


@dataclass(frozen=True)
class VerificationReport:
    """Everything `check` found: the verdict, the bound, each method's line and record."""

    equivalent: bool
    error_bound: float                        # P(a non-equivalent pair passes the field tests)
    finite_field: FiniteFieldResult | None
    float: FloatResult | None
    formal: object | None                     # mugraph.verify.abstract.ProofResult
    formal_status: str                        # proved / not proved / skipped / unavailable / error
    seconds: float
    seed: int
    reason: str | None = None                 # why not equivalent
    verdict: str = NOT_EQUIVALENT
    methods: tuple = ()                       # MethodResult per method, in the verdict line
    target: float = TARGET_BOUND

    def verdict_line(self) -> str:
        return f"{self.verdict}: " + "; ".join(str(m) for m in self.methods)

    def __str__(self) -> str:
        lines = [self.verdict_line(), f"  seed {self.seed}, {self.seconds:.2f}s"]
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
        lines.append(f"  error bound: {_power(self.error_bound)} (target {_power(self.target)})")
        return "\n".join(lines)


def _power(bound: float) -> str:
    if bound <= 0:
        return "0"
    exponent = math.log2(bound)
    return f"2^{exponent:.0f}" if exponent == int(exponent) else f"2^{exponent:.1f}"


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
          scale: float = 1.0, target: float = TARGET_BOUND, max_tests: int = MAX_TESTS,
          sample_blocks: int | None = None, rlimit: int | None = None,
          require_proof: bool = False) -> VerificationReport:
    """Verify `candidate` against `spec`.

    tests: finite-field tests (default: as many as the bound needs to reach `target`, at most
    `max_tests`; with a count given, a bound above `target` is NOT ESTABLISHED).
    seed: makes the run reproducible (default: fresh, recorded in the report).
    shapes: "given" (the graphs' own shapes; the only mode: graphs carry concrete shapes).
    formal: also run the Z3 proof (recorded; it vetoes only with require_proof=True).
    scale: the float test's inputs are N(0, 1) · scale (keep exp-heavy programs finite).
    sample_blocks: the finite-field tests compare that many random 64×64 tiles of every output
    per test instead of every element (`verify/sampling.py`); the verdict line says so, and the
    bound covers the compared elements only.
    """
    start = time.perf_counter()
    _check_arguments(shapes, target)
    seed = secrets.randbits(63) if seed is None else seed
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InvalidInput(f"seed={seed!r} is not a non-negative int",
                           hint="pass None for a fresh seed (it is recorded in the report)")
    mismatch = interface_mismatch(spec, candidate)
    if mismatch is not None:
        methods = tuple(MethodResult(n, "skipped", "the interfaces differ") for n in METHODS)
        return VerificationReport(False, 1.0, None, None, None, "skipped",
                                  time.perf_counter() - start, seed, mismatch, NOT_EQUIVALENT,
                                  methods, target)
    require_memory(spec, candidate)     # the float test's refusal, before the finite-field test
    ff, ff_error = _finite_field(spec, candidate, tests, seed, target, max_tests, sample_blocks)
    fl = float_diff(spec, candidate, seed=seed, scale=scale)
    proof, status = _formal(spec, candidate, rlimit) if formal else (None, "skipped")
    methods = (_ff_method(ff, ff_error),) + _float_methods(fl) + (_formal_method(proof, status),)
    verdict, reason = _decide(methods, require_proof, fl)
    bound = ff.error_bound if ff is not None and ff.passed else 1.0
    return VerificationReport(verdict == EQUIVALENT, bound, ff, fl, proof, status,
                              time.perf_counter() - start, seed, reason, verdict, methods, target)


METHODS = ("finite field", "float64", "own precision", "special values", "formal")



def _check_arguments(shapes: str, target: float) -> None:
    if shapes != "given":
        raise InvalidInput(f"check(shapes={shapes!r}) is not supported",
                           hint='graphs carry concrete shapes; use shapes="given" and build the '
                                'graphs at the shapes to test (e.g. Workload.small())')
    if not isinstance(target, float) or not 0 < target < 1:
        raise InvalidInput(f"target={target!r} is not a probability in (0, 1)",
                           hint="the bound to reach, e.g. 2.0 ** -40")


def _finite_field(spec, candidate, tests, seed, target, max_tests, sample_blocks=None):
    try:
        return finite_field_test(spec, candidate, tests=tests, seed=seed, target=target,
                                 max_tests=max_tests, sample_blocks=sample_blocks), None
    except VerificationError as e:
        return None, str(e)


def _ff_method(ff: FiniteFieldResult | None, error: str | None) -> MethodResult:
    name = "finite field"
    if ff is None:
        return MethodResult(name, "skipped", f"could not run: {error}")
    if not ff.passed:
        return MethodResult(name, "failed", ff.failure)
    bound = f"bound {_power(ff.error_bound)} over {ff.tests} tests, target {_power(ff.target)}"
    if ff.sampled:
        bound += f"; on {ff.sampled}"
    if not ff.established:
        return MethodResult(name, "not established", f"{bound}; {ff.why_weak()}")
    return MethodResult(name, "passed", bound)


def _float_methods(fl: FloatResult) -> tuple:
    """float64 and own precision on random inputs; the special-value cases where the float test
    has them. A case counts only where it compared something; the others are named with why
    they did not run (not applicable, stopped by an earlier failure, or nothing compared)."""
    cases = getattr(fl, "cases", None)
    random_modes = [m for m in fl.modes if getattr(m, "case", "random") == "random"]
    lines = tuple(_mode_method(label, [m for m in random_modes if m.mode == mode], fl)
                  for label, mode in (("float64", "float64"), ("own precision", "own")))
    if cases is None:
        return lines + (MethodResult("special values", "skipped",
                                     "this float test has no special-value cases"),)
    return lines + (_special_method([c for c in cases if c.case != "random"]),)


def _special_method(special: list) -> MethodResult:
    ran = [c for c in special if not c.skipped]
    counted = [c for c in ran if c.ran or not c.passed]
    failed = [c.case for c in counted if not c.passed]
    reasons: dict = {}
    for c in special:
        if c.not_run and c not in counted:
            reasons.setdefault(c.not_run, []).append(c.case)
    not_run = "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())
    names = ", ".join(f"{c.case} ({_compared(c)})" for c in counted)
    tail = f"; not run: {not_run}" if not_run else ""
    if failed:
        return MethodResult("special values", "failed", f"{', '.join(failed)} of {names}{tail}")
    if not counted:
        return MethodResult("special values", "not run", not_run or "no case applies")
    return MethodResult("special values", "passed", names + tail)


def _compared(case) -> str:
    compared = min(m.compared for m in case.modes)
    total = max(m.compared + m.skipped for m in case.modes)
    return f"{compared} of {total} compared"


def _mode_method(label: str, modes: list, fl: FloatResult) -> MethodResult:
    if not modes:
        return MethodResult(label, "skipped", "not run")
    worst = modes[0]
    against = f" against {getattr(fl, 'reference', 'spec')}" if worst.mode == "own" else ""
    if worst.worst is None:
        return MethodResult(label, "passed" if worst.passed else "failed", "no outputs")
    w = worst.worst
    tolerance = worst.tolerances[w.output]
    counted = f"; {worst.counted()}" if hasattr(worst, "counted") else ""
    beyond = " beyond the program's own rounding budget" if getattr(w, "beyond_budget", False) else ""
    detail = (w.message or f"relative error {w.error:.2g} per element{beyond}, tolerance "
              f"{tolerance:g}{against}") + counted
    if worst.passed and not getattr(worst, "ran", True):
        return MethodResult(label, "not established", f"compared no element{against}")
    return MethodResult(label, "passed" if worst.passed else "failed", detail)


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


def _formal_method(proof, status: str) -> MethodResult:
    if proof is None:
        why = "not asked for" if status == "skipped" else status
        return MethodResult("formal", "skipped", why)
    detail = getattr(proof, "detail", "") or ""
    why = (f"{proof.method}, in real arithmetic, rounding only where the program rounds (the "
           f"rest of rounding is the float test's)") if proof.proved \
        else f"{proof.method}: {detail}" if detail else proof.method
    return MethodResult("formal", status, why)


def _decide(methods, require_proof: bool, fl) -> tuple[str, str | None]:
    """The verdict from the method lines. NOT EQUIVALENT needs a concrete input on which the
    outputs differ: a failed float case. A finite-field difference alone is NOT ESTABLISHED: the
    programs differ algebraically, or the candidate relies on a law the test does not keep (an
    uninterpreted op has none: sigmoid(x) is not 1/(1 + exp(-x)) there). So is a bound above the
    target, or a proof that was required and not found."""
    by_name = {m.name: m for m in methods}
    field = by_name["finite field"]
    reasons = []
    if field.status == "skipped":
        reasons.append(f"finite-field test {field.why}")
    elif field.status == "failed":
        reasons.append(f"finite-field test failed: {field.why}")
    if not fl.passed:
        reasons.append("float differential test failed: "
                       + "; ".join(str(m) for m in fl.modes if not m.passed))
        return NOT_EQUIVALENT, "; ".join(reasons)
    if reasons:
        return NOT_ESTABLISHED, "; ".join(reasons) + (
            " (no float case differs: the programs differ algebraically, or the candidate relies "
            "on a law the finite-field test does not keep)")
    if field.status != "passed":
        return NOT_ESTABLISHED, f"finite-field bound not established: {field.why}"
    empty = [m for m in methods if m.name in ("float64", "own precision")
             and m.status == "not established"]
    if empty:
        return NOT_ESTABLISHED, "; ".join(f"{m.name}: {m.why}" for m in empty)
    formal = by_name["formal"]
    if require_proof and formal.status != "proved":
        return NOT_ESTABLISHED, f"formal proof required, status: {formal.status}"
    return EQUIVALENT, None


def quick_equivalent(spec: KernelGraph, candidate: KernelGraph, *, tests: int = 1,
                     seed: int = 0) -> bool:
    """`tests` finite-field tests only (the spec's outputs are cached per seed): the search's
    filter, not a verdict (it claims no bound; `check` establishes one).

    A draw that hits a zero divisor is redrawn; a candidate that cannot be tested is rejected.
    """
    return quick_rejection(spec, candidate, tests=tests, seed=seed) is None


def quick_rejection(spec: KernelGraph, candidate: KernelGraph, *, tests: int = 1,
                    seed: int = 0) -> tuple[str, str] | None:
    """`quick_equivalent`'s answer with its reason: None when the candidate passes, else
    (kind, detail): why it failed (counted by kind in the search report), and where."""
    mismatch = interface_mismatch(spec, candidate)
    if mismatch is not None:
        return "interfaces differ", mismatch
    try:
        result = finite_field_test(spec, candidate, tests=tests, seed=seed)
    except VerificationError as e:
        return "finite field could not run", str(e)
    return None if result.passed else ("finite field: outputs differ", result.failure)


def rejection(report: VerificationReport) -> tuple[str, str]:
    """Why `check` did not say EQUIVALENT, as (kind, detail): the first method that failed, or
    was not established, with its worst element; counted by kind in the search's report."""
    for method in report.methods:
        if method.status == "failed":
            return f"{method.name} failed", _failed_detail(report, method)
    for method in report.methods:
        if method.status == "not established":
            return f"{method.name} not established", method.why
    return f"{report.verdict.lower()}", report.reason or report.verdict_line()


def _failed_detail(report: VerificationReport, method: MethodResult) -> str:
    """The failing float case's worst element (its mode's detail), else the method's line."""
    fl = report.float
    mode = {"float64": "float64", "own precision": "own"}.get(method.name)
    if fl is None or method.name not in ("float64", "own precision", "special values"):
        return method.why
    failed = [m for m in fl.modes if not m.passed and (mode is None or m.mode == mode)
              and (method.name != "special values" or m.case != "random")]
    return f"{failed[0].case} case: {failed[0].detail()}" if failed else method.why
