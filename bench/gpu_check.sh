#!/usr/bin/env bash
# The whole GPU check in one call on a lent GPU machine, under 8 minutes: make mugraph importable, run tests/gpu,
# calibrate the cost model's table on this GPU (bench/gpu.py --calibrate: copy bandwidth, launch gaps, latency,
# L2 and per-SM fill rates), time every kernel -- reference and searched -- against jax.jit of the same function
# on the same inputs (bench/gpu.py: CUDA events, warm-up, L2 flushed, median of 100), and print the model's
# table with the new constants. Logs go to $OUT (default /tmp/mugraph-gpu-check): setup.log, nvidia-smi.txt,
# pytest.log, junit.xml, calibrate.log, calibration.json (the whole table, to commit), bench.log, bench.json,
# model.txt. The device tool's call:  bash bench/gpu_check.sh
#
# Packages: the lent machine's image already has CuPy, JAX with CUDA, cuda-bindings + NVRTC, SciPy, pytest and
# Hypothesis, and reaches no registry. Only if something is missing does this try, in order: wheels carried in
# .whl/ (see .library/device/README.md), then pip from a registry (`.[cuda,dev]`, then `jax[cuda13]` for the
# baseline; the benchmark reports the baseline as unavailable if JAX has no GPU). mugraph itself: an offline
# `pip install -e .`, else a path finder in site-packages that maps mugraph.* to the repository's folders.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/mugraph-gpu-check}"
mkdir -p "$OUT"
PY="${MUGRAPH_PYTHON:-python3}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export MUGRAPH_CACHE_DIR="${MUGRAPH_CACHE_DIR:-/tmp/mugraph-cache}" MUGRAPH_PROGRESS=0
NEEDED="numpy scipy ml_dtypes jax cupy cuda.bindings pytest hypothesis"

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

install_missing() {
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    echo "installing carried wheels from .whl/"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/mugraph-site \
      .whl/*.whl && export PYTHONPATH="/tmp/mugraph-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  [ -z "$(missing)" ] && return
  echo "still missing: $(missing); trying a venv from the registry"
  "$PY" -m venv /tmp/mugraph-venv && PY=/tmp/mugraph-venv/bin/python
  timeout 240 "$PY" -m pip install -q --retries 0 --timeout 20 -e '.[cuda,dev]' || echo "pip install .[cuda,dev] failed"
  timeout 180 "$PY" -m pip install -q --retries 0 --timeout 20 'jax[cuda13]' || echo "jax[cuda13] failed: no baseline"
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
  "$PY" - <<'EOF'
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

echo "== setup"
setup > "$OUT/setup.log" 2>&1  # not in a pipeline: setup's exports (PY, PYTHONPATH) must reach the steps below
cat "$OUT/setup.log"

echo "== pytest tests/gpu"
# the timeouts keep the whole script under 8 minutes even when something hangs (typically: 3-5 minutes)
timeout 210 "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --durations=8 --junitxml="$OUT/junit.xml" 2>&1 |
  tee "$OUT/pytest.log"
tests=$?

echo "== bench/gpu.py --calibrate"
timeout 45 "$PY" bench/gpu.py --calibrate --json "$OUT/calibrate.json" 2>&1 | tee "$OUT/calibrate.log"
calibrate=$?
cp codegen/calibration.json "$OUT/calibration.json" 2>/dev/null

echo "== bench/gpu.py (reference and searched kernels vs jax.jit)"
timeout 150 "$PY" bench/gpu.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
bench=$?

echo "== bench/gpu.py --model (with the calibrated constants)"
timeout 30 "$PY" bench/gpu.py --model 2>&1 | tee "$OUT/model.txt"

echo "== summary: pytest exit $tests, calibrate exit $calibrate, bench exit $bench"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/pytest.log" | tail -25
[ "$tests" -eq 0 ] && [ "$calibrate" -eq 0 ] && [ "$bench" -eq 0 ]
