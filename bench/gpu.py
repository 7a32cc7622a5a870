"""GPU benchmark: each workload's generated kernels (the hand-written fused μGraph, and the search's winner where
`mugraph regen` shipped one) against jax.jit of its JAX function, beside the cost model's estimate.

    python bench/gpu.py --model                     # no GPU needed: the model's table (launch plans, bytes in
                                                    # flight per SM, estimate, roofline, fraction)
    python bench/gpu.py [--workloads a,b] [--reps 100] [--json out.json]   # on a GPU: the same table, measured
    python bench/gpu.py --calibrate [--json out.json]  # on a GPU: measure the calibration table's rates, write it

Timing (GPU): every figure is the median of --reps (>= 50) single launches, each timed by CUDA events after the
L2 cache was flushed (a 2x-L2 buffer written just before), after 10 warm-up launches. mugraph's launches are
also replayed back to back from a CUDA graph (the model's `graph` figure). jax.jit runs on its own stream, so
it is timed by the host clock around one synchronised call (its dispatch included; JAX has no event API),
with the same flush. The fraction of roofline is the spec's roofline (cost.roofline, CUDA-graph launch) over
the measured time. Without a GPU the timing modes say so and exit 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to CuPy as well

import numpy as np  # noqa: E402

from mugraph import ir, workloads  # noqa: E402
from mugraph.codegen.runtime_cupy import device_name, gpu_available, load_kernel  # noqa: E402

WARMUP = 10
MIN_REPS = 50
MODEL_TARGETS = ("h100", "h200")
SEARCHED = Path(__file__).resolve().parents[1] / "kernels_generated"


# ---- the model's table (no GPU) ------------------------------------------------------------------------------------

@dataclass
class ModelRow:
    workload: str
    graph: str                 # "reference" or "searched"
    target: str
    plan: str                  # per custom kernel: grid (x splits), stages
    inflight_kb_per_sm: float  # the busiest kernel's bytes in flight per SM
    estimate_us: float         # CUDA-graph launches (device time)
    roofline_us: float
    eager_estimate_us: float
    eager_roofline_us: float

    @property
    def fraction(self) -> float:
        return self.roofline_us / self.estimate_us if self.estimate_us else 0.0

    @property
    def eager_fraction(self) -> float:
        return self.eager_roofline_us / self.eager_estimate_us if self.eager_estimate_us else 0.0


def graphs_of(w) -> dict:
    """The graphs to time for workload ``w``: its reference, and the searched winner where one was shipped."""
    out = {"reference": w.reference()}
    path = SEARCHED / w.name / "searched" / "graph.json"
    if path.is_file():
        out["searched"] = ir.from_json(path.read_text())
    return out


def plan_text(est) -> str:
    """Per custom kernel: launch grid (/Ns: a loop split over N CTAs) and stages; library launches counted."""
    parts = []
    for k in est.kernels:
        if k.kind == "custom":
            split = f"/{k.splits}s" if k.splits > 1 else ""
            parts.append(f"{'x'.join(map(str, k.grid))}{split} st{k.stages}")
    library = sum(k.kind != "custom" for k in est.kernels)
    if library:
        parts.append(f"{library} library launch{'es' if library > 1 else ''}")
    return "; ".join(parts)


def model_rows(names, targets=MODEL_TARGETS) -> list[ModelRow]:
    from mugraph.search.cost import estimate, roofline
    rows = []
    for name in names:
        w = workloads.get(name)
        spec = w.spec()
        for label, graph in graphs_of(w).items():
            for t in targets:
                est, bound = estimate(graph, t, cuda_graph=True), roofline(spec, t, cuda_graph=True)
                eager, eager_bound = estimate(graph, t), roofline(spec, t)
                inflight = max((k.inflight_per_sm for k in est.kernels), default=0)
                rows.append(ModelRow(name, label, t, plan_text(est), inflight / 1024, est.seconds * 1e6,
                                     bound.seconds * 1e6, eager.seconds * 1e6, eager_bound.seconds * 1e6))
    return rows


MODEL_COLUMNS = [("workload", 15), ("graph", 9), ("target", 6), ("launch plan (grid/splits, stages)", 40),
                 ("KB/SM", 6), ("model µs", 9), ("roof µs", 8), ("%roof", 6), ("eager %", 7)]


def _line(cells) -> str:
    return " ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, (_, w)) in enumerate(zip(cells, MODEL_COLUMNS)))


def format_model(rows: list[ModelRow]) -> str:
    lines = [_line([title for title, _ in MODEL_COLUMNS])]
    for r in rows:
        lines.append(_line([r.workload, r.graph, r.target, r.plan, f"{r.inflight_kb_per_sm:.0f}",
                            f"{r.estimate_us:.2f}", f"{r.roofline_us:.2f}", f"{100 * r.fraction:.0f}%",
                            f"{100 * r.eager_fraction:.0f}%"]))
    return "\n".join(lines)


MODEL_NOTE = ("model: device time with CUDA-graph launches (1 launch gap per kernel); roofline: the spec's bytes at "
              "peak HBM bandwidth or its FLOPs at the tensor-core peak, plus one launch; KB/SM: bytes in flight per "
              "SM while the busiest kernel streams; eager %: the same with eager launches (4 µs each). Constants: "
              "codegen/calibration.json.")


# ---- measured rows (GPU) -------------------------------------------------------------------------------------------

@dataclass
class Row:
    workload: str
    graph: str = "reference"
    mugraph_us: float | None = None      # median single launch, L2 flushed
    graph_us: float | None = None        # CUDA-graph replay, back to back, per launch of the plan
    jax_us: float | None = None          # median single synchronised call, L2 flushed (dispatch included)
    roofline_us: float | None = None     # CUDA-graph launch
    model_us: float | None = None
    max_error_vs_jax: float | None = None
    loader: str = ""
    error: str = ""

    def speedup(self, ours: float | None) -> float | None:
        return self.jax_us / ours if self.jax_us and ours else None


class Flusher:
    """Writes a buffer twice the L2's size, so the next launch reads its inputs from device memory."""

    def __init__(self, l2_bytes: int):
        import cupy
        self.buf = cupy.empty(max(1, 2 * l2_bytes // 4), cupy.float32)

    def __call__(self) -> None:
        self.buf.fill(0.0)


def time_events(step, flush, reps: int) -> float:
    """Median microseconds of ``step`` over ``reps`` single launches, each after ``flush``, by CUDA events."""
    import cupy
    for _ in range(WARMUP):
        step()
    runs = []
    for _ in range(reps):
        flush()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        step()
        end.record()
        end.synchronize()
        runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(runs)


def time_host(step, sync, flush, reps: int) -> float:
    """Median microseconds of one synchronised ``step`` by the host clock, each after ``flush`` (for JAX)."""
    import cupy
    for _ in range(WARMUP):
        step()
    sync()
    runs = []
    for _ in range(reps):
        flush()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        step()
        sync()
        runs.append((time.perf_counter() - start) * 1e6)
    return statistics.median(runs)


def time_mugraph(graph, arrays, flush, reps: int, row: Row) -> list:
    import cupy
    from mugraph.codegen.runtime_cupy import capture
    kernel = load_kernel(graph)
    bound = kernel.bind(*[cupy.asarray(a) for a in arrays])
    row.loader = kernel.loader() or ""
    row.mugraph_us = time_events(bound.launch, flush, reps)
    replay = capture([bound], repeat=20)
    for _ in range(3):
        replay.replay()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    replay.replay()
    end.record()
    end.synchronize()
    row.graph_us = cupy.cuda.get_elapsed_time(start, end) * 1e3 / replay.launches
    return [cupy.asnumpy(o) for o in bound.launch()]


def jax_on_gpu():
    """The jax module if it runs on a GPU here, else a string saying why not."""
    try:
        import jax
        platform = jax.devices()[0].platform
    except Exception as e:
        return f"JAX unavailable ({type(e).__name__}: {e})"
    return jax if platform == "gpu" else f"JAX runs on {platform}, not the GPU"


def time_jax(jax, w, arrays, flush, reps: int, row: Row) -> list:
    fn = jax.jit(w.fn)
    args = [jax.device_put(a) for a in arrays]
    last = [None]

    def step():
        last[0] = fn(*args)
    row.jax_us = time_host(step, lambda: jax.block_until_ready(last[0]), flush, reps)
    out = fn(*args)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def max_error(ours: list, theirs: list) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs):
        b64 = np.asarray(b, np.float64)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b64).max() / max(np.abs(b64).max(), 1e-30)))
    return worst


