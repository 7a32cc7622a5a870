"""Result-cache benchmark: the same search twice, each time in a fresh process (the way a user
runs it again), against an empty cache folder; prints the first (search) and second (cache hit)
wall time of `superoptimize` (tracing excluded) and of the whole command.

    .venv/bin/python bench/cache.py [--workloads rmsnorm_linear,gated_mlp] [--budget 30]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_ONE_RUN = """
import json, sys, time
import mugraph
from mugraph import workloads
from mugraph.search import SearchConfig
w = workloads.get(sys.argv[1])
spec = w.spec()
config = SearchConfig(budget_seconds=float(sys.argv[2]))
start = time.perf_counter()
kernel = mugraph.superoptimize(spec, config=config, progress=lambda *a: None)
print(json.dumps({"seconds": time.perf_counter() - start, "origin": kernel.origin}))
"""


def one_run(workload: str, budget: float, folder: str) -> tuple[dict, float]:
    env = dict(os.environ, MUGRAPH_CACHE_DIR=folder, MUGRAPH_PROGRESS="0")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _ONE_RUN, workload, str(budget)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="rmsnorm_linear,gated_mlp,lora")
    parser.add_argument("--budget", type=float, default=30.0)
    args = parser.parse_args(argv)
    print(f"{'workload':<16} {'first (search)':>15} {'second (cache)':>15} {'process 1st/2nd':>16}")
    for name in args.workloads.split(","):
        with tempfile.TemporaryDirectory(prefix="mugraph-bench-cache-") as folder:
            first, first_wall = one_run(name, args.budget, folder)
            second, second_wall = one_run(name, args.budget, folder)
        assert second["origin"].startswith("from cache"), second["origin"]
        print(f"{name:<16} {first['seconds']:>13.2f} s {second['seconds']:>13.3f} s "
              f"{first_wall:>7.1f}/{second_wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
