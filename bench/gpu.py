"""GPU benchmark: each workload's generated kernel (of its fused μGraph) against jax.jit of its JAX function.

    python bench/gpu.py [--workloads rmsnorm_linear,gqa] [--iters 200] [--repeats 5] [--json results.json]

Per workload: mugraph's bound launches timed with CUDA events over back-to-back launches, the same launches
replayed from a CUDA graph, jax.jit timed by the host clock between synchronisations, the speedups, the
roofline bound of the spec (mugraph.search.cost.roofline) as a fraction of the measured time, and the largest
difference from JAX's output. Each figure is the median of --repeats runs of --iters launches after a warm-up.
Input sets rotate so that together they overflow the L2 cache (--sets 1 turns that off). Without a GPU it says
so and exits 0; without JAX on the GPU it times mugraph alone.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to CuPy as well

import numpy as np  # noqa: E402

from mugraph import workloads  # noqa: E402
from mugraph.codegen.runtime_cupy import capture, device_name, gpu_available, load_kernel  # noqa: E402

WARMUP = 10


@dataclass
class Row:
    workload: str
    mugraph_us: float | None = None
    graph_us: float | None = None
    jax_us: float | None = None
    roofline_us: float | None = None
    roofline_graph_us: float | None = None
    max_error_vs_jax: float | None = None
    input_sets: int = 1
    loader: str = ""
    error: str = ""

    def speedup(self, ours: float | None) -> float | None:
        return self.jax_us / ours if self.jax_us and ours else None


# ---- timing --------------------------------------------------------------------------------------------------------

def time_events(step, iters: int, repeats: int) -> float:
    """Median microseconds per call of ``step`` over ``repeats`` runs of ``iters`` calls, by CUDA events."""
    import cupy
    for _ in range(WARMUP):
        step()
    cupy.cuda.get_current_stream().synchronize()
    runs = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / iters)
    return statistics.median(runs)


def time_host(step, sync, iters: int, repeats: int) -> float:
    """Median microseconds per call by the host clock, synchronising before and after (JAX has its own streams)."""
    for _ in range(WARMUP):
        step()
    sync()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        runs.append((time.perf_counter() - start) * 1e6 / iters)
    return statistics.median(runs)


def cycling(items):
    it = itertools.cycle(items)
    return lambda: next(it)


# ---- the contenders ------------------------------------------------------------------------------------------------

def input_sets(w, want: int) -> list[list[np.ndarray]]:
    return [w.random_inputs(seed) for seed in range(want)]


def sets_needed(w, l2_bytes: int, limit: int) -> int:
    """Enough input sets that one round of them is twice the L2, so launches read device memory, not cache."""
    per_set = sum(int(np.prod(shape)) * w.dtype.itemsize for shape in w.shapes.values())
    return max(1, min(limit, math.ceil(2 * l2_bytes / per_set)))


def time_mugraph(w, sets, args, row: Row) -> list:
    import cupy
    kernel = load_kernel(w.reference())
    bound = [kernel.bind(*[cupy.asarray(a) for a in arrays]) for arrays in sets]
    row.loader = kernel.loader() or ""
    next_bound = cycling(bound)
    row.mugraph_us = time_events(lambda: next_bound().launch(), args.iters, args.repeats)
    graph = capture(bound, repeat=max(1, args.iters // len(bound)))
    row.graph_us = time_events(graph.replay, 1, args.repeats) / graph.launches
    return [cupy.asnumpy(o) for o in bound[0].launch()]


def jax_on_gpu():
    """The jax module if it runs on a GPU here, else a string saying why not."""
    try:
        import jax
        platform = jax.devices()[0].platform
    except Exception as e:
        return f"JAX unavailable ({type(e).__name__}: {e})"
    return jax if platform == "gpu" else f"JAX runs on {platform}, not the GPU"


def time_jax(jax, w, sets, args, row: Row) -> list:
    fn = jax.jit(w.fn)
    device_sets = [[jax.device_put(a) for a in arrays] for arrays in sets]
    next_set, last = cycling(device_sets), [None]

    def step():
        last[0] = fn(*next_set())

    # JAX runs its launches in order, so the last output being ready means all of them are
    row.jax_us = time_host(step, lambda: jax.block_until_ready(last[0]), args.iters, args.repeats)
    out = fn(*device_sets[0])
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def roofline_us(w, target: str, cuda_graph: bool) -> float | None:
    try:
        from mugraph.search.cost import roofline
        return roofline(w.spec(), target, cuda_graph=cuda_graph).seconds * 1e6
    except Exception as e:  # the cost model is optional here: the timings stand without it
        print(f"  roofline unavailable for {w.name}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def max_error(ours: list, theirs: list) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs):
        b64 = np.asarray(b, np.float64)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b64).max() / max(np.abs(b64).max(), 1e-30)))
    return worst


def bench(name: str, args, jax, target: str, l2_bytes: int) -> Row:
    w, row = workloads.get(name), Row(name)
    try:
        row.input_sets = sets_needed(w, l2_bytes, args.sets)
        sets = input_sets(w, row.input_sets)
        ours = time_mugraph(w, sets, args, row)
        if not isinstance(jax, str):
            row.max_error_vs_jax = max_error(ours, time_jax(jax, w, sets, args, row))
        row.roofline_us = roofline_us(w, target, cuda_graph=False)
        row.roofline_graph_us = roofline_us(w, target, cuda_graph=True)
    except Exception as e:
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    return row


# ---- the report ----------------------------------------------------------------------------------------------------

def _num(value: float | None, fmt: str, width: int, suffix: str = "") -> str:
    return ("n/a" if value is None else format(value, fmt) + suffix).rjust(width)


def _fraction(bound: float | None, measured: float | None, width: int) -> str:
    return ("n/a" if not bound or not measured else f"{100 * bound / measured:.0f}%").rjust(width)


COLUMNS = [("workload", 15), ("mugraph µs", 10), ("graph µs", 9), ("jax.jit µs", 10), ("speedup", 8),
           ("(graph)", 8), ("roof µs", 8), ("%roof", 6), ("%roof(g)", 8), ("err vs jax", 10), ("sets", 4)]
HEADER = " ".join(title.ljust(w) if i == 0 else title.rjust(w) for i, (title, w) in enumerate(COLUMNS)) + "  loader"


def format_row(r: Row) -> str:
    if r.error:
        return f"{r.workload:<15} FAILED: {r.error}"
    cells = [r.workload.ljust(15), _num(r.mugraph_us, ".2f", 10), _num(r.graph_us, ".2f", 9),
             _num(r.jax_us, ".2f", 10), _num(r.speedup(r.mugraph_us), ".2f", 8, "x"),
             _num(r.speedup(r.graph_us), ".2f", 8, "x"), _num(r.roofline_us, ".2f", 8),
             _fraction(r.roofline_us, r.mugraph_us, 6), _fraction(r.roofline_graph_us, r.graph_us, 8),
             _num(r.max_error_vs_jax, ".1e", 10), str(r.input_sets).rjust(4)]
    return " ".join(cells) + f"  {r.loader}"


def roofline_target(name: str) -> str:
    """The cost model's GPU for a device name: h200, h100 or a100 (h100 for anything else)."""
    lowered = name.lower()
    return next((t for t in ("h200", "h100", "a100") if t in lowered), "h100")


def device_summary() -> tuple[str, int]:
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return device_name(), int(props.get("l2CacheSize", 50 * 2**20))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--iters", type=int, default=200, help="launches per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--sets", type=int, default=8, help="at most this many rotating input sets")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not gpu_available():
        print("bench/gpu.py: no CUDA device (cupy.cuda.is_available() is False): nothing to time here. Run it on "
              "a GPU machine, e.g. through bench/gpu_check.sh; bench/verify.py and the CPU harness need none.")
        return 0
    import cupy
    name, l2_bytes = device_summary()
    target, jax = roofline_target(name), jax_on_gpu()
    print(f"device: {name} (L2 {l2_bytes / 2**20:.0f} MiB; roofline target {target}); CuPy {cupy.__version__}; "
          f"baseline: {jax if isinstance(jax, str) else 'jax ' + jax.__version__ + ' jit'}", flush=True)
    rows = [bench(n.strip(), args, jax, target, l2_bytes) for n in args.workloads.split(",") if n.strip()]
    print(f"\n{args.iters} launches x {args.repeats} runs, medians\n{HEADER}")
    print("\n".join(format_row(r) for r in rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "target": target, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