def bench(name: str, args, jax, target: str, flush) -> list[Row]:
    from mugraph.search.cost import estimate, roofline
    w = workloads.get(name)
    arrays = w.random_inputs(0)
    theirs, rows = None, []
    for label, graph in graphs_of(w).items():
        row = Row(name, label)
        try:
            ours = time_mugraph(graph, arrays, flush, args.reps, row)
            if not isinstance(jax, str):
                if theirs is None:
                    jrow = Row(name)
                    theirs = time_jax(jax, w, arrays, flush, args.reps, jrow)
                    jax_us = jrow.jax_us
                row.jax_us = jax_us
                row.max_error_vs_jax = max_error(ours, theirs)
            row.roofline_us = roofline(w.spec(), target, cuda_graph=True).seconds * 1e6
            row.model_us = estimate(graph, target, cuda_graph=True).seconds * 1e6
        except Exception as e:
            row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            traceback.print_exc()
        rows.append(row)
    return rows


def _num(value: float | None, fmt: str, width: int, suffix: str = "") -> str:
    return ("n/a" if value is None else format(value, fmt) + suffix).rjust(width)


def _fraction(bound: float | None, measured: float | None, width: int) -> str:
    return ("n/a" if not bound or not measured else f"{100 * bound / measured:.0f}%").rjust(width)


