"""GPU benchmark: each workload's generated kernels (the hand-written fused μGraph, and the search's winner where
`mugraph regen` shipped one) against jax.jit of its JAX function, beside the cost model's estimate.

    python bench/gpu.py --model                     # no GPU needed: the model's table (launch plans, CTAs, bytes
                                                    # in flight per SM, estimate, roofline, fraction, speedup
                                                    # over the XLA-like baseline at jax.jit's and eager launches)
    python bench/gpu.py [--workloads a,b] [--reps 100] [--json out.json] [--deadline S]   # on a GPU: measured
    python bench/gpu.py --calibrate [--table out.json]  # on a GPU: measure the calibration table's rates, write them

Timing (GPU): each kernel's output is first checked against the spec (float64 interpreter; NaN-poisoned outputs):
one that disagrees is reported FAILED and not timed. Every figure is then the median of --reps (>= 50) single
runs, each after the L2 cache was flushed (a 2x-L2 buffer written just before), after 10 warm-up runs, timed by
CUDA events: mugraph's plan launched eagerly and replayed as a one-run CUDA graph (the `graph` figure and the
fraction of roofline: the spec's roofline, cost.roofline with a CUDA-graph launch, over it); jax.jit of the same
function by events recorded on XLA's own stream by timing marks around its inputs and outputs
(mugraph.jax_ffi.bracketed; the host clock, dispatch included, only where the marks cannot be built, and the row
says so). The weight-streaming kernels are also timed at other CTA counts (other grids and loop lengths of the
same structure). Rows are printed and written to --json as each is measured, with nvidia-smi's clocks before
and after; --deadline stops starting rows. Without a GPU the timing modes say so and exit 0.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
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
    estimate_us: float         # launched as jax.jit launches it (cost.Launch.JIT)
    roofline_us: float         # the spec's roofline, one launch on the same path
    ctas: int = 0              # CTAs of the largest custom launch (blocks x splits)
    xla_us: float = 0.0        # the XLA-like baseline (search/baseline.py), jax.jit's launches
    eager_estimate_us: float = 0.0  # both again with eager launches from Python (4 µs each)
    eager_xla_us: float = 0.0

    @property
    def fraction(self) -> float:
        return self.roofline_us / self.estimate_us if self.estimate_us else 0.0

    @property
    def speedup(self) -> float:
        """The headline: the XLA-like baseline over the estimate, both launched as jax.jit launches them."""
        return self.xla_us / self.estimate_us if self.estimate_us else 0.0

    @property
    def eager_speedup(self) -> float:
        """The same with eager Python launches on both sides: a second figure."""
        return self.eager_xla_us / self.eager_estimate_us if self.eager_estimate_us else 0.0


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
    from mugraph.search.baseline import xla_estimate
    from mugraph.search.cost import Launch, estimate, roofline
    rows = []
    for name in names:
        w = workloads.get(name)
        spec = w.spec()
        for label, graph in graphs_of(w).items():
            for t in targets:
                est, bound = estimate(graph, t), roofline(spec, t)
                inflight = max((k.inflight_per_sm for k in est.kernels), default=0)
                ctas = max((k.blocks for k in est.kernels if k.kind == "custom"), default=0)
                rows.append(ModelRow(name, label, t, plan_text(est), inflight / 1024, est.seconds * 1e6,
                                     bound.seconds * 1e6, ctas, xla_estimate(spec, t).seconds * 1e6,
                                     estimate(graph, t, launch=Launch.EAGER).seconds * 1e6,
                                     xla_estimate(spec, t, launch=Launch.EAGER).seconds * 1e6))
    return rows


MODEL_COLUMNS = [("workload", 15), ("graph", 9), ("target", 6), ("launch plan (grid/splits, stages)", 34),
                 ("CTAs", 5), ("KB/SM", 6), ("model µs", 9), ("roof µs", 8), ("%roof", 6), ("vs XLA", 7),
                 ("eager", 6)]


def _line(cells) -> str:
    return " ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, (_, w)) in enumerate(zip(cells, MODEL_COLUMNS)))


def format_model(rows: list[ModelRow]) -> str:
    lines = [_line([title for title, _ in MODEL_COLUMNS])]
    for r in rows:
        lines.append(_line([r.workload, r.graph, r.target, r.plan, str(r.ctas), f"{r.inflight_kb_per_sm:.0f}",
                            f"{r.estimate_us:.2f}", f"{r.roofline_us:.2f}", f"{100 * r.fraction:.0f}%",
                            f"{r.speedup:.2f}x", f"{r.eager_speedup:.2f}x"]))
    return "\n".join(lines)


MODEL_NOTE = ("model: the cost model's time with the launches jax.jit pays (from C++, 1 µs per kernel; runs of 5+ "
              "capturable kernels replayed as a command buffer, 0.5 µs each: lead's estimates, XLA's defaults cited "
              "in codegen/calibration.json), every kernel (custom, library or XLA fusion) after one first load from HBM; "
              "roofline: the spec's bytes at peak HBM bandwidth or its FLOPs at the "
              "tensor-core peak, plus one launch on the same path; CTAs: the largest custom launch (blocks x "
              "splits); KB/SM: bytes in flight per SM while the busiest kernel streams; vs XLA: the XLA-like "
              "baseline (search/baseline.py) over the model, both launched as jax.jit launches them (the headline); "
              "eager: the same speedup with eager Python launches on both sides (4 µs per kernel), a second figure. "
              "Constants: codegen/calibration.json.")


# ---- measured rows (GPU) -------------------------------------------------------------------------------------------

STREAMING = ("rmsnorm_linear", "gated_mlp", "lora")  # weight-streaming kernels: their CTA counts are swept
SWEEP_WAVES = (0.25, 0.5, 1, 2, 4)                     # CTA counts swept: these multiples of the SM count
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3}  # vs the spec in float64, of the output's scale


@dataclass
class Row:
    workload: str
    graph: str = "reference"
    mugraph_us: float | None = None      # median single launch (eager), L2 flushed before each
    graph_us: float | None = None        # median single CUDA-graph replay of the plan, L2 flushed before each
    jax_us: float | None = None          # median jax.jit call: device events around its work (see jax_timing)
    roofline_us: float | None = None     # CUDA-graph launch
    model_us: float | None = None
    max_error_vs_jax: float | None = None
    loader: str = ""
    error: str = ""
    ctas: int | None = None              # CTAs of the busiest launch (grid x splits)
    max_error_vs_spec: float | None = None
    jax_timing: str = ""                 # "events" (marks on XLA's stream) or "host: why" (host clock, dispatch)

    def speedup(self, ours: float | None) -> float | None:
        return self.jax_us / ours if self.jax_us and ours else None


class Disagrees(Exception):
    """A kernel's output is not the spec's: it is reported, never timed."""


def disagreement(ours: list, want: list, dtypes) -> tuple[float, str | None]:
    """(max error of the output scale, why ``ours`` disagrees with ``want`` or None): NaN or ±inf at other places,
    or an error above the output dtype's tolerance."""
    worst = 0.0
    for i, (a, b, dtype) in enumerate(zip(ours, want, dtypes)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return float("inf"), f"output {i} has shape {a.shape}, the spec {b.shape}"
        for what, where in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
            bad = int((where(a) != where(b)).sum())
            if bad:
                return float("inf"), f"output {i}: {what} at {bad} of {a.size} elements where the spec differs"
        finite = np.isfinite(b)
        if finite.any():
            error = float(np.abs(a[finite] - b[finite]).max() / max(np.abs(b[finite]).max(), 1e-30))
            worst = max(worst, error)
            if error > TOLERANCE[str(dtype)]:
                return worst, f"output {i}: max error {error:.2e} of its scale (tolerance {TOLERANCE[str(dtype)]:.0e})"
    return worst, None


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
    """Median microseconds of one synchronised ``step`` by the host clock, each after ``flush`` (the fallback
    for jax.jit when its timing marks cannot be built: dispatch included)."""
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


def launch_ctas(graph) -> int:
    """CTAs of the busiest custom launch of ``graph``'s plan on sm_90 (grid x splits; 0 without one)."""
    from mugraph.codegen import generate
    return max((int(np.prod(k.grid)) for k in generate(graph, "sm_90").plan.kernels if k.kind == "custom"),
               default=0)


def check_mugraph(graph, arrays, want, row: Row):
    """The kernel loaded and bound on ``arrays``; Disagrees (and ``row.error``) when its output, poisoned with NaN
    before the launch, is not ``want``."""
    import cupy
    kernel = load_kernel(graph)
    bound = kernel.bind(*[cupy.asarray(a) for a in arrays])
    row.loader = kernel.loader() or ""
    for out in bound.outputs:
        out.fill(np.nan)
    ours = [cupy.asnumpy(o) for o in bound.launch()]
    row.max_error_vs_spec, why = disagreement(ours, want, [o.dtype.value for o in graph.outputs])
    if why:
        raise Disagrees(f"output disagrees with the spec, not timed: {why}")
    return kernel, bound, ours


def time_mugraph(graph, arrays, want, flush, reps: int, row: Row) -> list:
    """Check the kernel's output, then time single launches and single CUDA-graph replays, L2 flushed each."""
    import cupy
    from mugraph.codegen.runtime_cupy import capture
    kernel, bound, ours = check_mugraph(graph, arrays, want, row)
    row.mugraph_us = time_events(bound.launch, flush, reps)
    replay = capture([bound], repeat=1)
    row.graph_us = time_events(lambda: replay.replay(cupy.cuda.get_current_stream()), flush, reps)
    return ours


def jax_on_gpu():
    """The jax module if it runs on a GPU here, else a string saying why not."""
    try:
        import jax
        platform = jax.devices()[0].platform
    except Exception as e:
        return f"JAX unavailable ({type(e).__name__}: {e})"
    return jax if platform == "gpu" else f"JAX runs on {platform}, not the GPU"


def time_jax_events(jax, fn, args, flush, reps: int) -> tuple[float, object]:
    """Median microseconds of ``jax.jit(fn)``'s device work: CUDA events recorded on XLA's stream by timing marks
    around its inputs and outputs (``mugraph.jax_ffi.bracketed``), L2 flushed before each call."""
    import cupy
    from mugraph.jax_ffi import bracketed
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    timed = jax.jit(bracketed(fn, start.ptr, end.ptr))
    out = jax.block_until_ready(timed(*args))
    for _ in range(WARMUP):
        jax.block_until_ready(timed(*args))
    runs = []
    for _ in range(reps):
        flush()
        cupy.cuda.Device().synchronize()
        jax.block_until_ready(timed(*args))
        end.synchronize()
        runs.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(runs), out


def time_jax(jax, w, arrays, flush, reps: int) -> tuple[float, str, list]:
    """(median µs, how it was timed, outputs) of jax.jit of the workload's function on ``arrays``."""
    fn = jax.jit(w.fn)
    args = [jax.device_put(a) for a in arrays]
    try:
        us, out = time_jax_events(jax, w.fn, args, flush, reps)
        how = "events"
    except Exception as e:  # the marks need the FFI handler (g++): time by the host clock instead
        last = [None]

        def step():
            last[0] = fn(*args)
        us = time_host(step, lambda: jax.block_until_ready(last[0]), flush, reps)
        out, how = fn(*args), f"host: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return us, how, [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def max_error(ours: list, theirs: list) -> float:
    worst = 0.0
    for a, b in zip(ours, theirs):
        b64 = np.asarray(b, np.float64)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b64).max() / max(np.abs(b64).max(), 1e-30)))
    return worst


