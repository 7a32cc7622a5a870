"""Memory benchmark: the issue's large programs, each in a fresh process under an address-space
limit (RLIMIT_AS), with no cache; prints what each call ended with (a kernel, the spec, or a
typed error), its wall time and the process's peak resident memory.

    .venv/bin/python bench/memory.py [--cases relu_matmul_65536,check_16384] [--limit-gb 10]

Cases: `relu(x) @ w` at 65536^2 fp16 searched with a 20 s budget (sizing once built a 16 GB index
array per 2^31-element tile: 23.5 GB and an OOM kill); the same at 16384^2 with 60 s; and
`verify.check` of that program against itself at 16384^2 (the full-shape finite-field test once
ended in a raw NumPy MemoryError).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_ONE_RUN = """
import json, resource, sys, time
limit = int(float(sys.argv[1]) * 2**30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import jax, jax.numpy as jnp, mugraph
from mugraph import ir, verify
from mugraph.errors import MugraphError
case, n, budget = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
args = [jax.ShapeDtypeStruct((n, n), jnp.float16)] * 2
fn = lambda x, w: jax.nn.relu(x) @ w
start = time.perf_counter()
try:
    if case == "check":
        spec = ir.from_jax(fn, *args)
        outcome = str(verify.check(spec, spec, seed=0)).splitlines()[0]
    else:
        kernel = mugraph.superoptimize(fn, *args, budget_seconds=budget, progress=False, cache=False)
        best = kernel.result.best_candidate
        outcome = f"{best.origin}: {best.structure}; check: {kernel.report.final_check or 'none'}"
except MugraphError as e:
    outcome = f"{type(e).__name__}: {str(e).splitlines()[0]}"
except MemoryError as e:
    outcome = f"raw MemoryError: {e}"
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - start, "peak_gb": peak}))
"""

CASES = {"relu_matmul_65536": ("search", 65536, 20.0), "relu_matmul_16384": ("search", 16384, 60.0),
         "check_16384": ("check", 16384, 0.0)}


def run(case: str, limit_gb: float) -> dict:
    kind, n, budget = CASES[case]
    with tempfile.TemporaryDirectory() as folder:
        out = subprocess.run([sys.executable, "-c", _ONE_RUN, str(limit_gb), kind, str(n), str(budget)],
                             capture_output=True, text=True, timeout=900,
                             env=dict(os.environ, MUGRAPH_CACHE_DIR=folder, MUGRAPH_PROGRESS="0"))
    if out.returncode != 0:
        return {"outcome": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}",
                "seconds": float("nan"), "peak_gb": float("nan")}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--limit-gb", type=float, default=10.0, help="RLIMIT_AS of each run")
    args = parser.parse_args(argv)
    print(f"| case | address-space limit | outcome | wall s | peak RSS GB |\n|---|---|---|---|---|")
    for case in args.cases.split(","):
        r = run(case, args.limit_gb)
        print(f"| {case} | {args.limit_gb:g} GB | {r['outcome']} | {r['seconds']:.1f} | "
              f"{r['peak_gb']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
