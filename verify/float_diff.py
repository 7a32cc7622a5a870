"""Float differential testing: the candidate against the float64 spec on random real inputs.

The candidate runs through the reference interpreter twice: in float64 (any difference beyond
rounding is a bug: tolerance 1e-9) and in its own dtypes (fp32 arithmetic, 16-bit storage as the
kernels do: 1e-4 for fp32 outputs, 1e-2 for fp16/bf16). The error of an output is
max|candidate − spec| / max|spec|, relative to the output's scale. This catches what the exact
finite-field test cannot: overflow, cancellation, wrong softmax shifts, dtype rounding.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput
from mugraph.ir.graph import KernelGraph
from mugraph.ir.interpret import interpret
from mugraph.verify.field import single_threaded_blas

OWN_TOLERANCE = {DType.FLOAT32: 1e-4, DType.FLOAT16: 1e-2, DType.BFLOAT16: 1e-2}
FLOAT64_TOLERANCE = 1e-9
TINY = 1e-30
MODES = ("float64", "own")


@dataclass(frozen=True)
class Difference:
    """How far one candidate output is from the spec's, and where the worst element is."""

    error: float                   # max |candidate − spec| / max |spec|; inf: non-finite mismatch
    output: int
    index: tuple | None
    spec_value: float | None
    candidate_value: float | None
    message: str | None = None     # set when non-finite values decide the comparison


@dataclass(frozen=True)
class ModeResult:
    """One mode (float64 or own dtype): pass/fail against its tolerance, the worst error."""

    mode: str
    passed: bool
    worst: Difference | None       # the output with the largest error / tolerance
    tolerances: tuple              # per output
    seconds: float

    def __str__(self) -> str:
        w = self.worst
        state = "ok" if self.passed else "FAILED"
        if w is None:
            return f"{self.mode}: {state}"
        where = (f"output {w.output} at {w.index}: candidate {w.candidate_value!r}, "
                 f"spec {w.spec_value!r}")
        tolerance = self.tolerances[w.output]
        detail = w.message or f"relative error {w.error:.3g} (tolerance {tolerance:g})"
        return f"{self.mode}: {state}, {detail}; {where}; {self.seconds:.2f}s"


@dataclass(frozen=True)
class FloatResult:
    """The float differential test: every mode's result, the inputs' scale and seed."""

    passed: bool
    modes: tuple[ModeResult, ...]
    scale: float
    seed: int
    seconds: float

    def mode(self, name: str) -> ModeResult:
        return next(m for m in self.modes if m.mode == name)

    def __str__(self) -> str:
        return "\n".join(f"float {m}" for m in self.modes)


def random_inputs(graph: KernelGraph, *, seed: int = 0,
                  scale: float = 1.0) -> dict[str, np.ndarray]:
    """N(0, 1) · scale per input, rounded to the input's dtype (held in float64)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    return {node.arg[0]: (rng.standard_normal(node.shape) * scale).astype(node.dtype.numpy)
            .astype(np.float64) for node in graph.inputs}


def compare(expected, got, output: int = 0) -> Difference:
    """The relative error of `got` against `expected`; a non-finite mismatch is error = inf."""
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if expected.shape != got.shape:
        return Difference(np.inf, output, None, None, None,
                          f"output {output} has shape {got.shape}, the spec's is {expected.shape}")
    bad = _nonfinite_mismatch(expected, got, output)
    if bad is not None:
        return bad
    finite = np.isfinite(expected)  # where it is not, the two values are equal (checked above)
    diff = np.abs(np.where(finite, got, 0.0) - np.where(finite, expected, 0.0))
    scale = max(float(np.max(np.abs(expected[finite]), initial=0.0)), TINY)
    flat = int(np.argmax(diff)) if diff.size else 0
    index = tuple(int(i) for i in np.unravel_index(flat, diff.shape))
    return Difference(float(diff.flat[flat]) / scale, output, index,
                      float(expected[index]), float(got[index]))


def _nonfinite_mismatch(expected, got, output: int) -> Difference | None:
    same = (expected == got) | (np.isnan(expected) & np.isnan(got))
    wrong = ~np.isfinite(got) & np.isfinite(expected)
    wrong |= ~np.isfinite(expected) & ~same
    if not wrong.any():
        return None
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    e, g = float(expected[index]), float(got[index])
    who = "the candidate" if np.isfinite(e) else "the spec (lower the input scale?)"
    message = (f"output {output} is {g} at {index} where the spec is {e}: a non-finite value "
               f"from {who}; {int(wrong.sum())} such elements")
    return Difference(np.inf, output, index, e, g, message)


def run_mode(mode: str, expected, candidate: KernelGraph, inputs) -> ModeResult:
    """Compare `candidate` run in `mode` with the spec's float64 outputs `expected`."""
    start = time.perf_counter()
    with single_threaded_blas(), np.errstate(all="ignore"):  # overflow is reported, not warned
        got = interpret(candidate, inputs, dtype=mode)
    tolerances = tuple(FLOAT64_TOLERANCE if mode == "float64" else OWN_TOLERANCE[o.dtype]
                       for o in candidate.outputs)
    diffs = [compare(e, g, i) for i, (e, g) in enumerate(zip(expected, got))]
    worst = max(diffs, key=lambda d: d.error / tolerances[d.output]) if diffs else None
    passed = all(d.error <= t for d, t in zip(diffs, tolerances))
    return ModeResult(mode, passed, worst, tolerances, time.perf_counter() - start)


SCALE_TRIES = 8


def usable_inputs(spec: KernelGraph, seed: int, scale: float):
    """Inputs at which the spec itself is finite in its own dtypes: (scale, inputs, float64 outputs).

    A program like softmax without max-subtraction overflows fp16 for inputs of unit scale; no
    candidate can be asked to do better than the spec, so the scale halves until the spec's own
    dtype run is finite wherever its float64 run is (at most SCALE_TRIES times).
    """
    for _ in range(SCALE_TRIES):
        inputs = random_inputs(spec, seed=seed, scale=scale)
        with single_threaded_blas(), np.errstate(all="ignore"):
            expected = interpret(spec, inputs, dtype="float64")
            own = interpret(spec, inputs, dtype="own")
        if all(np.isfinite(o)[np.isfinite(e)].all() for e, o in zip(expected, own)):
            break
        scale /= 2
    return scale, inputs, expected


def float_diff(spec: KernelGraph, candidate: KernelGraph, *, seed: int = 0, scale: float = 1.0,
               modes=MODES) -> FloatResult:
    """Run the spec in float64 and the candidate in each of `modes` on the same random inputs."""
    start = time.perf_counter()
    if len(spec.outputs) != len(candidate.outputs):
        raise InvalidInput(f"the spec has {len(spec.outputs)} outputs, the candidate "
                           f"{len(candidate.outputs)}", hint="compare graphs of one interface")
    for mode in modes:
        if mode not in MODES:
            raise InvalidInput(f"float_diff mode {mode!r}", hint=f"use one of {MODES}")
    scale, inputs, expected = usable_inputs(spec, seed, scale)
    results = tuple(run_mode(m, expected, candidate, inputs) for m in modes)
    return FloatResult(all(r.passed for r in results), results, scale, seed,
                       time.perf_counter() - start)
