#!/usr/bin/env bash
# The whole GPU check in one call on a lent GPU machine, in at most 8 minutes. The order, most important first, so a
# run cut short still answers the questions no CPU can:
#   1. setup      make mugraph importable, record nvidia-smi and the GPU's clocks
#   2. hopper     tests/codegen/test_hopper_gpu.py (every workload's sm_90a kernel -- TMA, mbarriers, wgmma -- launched
#                 by its own driver code, against the interpreter, and the CuPy runtime's launch of it bit for bit) and
#                 tests/gpu/test_hopper_launch_gpu.py (sm_90a through the CuPy runtime and as_jax("cuda"): tensor
#                 maps, the producer warpgroup, a split plan with workspace, clusters, the FFI handler's encoding,
#                 the shared-memory check at load); skipped on a GPU that is not compute capability 9.0
#   3. pytest     the rest of tests/gpu (runtime, workloads at full size, the path matrix, JAX on the GPU)
#   4. calibrate, 5. bench, 6. model, 7. model-calibrated, as below.
# In words: run those tests, calibrate the cost model's table on this GPU into $OUT (bench/gpu.py --calibrate
# --table: copy bandwidth and idle latency with L2 flushed, launch gaps, L2 and per-SM fill rates), then time every
# kernel -- the hand-written and the shipped searched ones, both generated with the committed table, so the
# shipped kernels are the ones timed, plus a CTA-count sweep of the weight-streaming kernels -- each checked
# against the spec first, against jax.jit of the same function on the same inputs (bench/gpu.py: CUDA events,
# warm-up, L2 flushed, median of 100; jax.jit timed by events on XLA's stream), and print the model's table with
# the committed and with the calibrated constants. Logs go to $OUT (default /tmp/mugraph-gpu-check): setup.log,
# nvidia-smi.txt, clocks.csv, hopper.log, hopper.xml, pytest.log, junit.xml, calibrate.log, calibration.json (the
# calibrated table, to commit), bench.log, bench.json (rewritten after every row), model.txt, model-calibrated.txt.
# The device tool's call:  bash bench/gpu_check.sh        (bash bench/gpu_check.sh --plan: the steps and caps)
#
# The 8 minutes: every step runs under `timeout` with the smaller of its cap and what is left of BUDGET (470 s)
# after keeping RESERVE seconds for the steps after it, so the script ends in time even when a step hangs; a
# timed-out bench keeps the rows written so far (and bench/gpu.py stops starting rows at its --deadline).
#
# Packages: the lent machine's image already has CuPy, JAX with CUDA, cuda-bindings + NVRTC, SciPy, pytest and
# Hypothesis, and reaches no registry. Only if something is missing does this try, in order: wheels carried in
# .whl/ (see .library/device/README.md), then pip from a registry (`.[cuda,dev]`, then `jax[cuda13]` for the
# baseline; the benchmark reports the baseline as unavailable if JAX has no GPU), within the setup step's cap.
# mugraph itself: an offline `pip install -e .`, else a path finder in site-packages that maps mugraph.* to the
# repository's folders.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/mugraph-gpu-check}"
PY="${MUGRAPH_PYTHON:-python3}"
BUDGET=470
NEEDED="numpy scipy ml_dtypes jax cupy cuda.bindings pytest hypothesis"
# step: cap in seconds (each also bounded by what is left of BUDGET)
STEPS="setup:60 hopper:80 pytest:110 calibrate:35 bench:140 model:15 model-calibrated:15"

cap_of() { local s; for s in $STEPS; do [ "${s%%:*}" = "$1" ] && echo "${s##*:}"; done; }

