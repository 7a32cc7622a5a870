"""What a search returns: the ranked candidates, the winner, and a report of how it went."""
from __future__ import annotations

from dataclasses import dataclass, field

from mugraph.ir import KernelGraph
from mugraph.search.targets import get_target


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
    unchecked: int = 0             # candidates not checked at the real shapes (why: below)
    simplified: int = 0            # structures the simplifier made smaller (re-verified)
    split: int = 0                 # split-K / split-KV structures derived and verified
    verifier_errors: tuple = ()    # candidates the verifier could not run (rejected), messages
    resumed: str = ""                         # where a resumed search took up (checkpoint)
    resized: str = ""                         # a winner re-sized from another shape's search
    unchecked_why: str = ""        # no time was left, or the check did not fit the memory limit
    rejections: tuple = ()         # Rejections.rows(): (where, why, count, an example)

    def stop_meaning(self) -> str:
        """What the stop reason says about the space. Exhausted with subtrees cut by the
        abstract-expression test (which is not complete: it may cut a valid program) visited
        what the pruning rules admit, not the whole space."""
        if self.stop_reason == "exhausted" and self.pruned.get("expression", 0):
            return ("the enumeration ran to its end at the config's limits, visiting what the "
                    "pruning rules admit: the abstract-expression test (not complete) cut "
                    f"{self.pruned.get('expression', 0)} subtrees, so the whole space was not "
                    "visited")
        return _STOP_MEANING.get(self.stop_reason, "")

    def __str__(self) -> str:
        pruned = ", ".join(f"{k} {v}" for k, v in self.pruned.items() if v)
        found = (f"; the winner was found after {self.best_found_seconds:.1f} s "
                 f"({self.best_found_states} states)"
                 if self.best_found_seconds is not None else "; the winner is the spec itself")
        lines = [
            f"stop reason: {self.stop_reason} after {self.search_seconds:.1f} s of search "
            f"({self.wall_seconds:.1f} s in all, with the check at the real shapes){found}",
            self.stop_meaning(),
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
        lines.extend(_rejection_lines(self.rejections))
        if self.verifier_errors:
            lines.append(f"rejected because the verifier could not run them: "
                         f"{len(self.verifier_errors)} (first: {self.verifier_errors[0]})")
        if self.unchecked:
            why = self.unchecked_why or "the budget ran out"
            lines.append(f"not checked at the real shapes ({why}): {self.unchecked} candidates")
        if self.resumed:
            lines.append(self.resumed)
        if self.resized:
            lines.append(self.resized)
        return "\n".join(line for line in lines if line)


def _rejection_lines(rows) -> list[str]:
    """Why structures were rejected: per place (reduced or real shapes), counts by reason, each
    with an example (the first failing method and element)."""
    lines, places = [], {}
    for where, why, count, example in rows:
        places.setdefault(where, []).append((why, count, example))
    for where, reasons in places.items():
        total = sum(count for _, count, _ in reasons)
        lines.append(f"rejected at {where}: {total}, by reason:")
        lines.extend(f"  {count} {why}; e.g. {example}" for why, count, example in reasons)
    return lines


@dataclass
class Rejections:
    """Why candidates were rejected: counts by (where, reason) and the first example of each."""

    counts: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    EXAMPLE_CHARS = 400

    def add(self, where: str, why: str, example: str) -> None:
        key = (where, why)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.examples.setdefault(key, example[:self.EXAMPLE_CHARS])

    def rows(self) -> tuple:
        return tuple((where, why, n, self.examples[(where, why)])
                     for (where, why), n in self.counts.items())


_STOP_MEANING = {
    "exhausted": "the whole space at the config's limits was visited",
    "time": "the time budget ended the enumeration; the space was not exhausted",
    "states": "the state budget ended the enumeration; the space was not exhausted",
    "candidate cap": "max_candidates verified structures ended the enumeration; the space was "
                     "not exhausted",
    "interrupted": "a stop request ended the enumeration; the space was not exhausted and the "
                   "winner was not checked at the real shapes",
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
    def xla_estimate(self):
        """The XLA-like baseline: what jax.jit would launch for the spec (search/baseline.py)."""
        from mugraph.search.baseline import xla_estimate
        return xla_estimate(self.spec, self.report.target)

    @property
    def speedup(self) -> float | None:
        """The headline: estimated speedup of the winner over the XLA-like baseline; None when
        the winner launches nothing (an identity, a program of its inputs only)."""
        best = self.candidates[0].seconds
        return self.xla_estimate.seconds / best if best > 0 else None

    @property
    def speedup_eager(self) -> float | None:
        """The same speedup with every kernel, the baseline's and the winner's, launched eagerly from Python
        (`Launch.EAGER`, `launch_s` each): a second number, never the headline (jax.jit launches from C++ and
        replays command buffers); None when the winner launches nothing."""
        from mugraph.search.baseline import xla_estimate
        from mugraph.search.cost import Launch, estimate
        ours = estimate(self.candidates[0].graph, self.report.target, launch=Launch.EAGER).seconds
        theirs = xla_estimate(self.spec, self.report.target, launch=Launch.EAGER).seconds
        return theirs / ours if ours > 0 and self.candidates[0].seconds > 0 else None

    @property
    def speedup_vs_unfused(self) -> float | None:
        """Estimated speedup over the unfused spec (one library launch per op): secondary."""
        best = self.candidates[0].seconds
        return self.report.spec_estimate.seconds / best if best > 0 else None

    def _eager_text(self) -> str:
        eager = self.speedup_eager
        return "no speedup" if eager is None else f"{eager:.2f}x"

    def summary(self) -> str:
        best = self.candidates[0]
        roof = self.report.roofline.seconds
        lines = [str(self.report), "", f"winner: {best.structure}"]
        if best.seconds > 0 and roof > 0:
            lines += [f"  estimated {best.seconds * 1e6:.2f} us on {self.report.target} "
                      f"(roofline bound {roof * 1e6:.2f} us, {best.seconds / roof:.2f}x the bound)",
                      f"  estimated speedup {self.speedup:.2f}x against the XLA-like baseline "
                      f"{self.xla_estimate.seconds * 1e6:.2f} us (what jax.jit would launch: "
                      f"{self.xla_estimate.launches} fused kernels; search/baseline.py), both sides "
                      f"launched as jax.jit launches them (from C++, command buffers for runs of "
                      f"{get_target(self.report.target).command_buffer_min_kernels}+ kernels)",
                      f"  {self._eager_text()} with eager launches from Python "
                      f"({get_target(self.report.target).launch_s * 1e6:g} us per kernel; a second "
                      f"figure, not what jax.jit pays)",
                      f"  {self.speedup_vs_unfused:.2f}x against the unfused program "
                      f"{self.report.spec_estimate.seconds * 1e6:.2f} us "
                      f"({self.report.spec_estimate.launches} launches, one per op)"]
        else:
            lines.append(f"  the cost model counts no work: the outputs are inputs or constants "
                         f"(estimated {best.seconds * 1e6:.2f} us on {self.report.target}; no "
                         f"speedup to report)")
        if self.report.verification is not None:
            lines.append("  verification: " + str(self.report.verification).replace("\n", "\n    "))
        return "\n".join(lines)
