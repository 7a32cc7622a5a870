"""Special-value sweep: every bundled workload's kernels (the hand-written reference and the
committed search winner, re-sized to the small shapes) and the winner of every generality program
the search fuses, through `mugraph.testing.assert_kernel_matches` against `jax.jit(fn)` on
Hypothesis-drawn inputs with ±inf, NaN, masked rows, values near the dtype's limit and
subnormals — on the CPU harness (the emitted CUDA) and on the reference interpreter.

A row says "pass" or the first disagreement the kit found (elements where `jax.jit` itself is off
`fn` run in float64 are not compared: the kit's rule). Generality winners are searched once per
budget and kept under `--winners` (JSON), so a rerun does not search again.

    .venv/bin/python bench/specials.py [--examples 30] [--only workloads|generality]
                                       [--names a,b] [--budget 20] [--winners FILE] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import warnings

from hypothesis import HealthCheck, Phase, settings

from mugraph import generality, ir, workloads
from mugraph.ir.errors import MugraphError
from mugraph.testing import assert_kernel_matches

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("reference", "harness")
DEFAULT_WINNERS = Path("/tmp/mugraph-specials-winners.json")


def hypothesis_config(examples: int):
    """Derandomised, so a rerun draws the same inputs and the table is reproducible."""
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    phases=tuple(p for p in Phase if p is not Phase.explain),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(fn, graph, backend: str, examples: int) -> str:
    try:
        assert_kernel_matches(fn, graph, backend=backend, settings=hypothesis_config(examples))
    except AssertionError as e:
        return "FAIL: " + str(e)
    except MugraphError as e:
        return f"ERROR: {type(e).__name__}: {e}"
    return "pass"


# ---- the cases ---------------------------------------------------------------------------------
def searched_small(name: str):
    """The committed search winner of workload `name`, re-sized to its small shapes (and checked
    there, as the search's shape buckets do); None where no sizing verifies."""
    from mugraph.search.buckets import resize_winner
    w = workloads.get(name)
    path = ROOT / "kernels_generated" / name / "searched" / "graph.json"
    if not path.is_file():
        return None
    resized = resize_winner(w.spec(), ir.from_json(path.read_text()), w.small().spec(), "h100")
    return None if resized is None else resized.graph


def workload_cases(names):
    for name in names:
        w = workloads.get(name).small()
        yield f"{name}/reference", w.fn, lambda w=w: w.reference()
        yield f"{name}/searched", w.fn, lambda name=name: searched_small(name)


def generality_winner(name: str, budget: float, store: Path):
    """The search's winner for the program at its small shapes (kept in `store`), or None when
    the winner is the unfused spec."""
    kept = json.loads(store.read_text()) if store.is_file() else {}
    key = f"{name}@{budget:g}"
    if key not in kept:
        from mugraph.search import SearchConfig, search
        spec = generality.get(name).small().spec()
        result = search(spec, SearchConfig(budget_seconds=budget), progress=lambda *a: None)
        fused = result.best_candidate.origin == "search" and result.best.custom_ops()
        kept[key] = ir.to_json(result.best) if fused else None
        store.write_text(json.dumps(kept))
    return None if kept[key] is None else ir.from_json(kept[key])


def generality_cases(names, budget: float, store: Path):
    for name in names:
        p = generality.get(name).small()
        yield f"{name}/winner", p.fn, lambda name=name: generality_winner(name, budget, store)


# ---- the table ---------------------------------------------------------------------------------
def row(label, fn, build, examples: int) -> dict:
    start = time.perf_counter()
    try:
        graph = build()
    except MugraphError as e:
        return dict(case=label, skipped=f"{type(e).__name__}: {e}")
    if graph is None:
        return dict(case=label, skipped="not fused / no graph at the small shapes")
    out = dict(case=label)
    for backend in BACKENDS:
        out[backend] = outcome(fn, graph, backend, examples)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def short(text: str) -> str:
    return text.splitlines()[0][:110]


def print_row(r: dict) -> None:
    if "skipped" in r:
        print(f"{r['case']:40} skipped: {r['skipped']}", flush=True)
        return
    cells = " | ".join(f"{b}: {short(r[b])}" for b in BACKENDS)
    print(f"{r['case']:40} {cells}  ({r['seconds']}s)", flush=True)
    for b in BACKENDS:
        if r[b] != "pass":
            print("\n".join("      " + line for line in r[b].splitlines()[1:]), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=30, help="Hypothesis examples per case")
    p.add_argument("--only", choices=("workloads", "generality"), default=None)
    p.add_argument("--names", default=None, help="comma-separated workloads / programs")
    p.add_argument("--budget", type=float, default=20.0, help="search seconds per program")
    p.add_argument("--winners", default=str(DEFAULT_WINNERS), help="where searched winners are kept")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)   # NaN and inf are the point here
    wanted = args.names.split(",") if args.names else None
    cases = []
    if args.only != "generality":
        cases += workload_cases([n for n in workloads.names() if not wanted or n in wanted])
    if args.only != "workloads":
        cases += generality_cases([n for n in generality.names() if not wanted or n in wanted],
                                  args.budget, Path(args.winners))
    rows = []
    for label, fn, build in cases:
        rows.append(row(label, fn, build, args.examples))
        print_row(rows[-1])
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    ran = [r for r in rows if "skipped" not in r]
    bad = [r["case"] for r in ran if any(r[b] != "pass" for b in BACKENDS)]
    print(f"{len(ran)} kernels run, {len(rows) - len(ran)} skipped, {len(bad)} disagree with "
          f"jax.jit: {', '.join(bad) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
