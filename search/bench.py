"""`mugraph bench search`: the search on every workload at full shape, with the default config.

Prints per workload: wall time (and when the winner was found), stop reason, states, pruned,
verified, the winner's structure, its estimate, the unfused spec's estimate, the hand-written
reference's estimate and the roofline bound, all under the same cost model.
"""
from __future__ import annotations

import argparse
import json
import time

from mugraph.search.config import SearchConfig

HEADER = ("workload", "wall s", "best found at s (states)", "stop", "states", "pruned", "verified", "winner us",
          "spec us", "reference us", "roofline us", "winner/ref", "structure")


def run_one(name: str, config: SearchConfig) -> dict:
    from mugraph import workloads
    from mugraph.search import search
    from mugraph.search.cost import estimate
    w = workloads.get(name)
    started = time.monotonic()
    result = search(w.spec(), config)
    wall = time.monotonic() - started
    rep = result.report
    ref = estimate(w.reference(), config.target).seconds
    best = result.best_candidate
    return {"workload": name, "wall_s": wall, "best_found_s": rep.best_found_seconds,
            "best_found_states": rep.best_found_states,
            "stop": rep.stop_reason, "states": rep.states, "pruned": sum(rep.pruned.values()),
            "verified": rep.verified, "winner_us": best.seconds * 1e6,
            "spec_us": rep.spec_estimate.seconds * 1e6, "reference_us": ref * 1e6,
            "roofline_us": rep.roofline.seconds * 1e6, "winner_over_reference": best.seconds / ref,
            "structure": best.structure, "equivalent": rep.verification.equivalent}


def _row(r: dict) -> tuple:
    found = (f"{r['best_found_s']:.1f} ({r['best_found_states']} states)"
             if r["best_found_s"] is not None else "-")
    return (r["workload"], f"{r['wall_s']:.1f}", found, r["stop"], str(r["states"]),
            str(r["pruned"]), str(r["verified"]), f"{r['winner_us']:.2f}", f"{r['spec_us']:.2f}",
            f"{r['reference_us']:.2f}", f"{r['roofline_us']:.2f}",
            f"{r['winner_over_reference']:.2f}", r["structure"])


def main(argv=None) -> int:
    from mugraph import workloads
    parser = argparse.ArgumentParser(prog="mugraph bench search", description=__doc__)
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--budget", type=float, default=None, help="override the default budget")
    parser.add_argument("--workers", type=int, default=None, help="override the default workers")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    config = SearchConfig()
    if args.budget is not None:
        config = config.replace(budget_seconds=args.budget)
    if args.workers is not None:
        config = config.replace(workers=args.workers)
    print(f"config: {config.to_json()}")
    print(" | ".join(HEADER))
    rows = []
    for name in args.workloads.split(","):
        rows.append(run_one(name, config))
        print(" | ".join(_row(rows[-1])), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
