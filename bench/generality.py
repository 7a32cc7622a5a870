"""Generality benchmark: the search on every program of the generality suite (mugraph/generality.py).

One row per program: lifted (or the front end's error), fused (custom kernels, library kernels
left), the winner's structure, its estimate against the XLA-like baseline (what jax.jit would
launch, search/baseline.py) and the unfused program, the verdict of the check at the real shapes,
time to the winner, time to stop and the stop reason; then a summary line.

    .venv/bin/python bench/generality.py [--small] [--budget S] [--workers N] [--programs a,b]
                                         [--target h100] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys

from mugraph import generality
from mugraph.errors import MugraphError
from mugraph.search import SearchConfig

HEADER = ("program", "dtype", "lifted", "fused", "winner us", "XLA-like us", "vs XLA",
          "unfused us", "vs unfused", "verified", "winner at s", "stop at s", "stop", "structure")


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _fused(o: generality.Outcome) -> str:
    if not o.lifted or o.search_error:
        return "-"
    if not o.fused:
        return "no (spec)"
    left = f", {len(o.library_ops)} library" if o.library_ops else ""
    return f"yes ({o.custom_kernels} custom{left})"


def _verdict(o: generality.Outcome) -> str:
    if o.search_error:
        return o.search_error
    return "-" if o.verdict is None else o.verdict


def row(o: generality.Outcome) -> tuple:
    lifted = "yes" if o.lifted else f"no: {o.lift_error.splitlines()[0]}"
    return (o.program, o.dtype, lifted, _fused(o), _num(o.winner_us, ".2f"), _num(o.xla_us, ".2f"),
            _num(o.speedup, ".2f") + ("x" if o.speedup else ""), _num(o.unfused_us, ".2f"),
            _num(o.speedup_vs_unfused, ".2f") + ("x" if o.speedup_vs_unfused else ""),
            _verdict(o), _num(o.best_found_s, ".1f"), _num(o.search_s, ".1f"),
            o.stop_reason or "-", o.structure or "-")


def summary(outcomes: list) -> str:
    n = len(outcomes)
    lifted = sum(o.lifted for o in outcomes)
    fused = sum(o.fused for o in outcomes)
    good = sum(o.fused and o.equivalent and o.beats_xla for o in outcomes)
    return (f"{n} programs: {lifted} lifted, {fused} fused, {good} fused + EQUIVALENT + estimated "
            f"faster than the XLA-like baseline ({100 * good / max(n, 1):.0f}%; target >= 90%)")


def _config(args) -> SearchConfig:
    config = SearchConfig(target=args.target)
    if args.budget is not None:
        config = config.replace(budget_seconds=args.budget)
    if args.workers is not None:
        config = config.replace(workers=args.workers)
    return config


def _programs(args) -> list:
    names = args.programs.split(",") if args.programs else generality.names()
    programs = [generality.get(n) for n in names]
    return [p.small() for p in programs] if args.small else programs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="the programs at their small shapes")
    p.add_argument("--budget", type=float, default=None, help="search seconds per program "
                   "(default: SearchConfig's)")
    p.add_argument("--workers", type=int, default=None, help="search workers (default: "
                   "SearchConfig's)")
    p.add_argument("--programs", default=None, help="comma-separated subset")
    p.add_argument("--target", default="h100", choices=("a100", "h100", "h200"))
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args(argv)
    try:   # arguments are checked before any search runs
        config, programs = _config(args), _programs(args)
    except MugraphError as e:
        p.error(str(e))
    print(f"config: {config.to_json()}  shapes: {'small' if args.small else 'full'}")
    print(" | ".join(HEADER))
    outcomes = []
    for program in programs:
        outcomes.append(generality.evaluate(program, config))
        print(" | ".join(row(outcomes[-1])), flush=True)
        if args.json:   # written as it goes, so an interrupted run keeps its rows
            with open(args.json, "w") as f:
                json.dump([o.to_dict() for o in outcomes], f, indent=1)
    print(summary(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
