"""Float differential testing: the candidate against the spec on random inputs and on IEEE special values.

Each case is one set of inputs, run in two modes:
* float64: the candidate in float64 against the spec in float64, both rounding at their casts to
  a 16-bit dtype and nowhere else (any difference beyond that is a bug: tolerance 1e-9); NaN and
  ±inf must sit exactly where the spec has them;
* own: the candidate in its own dtypes (fp32 arithmetic and accumulation, 16-bit storage, as the
  generated kernels do; 1e-4 for fp32 outputs, 1e-2 for fp16/bf16), held to the float64 spec's
  values, beside the program as its dtypes compute it: `jax.jit(fn)` on the same inputs when the
  spec was traced from JAX (`ir.origin`), else the spec run in its own dtypes. On random inputs
  jax.jit(fn) must agree with the float64 spec within tolerance (else the spec is not the JAX
  program, and nothing is verified). On special-value inputs, where that run and the float64
  spec are the same NaN or ±inf, the candidate must be that NaN or ±inf; where the run is finite
  and within tolerance of the float64 spec, the candidate must be too; where it ran out of range
  or precision (an overflow that ended finite, as x / inf = 0), no kernel is held to its answer:
  those elements are not compared, and counted.
Errors are per element (`element_errors`): |candidate − expected|, less twice the rounding the
program's own casts allow there (a kernel may skip a rounding the program makes), relative to
the magnitude of the terms that produced the element (`verify.magnitude`: sums add magnitudes,
products multiply them, a function adds its slope times its operand's), capped at the output's
largest value and at least the output dtype's smallest normal in own precision (below it,
16-bit results have no relative precision). So an element small among large ones is held to its
own size, while a sum that cancels is held to its terms. Each mode counts the elements it
compared; a case that compared none established nothing and is reported as not run. In the
`large` case, a range test, elements where the reference (the float64 spec, or the own-dtype run)
overflowed are not compared either: a kernel that keeps them finite is not wrong; wherever the
program's own run is right, a kernel that loses range is. A spec lifted from JAX has jax.jit's
dtypes (its casts are CAST ops), so a candidate is held to everything jax.jit(fn) holds: one
that rounds or reduces in a narrower dtype than the program (an fp16 row sum past 65504) fails.

Cases (`CASES`): random inputs, N(0, 1) · scale with the scale halved until the reference is
finite, then the special-value cases of `special_values` (exact zeros, NaN, ±inf, softmax masks,
large values, denormals, underflow), each placed where it means something for the program.
"""
from __future__ import annotations

import functools
import math
import time
import weakref
from dataclasses import dataclass, replace

import numpy as np

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret
from mugraph.ir.ops import TOp
from mugraph.ir.origin import jax_origin
from mugraph.ir.semantics import NumpySemantics
from mugraph.verify.field import single_threaded_blas
from mugraph.verify.magnitude import magnitude_floor, rounded, run as run_magnitudes
from mugraph.verify.special_values import CASES, finfo, normal, special_inputs

OWN_TOLERANCE = {DType.FLOAT32: 1e-4, DType.FLOAT16: 1e-2, DType.BFLOAT16: 1e-2}
FLOAT64_TOLERANCE = 1e-9
TINY = 1e-30
MODES = ("float64", "own")
RANGE_CASES = frozenset({"large"})     # where the reference's own overflow is not compared
SCALE_TRIES = 8


@dataclass(frozen=True)
class Difference:
    """How far one candidate output is from the reference, and where the worst element is."""

    error: float                   # the worst element error (`element_errors`); inf: non-finite mismatch
    output: int
    index: tuple | None
    spec_value: float | None
    candidate_value: float | None
    message: str | None = None     # set when non-finite values decide the comparison
    skipped: int = 0               # elements not compared (see the module docstring)
    compared: int = 0              # elements compared
    magnitude: float | None = None  # the worst element's magnitude (what its error is relative to)
    beyond_budget: bool = False    # the error is what lies beyond the program's own rounding budget