def sweep_graphs(graph, spec, target: str = "h200", waves=SWEEP_WAVES) -> list[tuple[int, object]]:
    """``graph`` (one custom kernel) sized with other grids and loop lengths: for each multiple in ``waves`` of
    the SM count (sm_90's sizing GPU), the sizing whose plan's CTA count is nearest to it (by ratio; the cost
    model's choice among sizings with equal CTAs), and ``graph`` itself: [(CTAs, graph)] by CTAs, no count twice.
    Empty for graphs of other than one custom kernel."""
    from mugraph.search.cost import estimate, fits
    from mugraph.search.instantiate import resize
    from mugraph.search.sizing import block_options
    customs = graph.custom_ops()
    if len(customs) != 1:
        return []
    sources = []

    def sources_only(_key, srcs):  # the kernel's sources; None stops the rebuild there
        sources.append(srcs)
        return None

    resize(graph, list(spec.inputs), sources_only, {})
    own = launch_ctas(graph)
    by_ctas: dict[int, tuple[float, object]] = {own: (0.0, graph)}  # its own sizing stands for its count
    for grid, trips in block_options(customs[0][0], sources[0]):
        sized = resize(graph, list(spec.inputs), lambda k, s: (grid, trips), {})
        if sized is None or not fits(sized.custom_ops()[0][0], target):
            continue
        ctas, seconds = launch_ctas(sized), estimate(sized, target, cuda_graph=True).seconds
        if ctas not in by_ctas or seconds < by_ctas[ctas][0]:
            by_ctas[ctas] = (seconds, sized)
    from mugraph.codegen.arch import get_arch
    sms = get_arch("sm_90").sm_count
    picks = {min(by_ctas, key=lambda c: abs(np.log(c / (sms * f)))) for f in waves} | {own}
    return [(c, by_ctas[c][1]) for c in sorted(picks)]


