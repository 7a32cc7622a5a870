"""The workload suite's committed kernels: per workload the hand-written fused μGraph (``kernels_generated/<w>/``)
and the search's winner beside it (``kernels_generated/<w>/searched/``), each with its generated CUDA, launch
plan, compiler resources and CPU-harness result (``mugraph.codegen.regen`` renders the folders).

The winner comes from ``mugraph.search.search`` on the workload's spec with ``SEARCH_CONFIG`` (fixed seed; the
state budget, not the clock, ends it, so a rerun finds the same graph). ``regenerate(search=True)`` (``mugraph
regen --search``) runs the searches and writes ``searched/graph.json`` and ``searched/search.json`` (the config
and the search's report); every other run renders the committed winner again without searching.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from mugraph import ir
from mugraph import workloads as suite
from mugraph.codegen.regen import ARCHS, CPU_TOLERANCE, DEFAULT_ROOT, KernelCase, max_relative_error, \
    regenerate_cases
from mugraph.ir.errors import MugraphError

# One kernel per candidate (the fused kernels the suite is about) and a state budget that ends the search
# before the clock does on a 2-core machine; the seed fixes every random choice. The winners are searched for
# the H200, the GPU the shipped kernels are sized for (issue 17).
SEARCH_CONFIG = dict(max_kernel_ops=1, budget_seconds=3600.0, budget_states=400_000, seed=0, target="h200")
SAMPLE_PICKS = 1  # random blocks per kernel in the sampled full-shape check, beside the grid's corners


@dataclass(frozen=True)
class GraphSource:
    """Where each workload's committed graph comes from: a label for the reports and a builder. ``build`` may
    return None for a shape it has no graph for (the small-shape CPU check is then skipped)."""

    label: str
    build: Callable  # Workload -> KernelGraph | None


REFERENCE = GraphSource("the hand-written fused μGraph (`Workload.reference()`)", lambda w: w.reference())


def regenerate(root: str | Path | None = None, workloads: Iterable[str] | None = None,
               archs: Sequence[str] = ARCHS, check: bool = False, *, source: GraphSource = REFERENCE,
               search: bool = False, log: Callable[[str], None] | None = None) -> list[Path]:
    """Write every workload's folders (and, for the whole suite, the index) under ``root``; returns the files.

    ``root`` defaults to the repository's ``kernels_generated``. With ``check=True`` nothing is written and the
    result is the stale files: different, missing, or no longer produced. ``search=True`` reruns the searches.
    """
    root = Path(root) if root is not None else DEFAULT_ROOT
    log = log or (lambda line: None)
    names = list(workloads) if workloads is not None else suite.names()
    cases = {}
    for name in names:
        w = suite.get(name)
        cases[name] = reference_case(w, source)
        searched = searched_case(w, root / name / "searched", search and not check, log)
        if searched is not None:
            cases[f"{name}/searched"] = searched
    label = (f"One folder per workload: its graph as `graph.json` (from {source.label}), and in `searched/` the "
             "search's winner for the same program; each with its generated CUDA (`kernel.cu`, plus "
             "`kernel.<arch>.cu` where an arch's source differs) and `report.md` (launch plan, compiler "
             "resources, CPU-harness check).")
    return regenerate_cases(root, cases, archs, check, whole_suite=workloads is None, index_label=label, log=log)


# ---- the hand-written reference ------------------------------------------------------------------------------------

def reference_case(w, source: GraphSource) -> KernelCase:
    def check(log) -> str:
        return small_shape_check(w, source, log)
    return KernelCase(w.name, w.description, tuple(w.inputs), source.build(w), source.label, check)


def small_shape_check(w, source: GraphSource, log) -> str:
    """The generated CUDA of the small-shape graph on the CPU harness against the spec in float64."""
    from mugraph import codegen
    small = w.small()
    shapes = ", ".join(f"{n}{list(s)} {d.short}" for n, s, d in small.inputs)
    where = f"The generated CUDA at the small shapes ({shapes}), random inputs (seed 0), against the spec in float64"
    graph = source.build(small)
    if graph is None:
        return f"{where}: not run: no graph at the small shapes"
    arrays = small.random_inputs(seed=0)
    start = time.perf_counter()
    try:
        got = codegen.run_on_cpu(graph, arrays)
    except MugraphError as e:
        return f"{where}: FAIL: {type(e).__name__}: {str(e).splitlines()[0]}"
    log(f"{w.name}: CPU harness {time.perf_counter() - start:.2f}s")
    error = max_relative_error(got, ir.interpret(small.spec(), arrays))
    verdict = "pass" if error <= CPU_TOLERANCE else "FAIL"
    return f"{where}: {verdict}: max error {error:.1e} of the output scale (tolerance {CPU_TOLERANCE:.0e})"


# ---- the search's winner -------------------------------------------------------------------------------------------

def searched_case(w, folder: Path, search: bool, log) -> KernelCase | None:
    """The searched winner's case: searched now, or read back from ``folder``; None when there is none."""
    if search:
        graph, summary = run_search(w, log)
    elif (folder / "graph.json").is_file() and (folder / "search.json").is_file():
        graph = ir.from_json((folder / "graph.json").read_text(encoding="utf-8"))
        summary = json.loads((folder / "search.json").read_text(encoding="utf-8"))
    else:
        return None
    summary_text = json.dumps(summary, indent=1, sort_keys=True) + "\n"
    label = "the search's winner (`mugraph.search.search` on `Workload.spec()`, `search.json` says how)"

    def check(log) -> str:
        return sampled_check(w, graph, log)
    return KernelCase(f"{w.name} (searched)", w.description, tuple(w.inputs), graph, label, check,
                      extra=tuple(search_section(summary)), kept=(("search.json", summary_text),))