COLUMNS = [("workload", 15), ("graph", 9), ("mugraph µs", 10), ("graph µs", 9), ("jax.jit µs", 10),
           ("speedup", 8), ("(graph)", 8), ("model µs", 9), ("roof µs", 8), ("%roof(g)", 8), ("err vs jax", 10)]
HEADER = " ".join(title.ljust(w) if i < 2 else title.rjust(w) for i, (title, w) in enumerate(COLUMNS)) + "  loader"


def format_row(r: Row) -> str:
    if r.error:
        return f"{r.workload:<15} {r.graph:<9} FAILED: {r.error}"
    cells = [r.workload.ljust(15), r.graph.ljust(9), _num(r.mugraph_us, ".2f", 10), _num(r.graph_us, ".2f", 9),
             _num(r.jax_us, ".2f", 10), _num(r.speedup(r.mugraph_us), ".2f", 8, "x"),
             _num(r.speedup(r.graph_us), ".2f", 8, "x"), _num(r.model_us, ".2f", 9), _num(r.roofline_us, ".2f", 8),
             _fraction(r.roofline_us, r.graph_us, 8), _num(r.max_error_vs_jax, ".1e", 10)]
    return " ".join(cells) + f"  {r.loader}"


def roofline_target(name: str) -> str:
    """The cost model's GPU for a device name: h200, h100 or a100 (h100 for anything else)."""
    lowered = name.lower()
    return next((t for t in ("h200", "h100", "a100") if t in lowered), "h100")


def device_summary() -> tuple[str, int]:
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return device_name(), int(props.get("l2CacheSize", 50 * 2**20))


# ---- calibration (GPU) ---------------------------------------------------------------------------------------------

_MICRO = r"""
extern "C" __global__ void mg_empty() {}
extern "C" __global__ void mg_chase(const unsigned* next, unsigned steps, unsigned* out) {
  unsigned i = 0;
  for (unsigned s = 0; s < steps; ++s) i = __ldcg(&next[i]);
  *out = i;
}
extern "C" __global__ void mg_read(const float4* src, unsigned long long n, unsigned rounds, float* out) {
  float acc = 0.0f;
  for (unsigned r = 0; r < rounds; ++r)
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
      float4 v = __ldcg(&src[i]);
      acc += v.x + v.y + v.z + v.w;
    }
  if (acc == 1.2345f) *out = acc;  // keeps the loads
}
"""


@dataclass
class Calibration:
    device: str
    target: str
    values: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)


def _elapsed_us(fn, reps: int = 20) -> float:
    import cupy
    fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    runs = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(runs)


