"""Baselines benchmark: per workload at full shape, the unfused program and the XLA-like baseline (what
jax.jit would launch) under the cost model, the hand-written fused μGraph's estimate and its speedup over
each; then the float test's special-value cases and their time.

    .venv/bin/python bench/baseline.py [--workloads rmsnorm_linear,gqa] [--target h100] [--no-float]
"""
from __future__ import annotations

import argparse
import sys
import time

from mugraph import workloads
from mugraph.search.baseline import xla_estimate
from mugraph.search.cost import Launch, estimate
from mugraph.verify import float_diff
from mugraph.verify.float_diff import clear_cache


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:8.2f}"


def baselines(names, target: str) -> None:
    print(f"== estimates on {target} (µs; launches in brackets), launched as jax.jit launches them; "
          f"last column: the speedup with eager Python launches (4 µs each), a second figure ==")
    print(f"{'workload':16} {'unfused':>14} {'XLA-like':>14} {'fused ref':>10} "
          f"{'vs XLA-like':>11} {'vs unfused':>10} {'eager vs XLA-like':>17}")
    for name in names:
        w = workloads.get(name)
        spec, ref = w.spec(), w.reference()
        unfused, xla, fused = estimate(spec, target), xla_estimate(spec, target), estimate(ref, target)
        eager = xla_estimate(spec, target, launch=Launch.EAGER).seconds / \
            estimate(ref, target, launch=Launch.EAGER).seconds
        print(f"{name:16} {_us(unfused.seconds)} [{unfused.launches:2}] {_us(xla.seconds)} "
              f"[{xla.launches:2}] {_us(fused.seconds)}   {xla.seconds / fused.seconds:9.2f}x "
              f"{unfused.seconds / fused.seconds:9.2f}x {eager:16.2f}x")


def float_cases(names, seed: int) -> None:
    print("\n== float test at full shape: the fused reference against the spec ==")
    for name in names:
        w = workloads.get(name)
        spec, ref = w.spec(), w.reference()
        clear_cache()
        start = time.perf_counter()
        result = float_diff(spec, ref, seed=seed, scale=w.input_scale)
        seconds = time.perf_counter() - start
        skipped = [c.case for c in result.cases if c.skipped]
        print(f"{name:16} {'passed' if result.passed else 'FAILED':6} {seconds:6.2f}s  against "
              f"{result.reference}; cases {', '.join(result.special_cases)}"
              + (f"; skipped {', '.join(skipped)}" if skipped else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=None, help="comma-separated subset")
    p.add_argument("--target", default="h100", choices=("a100", "h100", "h200"))
    p.add_argument("--no-float", action="store_true", help="skip the float-test timings")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = args.workloads.split(",") if args.workloads else workloads.names()
    baselines(names, args.target)
    if not args.no_float:
        float_cases(names, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
