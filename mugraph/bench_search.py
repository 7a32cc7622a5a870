"""`mugraph bench search`: the search on the workload suite and the generality suite at full shape.

Each row: fused or not, structure, estimate against the XLA-like baseline and the unfused
program, time to the winner and to the stop, stop reason, and what the final check ran on
(rows from mugraph.search.bench). Default config unless --budget / --workers override it.
"""
from __future__ import annotations

import argparse

SUITES = ("workloads", "generality", "all")


def cases(suite: str, names: list[str] | None = None):
    """[(name, spec)] and {name: hand-written reference} for a suite at full shapes."""
    from mugraph import generality, workloads
    out, refs = [], {}
    if suite in ("workloads", "all"):
        for name in workloads.names():
            if names is None or name in names:
                w = workloads.get(name)
                out.append((name, w.spec()))
                refs[name] = w.reference()
    if suite in ("generality", "all"):
        for name in generality.names():
            if names is None or name in names:
                out.append((name, generality.get(name).spec()))
    return out, refs


def main(argv=None) -> int:
    from mugraph.ir.errors import InvalidInput
    from mugraph.search.bench import run_cases
    from mugraph.search.config import SearchConfig
    parser = argparse.ArgumentParser(prog="mugraph bench search", description=__doc__)
    parser.add_argument("--suite", choices=SUITES, default="all")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default all)")
    parser.add_argument("--budget", type=float, default=None, help="override the default budget")
    parser.add_argument("--workers", type=int, default=None, help="override the default workers")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    changes = {k: v for k, v in (("budget_seconds", args.budget), ("workers", args.workers))
               if v is not None}
    config = SearchConfig().replace(**changes)         # typed errors before any search
    names = args.cases.split(",") if args.cases else None
    chosen, refs = cases(args.suite, names)
    if names is not None and len(chosen) != len(set(names)):
        known = {n for n, _ in cases(args.suite)[0]}
        raise InvalidInput(f"unknown cases {sorted(set(names) - known)} in --cases",
                           hint=f"cases of --suite {args.suite}: {', '.join(sorted(known))}")
    run_cases(chosen, config, references=refs, json_path=args.json)
    return 0