def run_search(w, log) -> tuple:
    from mugraph.search import SearchConfig, search
    config = SearchConfig(**SEARCH_CONFIG)
    start = time.perf_counter()
    result = search(w.spec(), config, progress=lambda *a: None)
    log(f"{w.name}: searched in {time.perf_counter() - start:.0f}s")
    return result.best, summarise(result, config)


def summarise(result, config) -> dict:
    """What search.json records: the config and the report's deterministic facts."""
    report = result.report
    out = {"config": dataclasses.asdict(config), "stop_reason": str(getattr(report, "stop_reason", ""))}
    for field in ("states", "block_graphs", "structures_found", "verified", "rejected", "pruned"):
        value = getattr(report, field, None)
        if isinstance(value, (int, float, dict)):
            out[field] = value
    verification = getattr(report, "verification", None)
    if verification is not None:
        out["equivalent"] = bool(getattr(verification, "equivalent", False))
    best = getattr(result, "best_candidate", None)
    if best is not None:
        out["winner"] = getattr(best, "structure", "") or ""
        out["estimate_us"] = round(best.seconds * 1e6, 3)
    spec_estimate = getattr(report, "spec_estimate", None)
    if spec_estimate is not None:
        out["spec_estimate_us"] = round(spec_estimate.seconds * 1e6, 3)
    return out


def search_section(summary: dict) -> list[str]:
    config = summary.get("config", {})
    lines = ["## Search", "",
             f"`mugraph.search.search` with seed {config.get('seed')}, a budget of {config.get('budget_states')} "
             f"states ({config.get('budget_seconds')} s at most), at most {config.get('max_kernel_ops')} kernel "
             f"op(s) per candidate, target {config.get('target')}: stop reason {summary.get('stop_reason')}."]
    facts = [f"{k.replace('_', ' ')} {summary[k]}" for k in ("states", "block_graphs", "structures_found",
                                                              "verified", "rejected") if k in summary]
    if facts:
        lines.append("Counts: " + ", ".join(facts) + ".")
    if "estimate_us" in summary:
        lines.append(f"The winner ({summary.get('winner') or 'see graph.json'}): {summary['estimate_us']} µs in the "
                     f"cost model at search time, the unfused spec {summary.get('spec_estimate_us')} µs; "
                     f"verified equivalent: {summary.get('equivalent')}.")
    return lines + [""]


def sampled_check(w, graph, log) -> str:
    """The full-shape kernels on the CPU harness, a sample of blocks each (codegen.sample)."""
    from mugraph.codegen.sample import run_sampled
    where = ("The generated CUDA at the full shapes on the CPU harness, sampled blocks (first, last, every grid "
             f"corner, {SAMPLE_PICKS} at random; seed 0) against the interpreter")
    if not any(n.op is ir.KOp.CUSTOM for n in graph.nodes):
        return f"{where}: not run: no custom kernels (library launches only)"
    start = time.perf_counter()
    try:
        checks = run_sampled(graph, w.random_inputs(0), picks=SAMPLE_PICKS)
    except MugraphError as e:
        return f"{where}: FAIL: {type(e).__name__}: {str(e).splitlines()[0]}"
    log(f"{w.name} (searched): sampled CPU harness {time.perf_counter() - start:.2f}s")
    error = max((c.max_error for c in checks), default=0.0)
    verdict = "pass" if error <= CPU_TOLERANCE else "FAIL"
    blocks = ", ".join(f"{c.name} {len(c.blocks)} of {c.grid[0] * c.grid[1] * c.grid[2]} blocks" for c in checks)
    return f"{where}: {verdict}: max error {error:.1e} of the output scale ({blocks}; tolerance {CPU_TOLERANCE:.0e})"
