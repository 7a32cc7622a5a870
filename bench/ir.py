"""IR benchmark: per workload at full shape, the time to trace the JAX function into a kernel
graph and to run the spec and the hand-written fused μGraph with the reference interpreter.

    .venv/bin/python bench/ir.py [--workloads a,b] [--repeat 3]

Prints one row per workload (best of --repeat runs, seconds). The interpreter runs float64
literally: every block of the grid, every loop iteration (vectorised across the grid only).
"""
from __future__ import annotations

import argparse
import time


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None) -> int:
    from mugraph import ir, workloads
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print("workload | trace s (first, in this process) | trace s (again: JAX's trace cache) | "
          "interpret spec s | interpret fused s | fused blocks x iterations")
    for name in args.workloads.split(","):
        w = workloads.get(name)
        first = best_of(1, w.spec)                 # includes JAX's own tracing
        trace = best_of(args.repeat, w.spec)
        spec, ref = w.spec(), w.reference()
        arrays = w.random_inputs(0)
        run_spec = best_of(args.repeat, lambda: ir.interpret(spec, arrays))
        run_ref = best_of(args.repeat, lambda: ir.interpret(ref, arrays))
        work = ", ".join(f"{bg.grid[0] * bg.grid[1] * bg.grid[2]}x{bg.forloop}"
                         for bg, _ in ref.custom_ops())
        print(f"{name} | {first:.3f} | {trace:.4f} | {run_spec:.3f} | {run_ref:.3f} | {work}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