def calibrate(t) -> Calibration:
    """Measure the table's measurable rates on this GPU (``t``: its Target)."""
    import cupy
    name, l2_bytes = device_summary()
    cal = Calibration(name, t.name)
    module = cupy.RawModule(code=_MICRO)
    empty, chase, read = (module.get_function(n) for n in ("mg_empty", "mg_chase", "mg_read"))
    out = cupy.zeros(1, cupy.float32)
    # HBM: a device-to-device copy of 1 GiB moves 2 GiB
    a = cupy.empty(2**28, cupy.float32)
    b = cupy.empty_like(a)
    copy_us = _elapsed_us(lambda: b.__setitem__(Ellipsis, a))
    cal.values["hbm_efficiency"] = min(1.0, 2 * a.nbytes / (copy_us * 1e-6) / t.hbm_bandwidth)
    # launches: 1000 empty kernels back to back, eagerly and from a CUDA graph
    n = 1000
    cal.values["launch_s"] = _elapsed_us(lambda: [empty((1,), (32,), ()) for _ in range(n)], 5) * 1e-6 / n
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(n):
            empty((1,), (32,), ())
        graph = stream.end_capture()
    cal.values["graph_launch_s"] = _elapsed_us(lambda: graph.launch(stream), 5) * 1e-6 / n
    # idle HBM latency: one thread chasing a random cycle through 1 GiB
    elems = 2**28
    perm = cupy.random.permutation(elems).astype(cupy.uint32)
    nxt = cupy.empty(elems, cupy.uint32)
    nxt[perm] = cupy.roll(perm, -1)
    steps = 20000
    res = cupy.zeros(1, cupy.uint32)
    cal.values["hbm_latency_s"] = _elapsed_us(lambda: chase((1,), (1,), (nxt, np.uint32(steps), res)), 3) * 1e-6 / steps
    # L2 -> SMs: all SMs, then one CTA, reading an L2-resident buffer (a quarter of the L2) 64 times
    l2buf = cupy.ones(l2_bytes // 4 // 4, cupy.float32)
    n4 = l2buf.size // 4
    rounds = 64
    sms = t.sm_count
    all_us = _elapsed_us(lambda: read((sms * 4,), (512,), (l2buf, np.uint64(n4), np.uint32(rounds), out)))
    cal.values["l2_bandwidth"] = l2buf.nbytes * rounds / (all_us * 1e-6)
    one_us = _elapsed_us(lambda: read((1,), (1024,), (l2buf, np.uint64(n4), np.uint32(4), out)), 5)
    cal.values["sm_load_bandwidth"] = l2buf.nbytes * 4 / (one_us * 1e-6)
    cal.notes = {"copy_us": copy_us, "device": name, "l2_bytes": l2_bytes}
    return cal


def write_calibration(cal: Calibration) -> Path:
    from mugraph.codegen import calibration
    day = datetime.date.today().isoformat()
    why = f"measured by bench/gpu.py --calibrate on {cal.device}, {day}"
    return calibration.updated(cal.target, cal.values, why)


# ---- the command ---------------------------------------------------------------------------------------------------

def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--reps", type=int, default=100, help=f"timed single launches (median; >= {MIN_REPS})")
    parser.add_argument("--model", action="store_true", help="print the cost model's table (no GPU needed)")
    parser.add_argument("--calibrate", action="store_true", help="measure and write the calibration table")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.reps < MIN_REPS:
        parser.error(f"--reps {args.reps}: at least {MIN_REPS} launches make a median")
    return args


def _names(args) -> list[str]:
    return [n.strip() for n in args.workloads.split(",") if n.strip()]


def main_model(args) -> int:
    rows = model_rows(_names(args))
    print(format_model(rows))
    print(MODEL_NOTE)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"fraction": r.fraction} for r in rows], indent=1))
    return 0


def main_calibrate(args) -> int:
    from mugraph.search.targets import get_target
    name, _ = device_summary()
    cal = calibrate(get_target(roofline_target(name)))
    path = write_calibration(cal)
    print(f"calibrated {cal.target} on {cal.device}: " + ", ".join(f"{k}={v:.4g}" for k, v in cal.values.items()))
    print(f"wrote {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(cal), indent=1))
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.model:
        return main_model(args)
    if not gpu_available():
        print("bench/gpu.py: no CUDA device (cupy.cuda.is_available() is False): nothing to time here. Run it on "
              "a GPU machine, e.g. through bench/gpu_check.sh; `bench/gpu.py --model` needs none.")
        return 0
    if args.calibrate:
        return main_calibrate(args)
    import cupy
    name, l2_bytes = device_summary()
    target, jax = roofline_target(name), jax_on_gpu()
    print(f"device: {name} (L2 {l2_bytes / 2**20:.0f} MiB; model target {target}); CuPy {cupy.__version__}; "
          f"baseline: {jax if isinstance(jax, str) else 'jax ' + jax.__version__ + ' jit'}", flush=True)
    flush = Flusher(l2_bytes)
    rows = [r for n in _names(args) for r in bench(n, args, jax, target, flush)]
    print(f"\nmedian of {args.reps} single launches, L2 flushed before each\n{HEADER}")
    print("\n".join(format_row(r) for r in rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "target": target,
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