@dataclass(frozen=True)
class ModeResult:
    """One mode of one case: pass/fail against its tolerance, the worst error."""

    mode: str
    passed: bool
    worst: Difference | None       # the output with the largest error / tolerance
    tolerances: tuple              # per output
    seconds: float
    case: str = "random"
    reference: str = "spec"        # what the candidate was compared with
    skipped: int = 0               # elements not compared, all outputs
    compared: int = 0              # elements compared, all outputs

    @property
    def ran(self) -> bool:
        """Compared at least one element (a mode that compared nothing established nothing)."""
        return self.compared > 0

    def detail(self) -> str:
        """The worst element and how many were compared."""
        w = self.worst
        if w is None:
            return "no outputs"
        where = (f"; output {w.output} at {w.index}: candidate {w.candidate_value!r}, "
                 f"expected {w.spec_value!r}") if w.index is not None else ""
        if w.magnitude is not None and w.index is not None and w.message is None:
            where += f" (magnitude {w.magnitude:.3g})"
        tolerance = self.tolerances[w.output]
        beyond = " beyond the program's own rounding budget" if w.beyond_budget else ""
        detail = w.message or f"relative error {w.error:.3g}{beyond} (tolerance {tolerance:g})"
        return f"{detail}{where}; {self.counted()}"

    def counted(self) -> str:
        """How many elements were compared, and how many were not."""
        total = self.compared + self.skipped
        return f"{self.compared} of {total} elements compared"

    def __str__(self) -> str:
        state = "ok" if self.passed else "FAILED"
        return f"{self.case} {self.mode}: {state}, {self.detail()}; {self.seconds:.2f}s"


@dataclass(frozen=True)
class CaseResult:
    """One input case (random or a special value): what the inputs hold, and each mode's result."""

    case: str
    detail: str
    modes: tuple[ModeResult, ...]
    skipped: str | None = None     # why the case did not run

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.modes)

    @property
    def ran(self) -> bool:
        """It ran, and every mode compared something."""
        return not self.skipped and bool(self.modes) and all(m.ran for m in self.modes)

    @property
    def not_run(self) -> str | None:
        """Why the case established nothing: not run (and why), or it compared no element."""
        if self.skipped:
            return self.skipped
        empty = [m.mode for m in self.modes if not m.ran]
        if empty:
            return (f"compared no element in {', '.join(empty)} (the program's own run lost "
                    f"range or precision everywhere)")
        return None

    def __str__(self) -> str:
        if self.skipped:
            return f"{self.case}: not run ({self.skipped})"
        return "\n".join(str(m) for m in self.modes)


@dataclass(frozen=True)
class FloatResult:
    """The float differential test: every case's result, the reference, the inputs' scale and seed."""

    passed: bool
    cases: tuple[CaseResult, ...]
    scale: float
    seed: int
    seconds: float
    reference: str = "spec"        # own precision against: "jax.jit(fn)" or "spec"

    @property
    def modes(self) -> tuple[ModeResult, ...]:
        """Every mode result of every case that ran."""
        return tuple(m for c in self.cases for m in c.modes)

    @property
    def special_cases(self) -> tuple[str, ...]:
        """The special-value cases that ran and compared something."""
        return tuple(c.case for c in self.cases if c.case != "random" and c.ran)

    def mode(self, name: str) -> ModeResult:
        """The worst failure of mode `name` across cases, else its random-case result."""
        ran = [m for m in self.modes if m.mode == name]
        failed = [m for m in ran if not m.passed]
        if failed:
            return max(failed, key=_badness)
        return next(m for m in ran if m.case == "random") if any(m.case == "random" for m in ran) \
            else ran[0]

    def summary(self, name: str) -> str:
        """One line for mode `name` over every case: the verdict, the worst result, the time."""
        ran = [m for m in self.modes if m.mode == name]
        failed = [m.case for m in ran if not m.passed]
        state = "ok" if not failed else f"FAILED in {', '.join(failed)}"
        against = f" against {self.reference}" if name == "own" else ""
        worst = max(ran, key=_badness)
        compared, skipped = sum(m.compared for m in ran), sum(m.skipped for m in ran)
        return (f"{name}: {state}{against}; worst ({worst.case}): {worst.detail()}; "
                f"{compared} of {compared + skipped} elements compared in all; "
                f"{sum(m.seconds for m in ran):.2f}s")

    def __str__(self) -> str:
        names = list(dict.fromkeys(m.mode for m in self.modes))
        not_run = [f"{c.case} not run: {c.not_run}" for c in self.cases if c.not_run]
        cases = ", ".join(c.case for c in self.cases if c.ran)
        lines = [f"float {self.summary(n)}" for n in names]
        lines.append(f"float cases: {cases or 'none'} (scale {self.scale:g})"
                     + (f"; {'; '.join(not_run)}" if not_run else ""))
        return "\n".join(lines)


