"""The search benchmark's rows: the search on a list of (name, spec) cases, one row per case.

Per case: fused or not, the winner's structure, its estimate against the XLA-like baseline (what
`jax.jit` would launch, search/baseline.py, both sides charged the launches jax.jit pays: the
headline) and the unfused program, the same speedup with eager Python launches (last, secondary), the time to
the winner and to the stop, the stop reason, and what the check at the real shapes ran on. The
cases come from the caller (`mugraph bench search` passes the workload and generality suites):
nothing here knows a suite.
"""
from __future__ import annotations

import json
import time

from mugraph.search.config import SearchConfig

HEADER = ("case", "fused", "stop", "winner at s", "stop at s", "call s", "states", "winner us",
          "xla-like us", "unfused us", "vs xla-like", "vs unfused", "reference us", "structure",
          "check", "vs xla-like, eager launches")


def run_case(name: str, spec, config: SearchConfig, reference=None) -> dict:
    """Search one case and measure it; `reference` is an optional hand-written μGraph."""
    from mugraph.search import search
    from mugraph.search.baseline import xla_estimate
    from mugraph.search.cost import estimate
    started = time.monotonic()
    try:
        result = search(spec, config, progress=lambda *a: None)
    except Exception as e:                 # one failing case is a row, not the end of the run
        return {"case": name, "error": f"{type(e).__name__}: {e}"[:200],
                "call_s": time.monotonic() - started}
    rep, best = result.report, result.best_candidate
    xla = xla_estimate(spec, config.target).seconds
    return {
        "case": name, "fused": bool(best.graph.custom_ops()), "stop": rep.stop_reason,
        "winner_s": rep.best_found_seconds, "stop_s": rep.search_seconds,
        "call_s": time.monotonic() - started, "states": rep.states,
        "winner_us": best.seconds * 1e6, "xla_us": xla * 1e6,
        "unfused_us": rep.spec_estimate.seconds * 1e6, "vs_xla": xla / best.seconds,
        "vs_unfused": rep.spec_estimate.seconds / best.seconds,
        "reference_us": None if reference is None else estimate(reference, config.target).seconds * 1e6,
        "structure": best.structure, "check": rep.final_check or "none needed (the spec itself)",
        "equivalent": bool(rep.verification.equivalent), "vs_xla_eager": result.speedup_eager}


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['case']} | ERROR after {r['call_s']:.1f} s: {r['error']}"
    found = "-" if r["winner_s"] is None else f"{r['winner_s']:.1f}"
    ref = "-" if r["reference_us"] is None else f"{r['reference_us']:.2f}"
    cells = (r["case"], "yes" if r["fused"] else "no", r["stop"], found, f"{r['stop_s']:.1f}",
             f"{r['call_s']:.1f}", str(r["states"]), f"{r['winner_us']:.2f}",
             f"{r['xla_us']:.2f}", f"{r['unfused_us']:.2f}", f"{r['vs_xla']:.2f}x",
             f"{r['vs_unfused']:.2f}x", ref, r["structure"], r["check"],
             "-" if r.get("vs_xla_eager") is None else f"{r['vs_xla_eager']:.2f}x")
    return " | ".join(cells)


def summary(rows: list[dict]) -> str:
    ok = [r for r in rows if "error" not in r]
    fused_faster = [r for r in ok if r["fused"] and r["vs_xla"] > 1.0]
    exhausted = [r for r in ok if r["stop"] == "exhausted"]
    return (f"{len(rows)} cases: {len(fused_faster)} fused with an estimate better than the "
            f"XLA-like baseline, {len(exhausted)} exhausted, "
            f"{len(rows) - len(ok)} failed")


def run_cases(cases, config: SearchConfig, *, references=None, out=print,
              json_path: str | None = None) -> list[dict]:
    """Search every (name, spec) case, printing each row as it finishes."""
    references = references or {}
    out(f"config: {config.to_json()}")
    out(" | ".join(HEADER))
    rows = []
    for name, spec in cases:
        rows.append(run_case(name, spec, config, references.get(name)))
        out(format_row(rows[-1]))
        if json_path:
            with open(json_path, "w") as f:
                json.dump(rows, f, indent=1)
    out(summary(rows))
    return rows