after() {  # the caps of the steps after $1: time kept for them
  local s total=0 seen=0
  for s in $STEPS; do
    [ "$seen" = 1 ] && total=$((total + ${s##*:}))
    [ "${s%%:*}" = "$1" ] && seen=1
  done
  echo "$total"
}

limit() {  # seconds step $1 may run: its cap, or less when the budget is short
  local left=$((BUDGET - SECONDS - $(after "$1"))) cap
  cap=$(cap_of "$1")
  [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -lt 5 ] && cap=5
  echo "$cap"
}

if [ "${1:-}" = "--plan" ]; then
  total=0
  for s in $STEPS; do echo "${s%%:*} ${s##*:}"; total=$((total + ${s##*:})); done
  echo "total $total budget $BUDGET"
  exit 0
fi

mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export MUGRAPH_CACHE_DIR="${MUGRAPH_CACHE_DIR:-/tmp/mugraph-cache}" MUGRAPH_PROGRESS=0

clocks() {  # one CSV line of the GPU's clocks, power and temperature, labelled $1
  local q="timestamp,name,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu"
  echo "$1,$(nvidia-smi --query-gpu=$q --format=csv,noheader 2>&1 | head -1)" >> "$OUT/clocks.csv"
}

missing() {  # the modules of $NEEDED that $PY cannot find
  "$PY" - $NEEDED <<'EOF'
import importlib.util, sys

def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False

print(" ".join(m for m in sys.argv[1:] if not found(m)))
EOF
}

install_missing() {  # within the setup step's time: carried wheels, then a registry (each pip call bounded)
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    echo "installing carried wheels from .whl/"
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mugraph-site \
      .whl/*.whl && export PYTHONPATH="/tmp/mugraph-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  [ -z "$(missing)" ] && return
  echo "still missing: $(missing); trying a venv from the registry"
  "$PY" -m venv /tmp/mugraph-venv && PY=/tmp/mugraph-venv/bin/python
  timeout 40 "$PY" -m pip install -q --retries 0 --timeout 10 -e '.[cuda,dev]' || echo "pip install .[cuda,dev] failed"
  timeout 30 "$PY" -m pip install -q --retries 0 --timeout 10 'jax[cuda13]' || echo "jax[cuda13] failed: no baseline"
}

make_importable() {  # mugraph.* -> the repository's folders, as [tool.setuptools.package-dir] maps them
  "$PY" -c "import mugraph.codegen.compile" 2>/dev/null && return
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . && return
  echo "pip install -e . failed: registering a path finder for mugraph.* in site-packages instead"
  "$PY" - "$PWD" <<'EOF'
import pathlib, site, sys
FINDER = """# written by bench/gpu_check.sh: imports mugraph.* from the repository at ROOT
import importlib.machinery, sys
ROOT = {root!r}
NAMES = {{"mugraph", "mugraph.ir", "mugraph.verify", "mugraph.search", "mugraph.codegen", "mugraph.kernels_generated"}}

class MugraphFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):  # mugraph.ir -> ROOT/ir: each folder is named by the last part
        return importlib.machinery.PathFinder.find_spec(name, [ROOT]) if name in NAMES else None

sys.meta_path.insert(0, MugraphFinder)
"""
site_dir = pathlib.Path(site.getsitepackages()[0])
(site_dir / "mugraph_dev_finder.py").write_text(FINDER.format(root=sys.argv[1]))
(site_dir / "mugraph_dev_finder.pth").write_text("import mugraph_dev_finder\n")
EOF
}

setup() {
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$OUT/nvidia-smi.txt"
  echo "python: $(command -v "$PY") ($("$PY" --version 2>&1))"
  [ -n "$(missing)" ] && install_missing
  make_importable
  timeout 60 "$PY" - <<'EOF'
import importlib
for name in ["mugraph", "numpy", "scipy", "ml_dtypes", "jax", "jaxlib", "cupy", "cuda.bindings", "pytest",
             "hypothesis", "z3"]:
    try:
        module = importlib.import_module(name)
        print(f"  {name:<14} {getattr(module, '__version__', '?'):<12} {getattr(module, '__file__', '')}")
    except Exception as e:
        print(f"  {name:<14} MISSING ({type(e).__name__}: {e})")
import cupy
print("  cupy sees a GPU:", cupy.cuda.is_available(), "| driver", cupy.cuda.runtime.driverGetVersion(),
      "| runtime", cupy.cuda.runtime.runtimeGetVersion())
from mugraph.codegen.compile import _nvrtc_version, find_tool
print("  NVRTC:", _nvrtc_version(), "| cuobjdump:", find_tool("cuobjdump"), "| g++:", __import__("shutil").which("g++"))
try:
    import jax
    print("  jax devices:", jax.devices())
except Exception as e:
    print("  jax devices: none:", type(e).__name__, e)
EOF
}

echo "== setup (at most $(cap_of setup) s)"
clocks start
# not in a pipeline and not under `timeout`: setup's exports (PY, PYTHONPATH) must reach the steps below; its own
# commands are bounded (pip calls and the import check each under timeout)
setup > "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

HOPPER_TESTS="tests/codegen/test_hopper_gpu.py tests/gpu/test_hopper_launch_gpu.py"
echo "== pytest $HOPPER_TESTS (at most $(limit hopper) s)"
timeout "$(limit hopper)" "$PY" -m pytest $HOPPER_TESTS -q -rs -p no:cacheprovider --durations=8 \
  --junitxml="$OUT/hopper.xml" 2>&1 | tee "$OUT/hopper.log"
hopper=$?
clocks after-hopper

echo "== pytest tests/gpu, the rest (at most $(limit pytest) s)"
timeout "$(limit pytest)" "$PY" -m pytest tests/gpu --ignore=tests/gpu/test_hopper_launch_gpu.py -q -rs \
  -p no:cacheprovider --durations=8 --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.log"
tests=$?
clocks after-pytest

echo "== bench/gpu.py --calibrate into $OUT/calibration.json (at most $(limit calibrate) s)"
rm -f "$OUT/calibration.json"
timeout "$(limit calibrate)" "$PY" bench/gpu.py --calibrate --table "$OUT/calibration.json" 2>&1 |
  tee "$OUT/calibrate.log"
calibrate=$?

bench_s=$(limit bench)
echo "== bench/gpu.py: hand-written and shipped kernels vs jax.jit, committed table (at most $bench_s s)"
timeout "$bench_s" "$PY" bench/gpu.py --json "$OUT/bench.json" --deadline $((bench_s - 25)) 2>&1 |
  tee "$OUT/bench.log"
bench=$?
clocks after-bench

echo "== bench/gpu.py --model (the committed constants)"
timeout "$(limit model)" "$PY" bench/gpu.py --model 2>&1 | tee "$OUT/model.txt"

echo "== bench/gpu.py --model (the constants calibrated on this GPU)"
if [ -f "$OUT/calibration.json" ]; then
  MUGRAPH_CALIBRATION="$OUT/calibration.json" timeout "$(limit model-calibrated)" "$PY" bench/gpu.py --model 2>&1 |
    tee "$OUT/model-calibrated.txt"
else
  echo "no calibrated table (calibration exit $calibrate)" | tee "$OUT/model-calibrated.txt"
fi

echo "== summary after ${SECONDS} s: hopper exit $hopper, pytest exit $tests, calibrate exit $calibrate, bench exit $bench"
cat "$OUT/clocks.csv"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/hopper.log" | tail -25
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/pytest.log" | tail -25
grep -E "FAILED" "$OUT/bench.log" | head -20
[ "$hopper" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$calibrate" -eq 0 ] && [ "$bench" -eq 0 ]