class RowWriter:
    """Prints each row as it is measured and rewrites ``path`` (JSON) with every row so far: a run stopped by a
    timeout keeps what it measured."""

    def __init__(self, path, meta: dict):
        self.path, self.meta, self.rows = path, dict(meta), []
        print(HEADER, flush=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.write()

    def write(self) -> None:
        if self.path:
            Path(self.path).write_text(json.dumps(self.meta | {"rows": [asdict(r) for r in self.rows]}, indent=1))


class Deadline:
    """Seconds left of a run's budget; a row started after it is reported, not measured."""

    def __init__(self, seconds: float | None, clock=time.monotonic):
        self.clock, self.end = clock, None if seconds is None else clock() + seconds

    def passed(self) -> bool:
        return self.end is not None and self.clock() >= self.end


def measure(row: Row, graph, arrays, want, theirs, ctx) -> Row:
    """``row`` with ``graph`` checked and timed (or why not), its model figures and its error against jax.jit."""
    from mugraph.search.cost import estimate
    if ctx.deadline.passed():
        row.error = "not run: the --deadline passed"
        return row
    try:
        row.ctas = launch_ctas(graph)
        ours = time_mugraph(graph, arrays, want, ctx.flush, ctx.reps, row)
        if theirs is not None:
            row.max_error_vs_jax = max_error(ours, theirs)
        row.model_us = estimate(graph, ctx.target, cuda_graph=True).seconds * 1e6
    except Disagrees as e:
        row.error = str(e)
    except Exception as e:
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    return row


def bench(name: str, ctx, writer: RowWriter) -> None:
    """Every kernel of workload ``name`` (reference, searched, and the CTA sweep of streaming ones), each checked
    against the spec then timed, beside jax.jit of the same function on the same inputs."""
    from mugraph.search.cost import roofline
    w = workloads.get(name)
    arrays, spec = w.random_inputs(0), w.spec()
    want = ir.interpret(spec, arrays)
    bound_us = roofline(spec, ctx.target, cuda_graph=True).seconds * 1e6
    jax_us, how, theirs = None, "", None
    if not isinstance(ctx.jax, str) and not ctx.deadline.passed():
        try:
            jax_us, how, theirs = time_jax(ctx.jax, w, arrays, ctx.flush, ctx.reps)
        except Exception as e:
            how = f"failed: {type(e).__name__}: {e}"
    graphs = graphs_of(w)
    for label, graph in graphs.items():
        writer.add(measure(Row(name, label, jax_us=jax_us, roofline_us=bound_us, jax_timing=how),
                           graph, arrays, want, theirs, ctx))
    if name in STREAMING and ctx.sweep:
        for ctas, graph in sweep_graphs(graphs["reference"], spec, ctx.target):
            writer.add(measure(Row(name, f"ref@{ctas}", jax_us=jax_us, roofline_us=bound_us, jax_timing=how),
                               graph, arrays, want, theirs, ctx))


def _num(value: float | None, fmt: str, width: int, suffix: str = "") -> str:
    return ("n/a" if value is None else format(value, fmt) + suffix).rjust(width)


def _fraction(bound: float | None, measured: float | None, width: int) -> str:
    return ("n/a" if not bound or not measured else f"{100 * bound / measured:.0f}%").rjust(width)


COLUMNS = [("workload", 15), ("graph", 9), ("CTAs", 5), ("mugraph µs", 10), ("graph µs", 9), ("jax.jit µs", 10),
           ("speedup", 8), ("(graph)", 8), ("model µs", 9), ("roof µs", 8), ("%roof(g)", 8), ("err vs jax", 10)]
HEADER = " ".join(title.ljust(w) if i < 2 else title.rjust(w) for i, (title, w) in enumerate(COLUMNS)) + "  loader"


def format_row(r: Row) -> str:
    if r.error:
        return f"{r.workload:<15} {r.graph:<9} FAILED: {r.error}"
    cells = [r.workload.ljust(15), r.graph.ljust(9), _num(r.ctas, "d", 5), _num(r.mugraph_us, ".2f", 10),
             _num(r.graph_us, ".2f", 9), _num(r.jax_us, ".2f", 10), _num(r.speedup(r.mugraph_us), ".2f", 8, "x"),
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


CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw", "temperature.gpu")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer name first


def parse_clocks(text: str, fields=CLOCK_FIELDS) -> dict:
    """The first GPU's line of ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` by field."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields):
        return {"error": f"unexpected nvidia-smi output {line!r}"}
    return dict(zip(fields, values))


def gpu_clocks(run=subprocess.run) -> dict:
    """Clocks, power and temperature of the first GPU now (nvidia-smi), with the active clock-limit reasons; an
    ``error`` entry where nvidia-smi cannot say."""
    def query(fields):
        try:
            proc = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"nvidia-smi: {type(e).__name__}: {e}"}
        if proc.returncode:
            return {"error": f"nvidia-smi exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[:200]}"}
        return parse_clocks(proc.stdout, fields)

    clocks = query(CLOCK_FIELDS)
    for field in REASON_FIELDS:
        reason = query((field,))
        if "error" not in reason:
            return clocks | {"clock_limit_reasons": reason[field]}
    return clocks


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


def _elapsed_us(fn, reps: int = 20, flush=None) -> float:
    """Median microseconds of ``fn`` by CUDA events; ``flush`` (an L2 flush) before each run of an HBM figure."""
    import cupy
    fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    runs = []
    for _ in range(reps):
        if flush is not None:
            flush()
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
    flush = Flusher(l2_bytes)
    module = cupy.RawModule(code=_MICRO)
    empty, chase, read = (module.get_function(n) for n in ("mg_empty", "mg_chase", "mg_read"))
    out = cupy.zeros(1, cupy.float32)
    # HBM: a device-to-device copy of 1 GiB moves 2 GiB
    a = cupy.empty(2**28, cupy.float32)
    b = cupy.empty_like(a)
    copy_us = _elapsed_us(lambda: b.__setitem__(Ellipsis, a), flush=flush)
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
    cal.values["hbm_latency_s"] = _elapsed_us(lambda: chase((1,), (1,), (nxt, np.uint32(steps), res)), 3,
                                              flush) * 1e-6 / steps
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


def write_calibration(cal: Calibration, path=None) -> Path:
    """``cal``'s values written into the table at ``path`` (default: the table in use); a ``path`` that does not
    exist yet starts as a copy of the table in use, which is left as it was."""
    from mugraph.codegen import calibration
    day = datetime.date.today().isoformat()
    why = f"measured by bench/gpu.py --calibrate on {cal.device}, {day}"
    if path is not None and not Path(path).exists():
        Path(path).write_text(calibration.table_path().read_text(encoding="utf-8"), encoding="utf-8")
    return calibration.updated(cal.target, cal.values, why, path=path)


# ---- the command ---------------------------------------------------------------------------------------------------

def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--reps", type=int, default=100, help=f"timed single launches (median; >= {MIN_REPS})")
    parser.add_argument("--model", action="store_true", help="print the cost model's table (no GPU needed)")
    parser.add_argument("--calibrate", action="store_true", help="measure and write the calibration table")
    parser.add_argument("--table", help="--calibrate writes this table (a copy of the one in use if new), not the "
                                        "one in use")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false",
                        help=f"do not sweep the CTA counts of {', '.join(STREAMING)}")
    parser.add_argument("--deadline", type=float, help="seconds: rows not started by then are reported, not run")
    parser.add_argument("--json", help="also write the rows to this file (rewritten after every row)")
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
    path = write_calibration(cal, args.table)
    print(f"calibrated {cal.target} on {cal.device}: " + ", ".join(f"{k}={v:.4g}" for k, v in cal.values.items()))
    print(f"wrote {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(cal), indent=1))
    return 0


@dataclass
class Context:
    """What every measurement of one run shares."""

    jax: object          # the jax module on the GPU, or why there is no baseline
    target: str
    flush: object
    reps: int
    sweep: bool
    deadline: Deadline


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
    from mugraph.codegen import calibration
    name, l2_bytes = device_summary()
    target, jax = roofline_target(name), jax_on_gpu()
    clocks = gpu_clocks()
    print(f"device: {name} (L2 {l2_bytes / 2**20:.0f} MiB; model target {target}); CuPy {cupy.__version__}; "
          f"baseline: {jax if isinstance(jax, str) else 'jax ' + jax.__version__ + ' jit'}; clocks {clocks}; "
          f"calibration table {calibration.table_path()}", flush=True)
    print(f"median of {args.reps} single launches, L2 flushed before each; jax.jit timed by device events on "
          "XLA's stream (or the host clock where the row says so); a kernel whose output disagrees with the spec "
          "is not timed", flush=True)
    ctx = Context(jax, target, Flusher(l2_bytes), args.reps, args.sweep, Deadline(args.deadline))
    writer = RowWriter(args.json, {"device": name, "target": target, "clocks_before": clocks,
                                   "calibration": str(calibration.table_path())})
    for workload in _names(args):
        bench(workload, ctx, writer)
    writer.meta["clocks_after"] = gpu_clocks()
    writer.write()
    print(f"clocks after: {writer.meta['clocks_after']}")
    return 1 if any(r.error for r in writer.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