def _badness(m: ModeResult) -> float:
    return m.worst.error / m.tolerances[m.worst.output] if m.worst is not None else 0.0


# ---- inputs ---------------------------------------------------------------------------------------
def random_inputs(graph: KernelGraph, *, seed: int = 0,
                  scale: float = 1.0) -> dict[str, np.ndarray]:
    """N(0, 1) · scale per input, as an array of the input's dtype (`special_values.normal`)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    return {node.arg[0]: normal(rng, node.shape, node.dtype, scale) for node in graph.inputs}


class CaseInputs(dict):
    """One case's inputs by name, each an array of its input's dtype (the caller's promise: they
    are not rounded again); `widened()` holds the same
    values in float64, made once for every float64 run of the case (widening a large fp16 weight
    costs more than the matmul that reads it)."""

    def __init__(self, arrays):
        super().__init__(arrays)
        self._wide = None

    def widened(self) -> dict:
        if self._wide is None:
            self._wide = {name: widen(a) for name, a in self.items()}
        return self._wide


@functools.lru_cache(maxsize=8)
def _widening_table(dtype: np.dtype, to: type) -> np.ndarray:
    """Every value of a 16-bit float dtype, by bit pattern, in `to` (its NaN patterns stay NaN:
    ml_dtypes warns casting them, which is no news here)."""
    with np.errstate(invalid="ignore"):
        return np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(to)


def widen(a, to: type = np.float64) -> np.ndarray:
    """`a` as `to`, exactly. A 16-bit float array goes through a table of its 2^16 values: NumPy
    converts float16 in a software loop that is slow, and 5x slower again on subnormals."""
    a = np.asarray(a)
    if a.dtype.itemsize == 2 and a.dtype.kind == "f" or a.dtype == DType.BFLOAT16.numpy:
        return _widening_table(a.dtype, to)[a.view(np.uint16)]
    return a.astype(to)


class _DtypeInputs(NumpySemantics):
    """The NumPy semantics on inputs that already hold values of their dtypes (float_diff makes
    them so): float64 runs read the case's widened copy as is, own-precision runs the dtype arrays
    as is, where `NumpySemantics.input` would round and convert every element again; 16-bit
    values widen to fp32 through `widen`'s table (subnormals cost 4x more through NumPy's cast)."""

    def input(self, array, dtype):
        a = np.asarray(array)
        if a.dtype == (np.float64 if self.float64 else dtype.numpy):
            return a
        return super().input(array, dtype)

    def _up(self, x):
        if not self.float64 and isinstance(x, np.ndarray) and x.dtype.itemsize == 2:
            return widen(x, np.float32)
        return super()._up(x)

    def elementwise(self, op, args, arg, dtype):
        if op is TOp.CAST and self.float64:   # float64 mode honours the program's roundings
            return rounded(args[0], arg)
        return super().elementwise(op, args, arg, dtype)


_SEMANTICS = {"float64": _DtypeInputs(float64=True), "own": _DtypeInputs(float64=False)}


# ---- comparison -----------------------------------------------------------------------------------
BUDGET_SLACK = 2.0     # the program's explicit roundings (magnitude.py's R) a candidate may skip, x2


def element_errors(expected, got, magnitude=None, budget=None, floor: float = TINY) -> np.ndarray:
    """Each finite element's error: how far `got` is from `expected` beyond BUDGET_SLACK times the
    rounding `budget` (the program's own roundings a candidate may skip), relative to the
    element's own scale: the `magnitude` of the terms that produced it (`verify.magnitude`),
    capped at the output's largest finite value, and at least `floor`. Without a magnitude every
    element is measured against the output's largest value (the whole-output yardstick).

    The cap keeps the yardstick never looser than the whole output's (an exp's slope makes a
    softmax's M several times its value); the magnitude holds an element that is small among
    large ones to its own size (0 where y·2^-156·2^156 underflowed is an error of 1, not 1e-5)."""
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(expected)
        cap = float(np.max(np.abs(expected[finite]), initial=0.0))
        scale = cap if magnitude is None else np.minimum(np.asarray(magnitude, np.float64), cap)
        excess = np.abs(got - expected)
        if budget is not None:
            excess = np.maximum(excess - BUDGET_SLACK * np.asarray(budget, np.float64), 0.0)
        return excess / np.maximum(scale, floor)


def compare(expected, got, output: int = 0, skip=None, floor: float = TINY, magnitude=None,
            budget=None) -> Difference:
    """The worst element error (`element_errors`) of `got` against `expected`; a non-finite
    mismatch is error = inf.

    `skip`: a boolean array of elements not to compare (counted in `Difference.skipped`).
    `floor`: the least scale errors are relative to (an output dtype's smallest normal: below
    it, a 16-bit result has no relative precision to compare).
    """
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if expected.shape != got.shape:
        return Difference(np.inf, output, None, None, None,
                          f"output {output} has shape {got.shape}, the reference's is {expected.shape}")
    skipped = 0
    if skip is not None and np.any(skip):
        skipped = int(np.sum(skip))
        expected, got = np.where(skip, 0.0, expected), np.where(skip, 0.0, got)
    compared = expected.size - skipped
    bad = _nonfinite_mismatch(expected, got, output)
    if bad is not None:
        return replace(bad, skipped=skipped, compared=compared)
    finite = np.isfinite(expected)  # where it is not, the two values are equal (checked above)
    errors = element_errors(np.where(finite, expected, 0.0), np.where(finite, got, 0.0),
                            magnitude, budget, floor)
    errors = np.where(finite, np.nan_to_num(errors, nan=0.0), 0.0)
    flat = int(np.argmax(errors)) if errors.size else 0
    index = tuple(int(i) for i in np.unravel_index(flat, errors.shape))
    scale = None if magnitude is None else float(np.broadcast_to(magnitude, errors.shape)[index])
    return Difference(float(errors.flat[flat]) if errors.size else 0.0, output, index,
                      float(expected[index]), float(got[index]), skipped=skipped,
                      compared=compared, magnitude=scale, beyond_budget=budget is not None)


def _nonfinite_mismatch(expected, got, output: int) -> Difference | None:
    same = (expected == got) | (np.isnan(expected) & np.isnan(got))
    wrong = ~np.isfinite(got) & np.isfinite(expected)
    wrong |= ~np.isfinite(expected) & ~same
    if not wrong.any():
        return None
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    e, g = float(expected[index]), float(got[index])
    who = "the candidate" if np.isfinite(e) else "the reference"
    message = (f"output {output} is {g} at {index} where the reference is {e}: a non-finite "
               f"value from {who}; {int(wrong.sum())} such elements")
    return Difference(np.inf, output, index, e, g, message)


# ---- references -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """What one case's candidate runs are compared with: the float64 spec's outputs (its casts
    honoured) with each element's magnitude and rounding budget (`verify.magnitude`), and the
    own-precision reference (jax.jit(fn), or the float64 spec) with the elements it cannot vouch
    for."""

    float64: list
    own: list
    own_skip: list                 # per output: boolean array or None
    own_name: str
    own_run: list                  # the own-precision run itself (jax.jit(fn), or the spec's)
    disagreement: Difference | None = None   # random case: jax.jit(fn) is not the float64 spec
    magnitude: list | None = None  # per output: each element's M (None: |value|)
    budget: list | None = None     # per output: each element's rounding budget R


def _run(graph, inputs, mode):
    with single_threaded_blas(), np.errstate(all="ignore"):  # overflow is reported, not warned
        if not isinstance(inputs, CaseInputs):   # arrays of any type: rounded to the dtypes
            if mode == "float64":
                return interpret(graph, inputs, semantics=_SEMANTICS[mode])
            return interpret(graph, inputs, dtype=mode)
        arrays = inputs.widened() if mode == "float64" else inputs
        return interpret(graph, arrays, semantics=_SEMANTICS[mode])


def spec_magnitudes(spec: KernelGraph, inputs) -> tuple[list, list, list]:
    """The spec in float64 with its casts honoured: (values, magnitudes, rounding budgets) per
    output (`verify.magnitude`)."""
    arrays = inputs.widened() if isinstance(inputs, CaseInputs) else \
        {k: np.asarray(v, np.float64) for k, v in dict(inputs).items()}
    with single_threaded_blas(), np.errstate(all="ignore"):
        outs = run_magnitudes(spec, arrays)
    values = [np.ascontiguousarray(o.v) for o in outs]
    return values, [magnitude_floor(o.v, o.magnitude()) for o in outs], \
        [None if o.r is None else np.where(np.isfinite(o.r), np.broadcast_to(o.r, o.shape), 0.0)
         for o in outs]


def _jax_outputs(spec: KernelGraph, origin, inputs) -> list:
    arrays = [np.asarray(inputs[n.arg[0]], n.dtype.numpy) for n in spec.inputs]
    with np.errstate(all="ignore"):
        outs = origin.run(arrays)
    if len(outs) != len(spec.outputs):
        return [np.asarray(o, np.float64) for o in outs]
    return [np.asarray(o, np.float64).reshape(node.shape) if np.size(o) == math.prod(node.shape)
            else np.asarray(o, np.float64) for o, node in zip(outs, spec.outputs)]


def reference(spec: KernelGraph, inputs, case: str = "random") -> Reference:
    """The reference outputs of one case (see the module docstring for what is not compared)."""
    f64, magnitude, budget = spec_magnitudes(spec, inputs)
    run, name = _own_run(spec, inputs)
    expected, skip = [], []
    for node, e, r, m, q in zip(spec.outputs, f64, run, magnitude, budget):
        want, held = _own_expected(node, e, r, case, m, q)
        expected.append(want)
        skip.append(~held)
    disagreement = _disagreement(spec, f64, run) if name == JAX_REFERENCE and case == "random" \
        else None
    return Reference(f64, expected, skip, name, run, disagreement, magnitude, budget)


JAX_REFERENCE = "jax.jit(fn)"


def _own_run(spec: KernelGraph, inputs) -> tuple[list, str]:
    """jax.jit(fn)'s outputs when the spec came from JAX, else the spec's own run; when jax.jit
    cannot run, the spec's own run under a name that says so."""
    origin = jax_origin(spec)
    if origin is None:
        return _run(spec, inputs, "own"), "spec"
    try:
        outs = _jax_outputs(spec, origin, inputs)
    except Exception as e:  # the user's function: report, do not crash the check
        return _run(spec, inputs, "own"), f"spec (jax.jit(fn) failed: {type(e).__name__}: {e})"
    if len(outs) != len(spec.outputs) or any(np.shape(o) != n.shape
                                             for o, n in zip(outs, spec.outputs)):
        shapes = [tuple(np.shape(o)) for o in outs]
        return _run(spec, inputs, "own"), \
            f"spec (jax.jit(fn) returns shapes {shapes}, not the graph's outputs)"
    return outs, JAX_REFERENCE


DISAGREEMENT_ROUNDINGS = 8


def disagreement_tolerance(dtype: DType) -> float:
    """How far jax.jit(fn) may be from the float64 spec before the spec is taken for another
    program: the output's own tolerance, or DISAGREEMENT_ROUNDINGS of its dtype's epsilon where
    that is larger. jax.jit rounds every intermediate to the program's dtype, and in bfloat16
    (8-bit significand, eps 2^-7) a softmax and a matmul over its 8-bit probabilities are about
    1% off the float64 spec; a lifting error changes values by O(1)."""
    return max(OWN_TOLERANCE[dtype], DISAGREEMENT_ROUNDINGS * float(finfo(dtype).eps))


def _disagreement(spec, f64, run) -> Difference | None:
    """Where jax.jit(fn) and the float64 spec differ beyond the output's tolerance on random
    inputs: the spec is not the program jax.jit runs (a lifting error), so nothing is verified.
    Measured against the whole output (no magnitudes): a lifting error changes values by O(1)
    of the output, while jax.jit's own dtypes may lose a small element entirely (an fp16 silu
    of -10 underflows to -0), which is the program's precision, not another program."""
    for i, (node, e, r) in enumerate(zip(spec.outputs, f64, run)):
        d = compare(e, r, i, floor=float(finfo(node.dtype).smallest_normal))
        if d.error > disagreement_tolerance(node.dtype):
            return Difference(np.inf, i, None, d.spec_value, d.candidate_value,
                              f"jax.jit(fn) gives {d.candidate_value!r} at output {i} {d.index} where "
                              f"the float64 spec gives {d.spec_value!r} (relative error {d.error:.3g} "
                              "of the output's largest value): the spec is not the program jax.jit "
                              "runs")
    return None


def _own_expected(node, f64, run, case: str, magnitude=None, budget=None):
    """What the candidate's own-precision output must be, and the elements `run` vouches for.

    Where the program's own run (`run`) and the float64 spec are the same NaN or ±inf, the
    candidate must be too (not in a range case). Where `run` is finite and within the output's
    tolerance of the float64 spec (element by element, `element_errors`), the candidate is held
    to the float64 value (`run` carries rounding of its own). Elsewhere `run` ran out of range
    or precision (an overflow that ended finite, as x / inf = 0; an underflow to 0 that met an
    inf and made a NaN the float64 spec does not have; an fp16 silu of -10 that underflowed to
    -0): no kernel is held to its answer there. The same holds on random inputs, where the
    disagreement check (`_disagreement`) first makes sure `run` is the program.
    """
    f64, run = np.asarray(f64, np.float64), np.asarray(run, np.float64)
    range_case = case in RANGE_CASES
    finite = np.isfinite(f64) & np.isfinite(run)
    errors = element_errors(np.where(finite, f64, 0.0), np.where(finite, run, 0.0), magnitude,
                            budget, float(finfo(node.dtype).smallest_normal))
    right = finite & (errors <= OWN_TOLERANCE[node.dtype])
    special = ~np.isfinite(run) & ((run == f64) | (np.isnan(run) & np.isnan(f64)))
    held = right if range_case else right | special
    return np.where(right, f64, np.where(special, run, 0.0)), held


def run_mode(mode: str, ref: Reference, candidate: KernelGraph, inputs,
             case: str = "random") -> ModeResult:
    """Compare `candidate` run in `mode` with the reference of its case, element by element
    (`element_errors`: each against its own magnitude, beyond the program's rounding budget)."""
    start = time.perf_counter()
    got = _run(candidate, inputs, mode)
    if mode == "float64":
        expected, name = ref.float64, "spec"
        skip = [~np.isfinite(e) if case in RANGE_CASES else None for e in expected]
    else:
        expected, skip, name = ref.own, ref.own_skip, ref.own_name
    tolerances = tuple(FLOAT64_TOLERANCE if mode == "float64" else OWN_TOLERANCE[o.dtype]
                       for o in candidate.outputs)
    floors = [TINY if mode == "float64" else float(finfo(o.dtype).smallest_normal)
              for o in candidate.outputs]
    count = len(expected)
    magnitude = ref.magnitude or [None] * count
    budget = ref.budget or [None] * count
    diffs = [compare(e, g, i, s, f, m, q) for i, (e, g, s, f, m, q)
             in enumerate(zip(expected, got, skip, floors, magnitude, budget))]
    compared, skipped = sum(d.compared for d in diffs), sum(d.skipped for d in diffs)
    if mode == "own" and ref.disagreement is not None:
        diffs.append(ref.disagreement)
    worst = max(diffs, key=lambda d: d.error / tolerances[d.output]) if diffs else None
    passed = all(d.error <= tolerances[d.output] for d in diffs)
    return ModeResult(mode, passed, worst, tolerances, time.perf_counter() - start, case, name,
                      skipped, compared)


def usable_inputs(spec: KernelGraph, seed: int, scale: float):
    """Random inputs at which the own-precision reference is finite wherever the float64 spec is:
    (scale, inputs, Reference).

    A program like softmax without max-subtraction overflows fp16 for inputs of unit scale; no
    candidate can be asked to do better than the spec, so the scale halves until the reference
    is finite (at most SCALE_TRIES times).
    """
    for _ in range(SCALE_TRIES):
        inputs = CaseInputs(random_inputs(spec, seed=seed, scale=scale))
        ref = cached_reference(spec, inputs, "random", (seed, scale))
        if all(np.isfinite(o)[np.isfinite(e)].all() for e, o in zip(ref.float64, ref.own_run)):
            break
        scale /= 2
    return scale, inputs, ref


_REFERENCES: "weakref.WeakKeyDictionary[KernelGraph, dict]" = weakref.WeakKeyDictionary()
CACHED_PER_SPEC = 32


def cached_reference(spec: KernelGraph, inputs, case: str, key: tuple) -> Reference:
    """`reference`, remembered per spec (the search and the mutation tests check many candidates
    against one spec); `key` with `case` determines `inputs` (seed and scale)."""
    table = _REFERENCES.setdefault(spec, {})
    full = (case, *key, jax_origin(spec))
    if full not in table:
        if len(table) >= CACHED_PER_SPEC:
            table.pop(next(iter(table)))
        table[full] = reference(spec, inputs, case)
    return table[full]


def clear_cache() -> None:
    """Forget cached references (benchmarks time first calls)."""
    _REFERENCES.clear()


# ---- the test -------------------------------------------------------------------------------------
def _check_arguments(spec, candidate, modes, cases) -> None:
    if len(spec.outputs) != len(candidate.outputs):
        raise InvalidInput(f"the spec has {len(spec.outputs)} outputs, the candidate "
                           f"{len(candidate.outputs)}", hint="compare graphs of one interface")
    for mode in modes:
        if mode not in MODES:
            raise InvalidInput(f"float_diff mode {mode!r}", hint=f"use one of {MODES}")
    for case in cases:
        if case not in CASES:
            raise InvalidInput(f"float_diff case {case!r}", hint=f"use some of {CASES}")


def _run_case(spec, candidate, case, base, base_ref, seed, scale, modes) -> CaseResult:
    inputs, detail = special_inputs(spec, case, base, seed)
    if inputs is None:
        return CaseResult(case, detail, (), skipped=detail)
    inputs = base if inputs is base else CaseInputs(inputs)
    ref = base_ref if case == "random" else cached_reference(spec, inputs, case, (seed, scale))
    return CaseResult(case, detail, tuple(run_mode(m, ref, candidate, inputs, case) for m in modes))


def require_memory(spec: KernelGraph, candidate: KernelGraph) -> None:
    """A ResourceError before any input is drawn when the test does not fit the memory limit:
    the spec and the candidate in float64, each input in float64 and its own dtype."""
    from mugraph.ir import memory
    memory.require(memory.evaluation_bytes([spec, candidate, spec], 8),
                   f"the float test of {memory.describe(spec)}",
                   "verify the program at smaller shapes (e.g. Workload.small(), or the function "
                   "traced with smaller example arguments)")


def float_diff(spec: KernelGraph, candidate: KernelGraph, *, seed: int = 0, scale: float = 1.0,
               modes=MODES, cases=CASES, stop_at_failure: bool = True) -> FloatResult:
    """Run the candidate in each of `modes` against the spec's references on every case's inputs.

    With `stop_at_failure`, the cases after the first that fails are not run (listed as such).
    """
    start = time.perf_counter()
    _check_arguments(spec, candidate, modes, cases)
    require_memory(spec, candidate)
    scale, base, base_ref = usable_inputs(spec, seed, scale)
    results, failed = [], None
    for case in cases:
        if failed is not None and stop_at_failure:
            results.append(CaseResult(case, "", (), skipped=f"the {failed} case failed"))
            continue
        results.append(_run_case(spec, candidate, case, base, base_ref, seed, scale, modes))
        failed = failed or (None if results[-1].passed else case)
    return FloatResult(all(r.passed for r in results), tuple(results), scale, seed,
                       time.perf_counter() - start, base_ref.own_name)
