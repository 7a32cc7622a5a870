"""What a search returns: the ranked candidates, the winner, and a report of how it went."""
from __future__ import annotations

from dataclasses import dataclass, field

from mugraph.ir import KernelGraph


@dataclass(frozen=True)
class Candidate:
    graph: KernelGraph
    estimate: object               # search.cost.Estimate at the real shapes
    structure: str                 # one-line summary, e.g. "1 custom kernel: grid(...)"
    origin: str                    # "search" or "spec"

    @property
    def seconds(self) -> float:
        return self.estimate.seconds


@dataclass(frozen=True)
class SearchReport:
    stop_reason: str               # exhausted | time | states | candidate cap
    states: int
    block_graphs: int
    pruned: dict                   # by reason: expression, shape, label, phase, duplicate, memory
    structures_found: int          # candidate structures at the reduced shapes
    verified: int                  # structures that passed the finite-field test
    rejected: int                  # structures that failed it (or the winner's full check)
    wall_seconds: float            # the whole call, the check at the real shapes included
    search_seconds: float          # the enumeration, which the time budget bounds
    rules_fired: tuple
    reduced_shapes: dict
    target: str
    spec_estimate: object          # the unfused spec under the cost model
    roofline: object               # the spec's roofline bound
    verification: object = None    # VerificationReport of the winner at the real shapes
    config: str = ""
    best_found_seconds: float | None = None   # when the winner's structure was first found
    best_found_states: int | None = None      # ... and after how many states
    final_check: str = ""          # what the check at the real shapes ran on (whole or sampled)
    unchecked: int = 0             # candidates not checked at the real shapes: no time was left
    simplified: int = 0            # structures the simplifier made smaller (re-verified)
    split: int = 0                 # split-K / split-KV structures derived and verified
    verifier_errors: tuple = ()    # candidates the verifier could not run (rejected), messages
    xla_estimate: object = None    # the XLA-like baseline (search/baseline.py) under the cost model

    def __str__(self) -> str:
        pruned = ", ".join(f"{k} {v}" for k, v in self.pruned.items() if v)
        found = (f"; the winner was found after {self.best_found_seconds:.1f} s "
                 f"({self.best_found_states} states)"
                 if self.best_found_seconds is not None else "; the winner is the spec itself")
        lines = [
            f"stop reason: {self.stop_reason} after {self.search_seconds:.1f} s of search "
            f"({self.wall_seconds:.1f} s in all, with the check at the real shapes){found}",
            f"{_STOP_MEANING.get(self.stop_reason, '')}",
            f"states visited: {self.states} ({self.block_graphs} block graphs closed)",
            f"pruned: {pruned or 'none'}",
            f"structures: {self.structures_found} found, {self.verified} verified, "
            f"{self.rejected} rejected",
            f"structure search at reduced shapes: {self.reduced_shapes}",
        ]
        if self.rules_fired:
            lines.append(f"canonicalised: {', '.join(self.rules_fired)}")
        if self.simplified:
            lines.append(f"simplified: {self.simplified} structures (each re-verified)")
        if self.split:
            lines.append(f"split: {self.split} split-K/split-KV structures derived and verified")
        if self.final_check:
            lines.append(f"check at the real shapes: {self.final_check}")
        if self.verifier_errors:
            lines.append(f"rejected because the verifier could not run them: "
                         f"{len(self.verifier_errors)} (first: {self.verifier_errors[0]})")
        if self.unchecked:
            lines.append(f"not checked at the real shapes (the budget ran out): "
                         f"{self.unchecked} candidates")
        return "\n".join(line for line in lines if line)


_STOP_MEANING = {
    "exhausted": "the whole space at the config's limits was visited",
    "time": "the time budget ended the enumeration; the space was not exhausted",
    "states": "the state budget ended the enumeration; the space was not exhausted",
    "candidate cap": "max_candidates verified structures ended the enumeration; the space was "
                     "not exhausted",
}


@dataclass(frozen=True)
class SpecItself:
    """The verification of a winner that is the spec itself: there is nothing to compare."""

    equivalent: bool = True
    error_bound: float = 0.0

    def __str__(self) -> str:
        return "none needed: the winner is the spec itself"


@dataclass(frozen=True)
class SearchResult:
    best: KernelGraph
    candidates: tuple               # Candidate, best first
    report: SearchReport
    spec: KernelGraph = field(repr=False, default=None)

    @property
    def best_candidate(self) -> Candidate:
        return self.candidates[0]

    @property
    def speedup(self) -> float:
        """Estimated speedup of the winner over the unfused spec under the cost model."""
        return self.report.spec_estimate.seconds / self.candidates[0].seconds

    @property
    def xla_speedup(self) -> float | None:
        """Estimated speedup over the XLA-like baseline (what jax.jit would launch): the headline."""
        xla = self.report.xla_estimate
        return None if xla is None else xla.seconds / self.candidates[0].seconds

    def _speedup_lines(self) -> list[str]:
        lines = []
        if self.report.xla_estimate is not None:
            lines.append(f"  XLA-like baseline {self.report.xla_estimate.seconds * 1e6:.2f} us "
                         f"({self.report.xla_estimate.launches} launches) -> estimated speedup "
                         f"{self.xla_speedup:.2f}x over jax.jit's kernels as modelled")
        lines.append(f"  unfused spec {self.report.spec_estimate.seconds * 1e6:.2f} us -> "
                     f"estimated speedup {self.speedup:.2f}x over one library kernel per op")
        return lines

    def summary(self) -> str:
        best = self.candidates[0]
        roof = self.report.roofline.seconds
        lines = [str(self.report), "",
                 f"winner: {best.structure}",
                 f"  estimated {best.seconds * 1e6:.2f} us on {self.report.target} "
                 f"(roofline bound {roof * 1e6:.2f} us, {best.seconds / roof:.2f}x the bound)",
                 *self._speedup_lines()]
        if self.report.verification is not None:
            lines.append("  verification: " + str(self.report.verification).replace("\n", "\n    "))
        return "\n".join(lines)
