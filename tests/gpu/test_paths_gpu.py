"""The path matrix on a GPU (tests/test_paths.py's cases): the CuPy runtime and ``as_jax("cuda")`` under
``jax.jit`` against ``run_reference`` (the interpreter, float64: no CPU-harness builds on the GPU machine), for
plans that split their loop (workspace: partials and counters) and plans that do not; repeated launches (the
counters reset); concurrent streams each with their own buffers; a captured CUDA graph with buffers of its own;
and a serialized executable run by a process that never built its module (modules named by content)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cupy
import numpy as np
import pytest

from mugraph.api import Kernel
from mugraph.codegen.runtime_cupy import load_kernel
from mugraph.jax_integration import jax_has_gpu
from tests.test_paths import BUILDERS, TOLERANCE, _splits, assert_agree, case

# The workload cases (reference and searched, split and unsplit) and a few generality winners.
CASES = [i for i in BUILDERS if not i.startswith("generality/")] + \
    ["generality/attention_causal", "generality/layernorm_affine_linear_f32", "generality/lora_scaled_bf16"]
SPLIT_CASES = ["lora/reference/small", "gqa_safe/reference/small", "gated_mlp/reference/split"]
ROOT = Path(__file__).resolve().parents[2]

needs_jax_gpu = pytest.mark.skipif(not jax_has_gpu(), reason="JAX sees no GPU (install jax[cuda13])")


def _reference(c, inputs=None):
    return Kernel(c.graph, c.spec).run_reference(*(c.inputs if inputs is None else inputs))


def _dtypes(c) -> list:
    return [o.dtype for o in c.graph.outputs]


@pytest.mark.parametrize("case_id", CASES)
def test_the_cupy_runtime_agrees_with_the_reference_launch_after_launch(case_id):
    c = case(case_id)
    kernel = load_kernel(c.graph)
    want = _reference(c)
    for launch in range(3):  # a split plan's counters must be back at zero for the next launch
        bound = kernel.bind(*c.inputs)
        for out in bound.outputs:
            out.fill(np.nan)
        got = [cupy.asnumpy(o) for o in bound.launch()]
        assert_agree(f"{case_id} CuPy launch {launch}", got, want, _dtypes(c), TOLERANCE.get)


@needs_jax_gpu
@pytest.mark.parametrize("case_id", CASES)
def test_as_jax_cuda_under_jit_agrees_with_the_reference(case_id):
    import jax
    c = case(case_id)
    f = jax.jit(Kernel(c.graph, c.spec).as_jax("cuda"))
    want = _reference(c)
    for call in range(3):  # per-call workspace: counters zeroed on XLA's stream every call
        assert_agree(f"{case_id} as_jax('cuda') call {call}", f(*c.inputs), want, _dtypes(c), TOLERANCE.get)


@pytest.mark.parametrize("case_id", SPLIT_CASES)
def test_concurrent_streams_never_share_a_split_plans_workspace(case_id):
    c = case(case_id)
    assert _splits(c.graph)
    kernel = load_kernel(c.graph)
    inputs = [c.inputs, [-a for a in c.inputs]]
    wants = [_reference(c, x) for x in inputs]
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in inputs]
    outs = [None, None]
    for _ in range(20):  # interleaved, with no synchronisation between the two streams
        for i, (stream, x) in enumerate(zip(streams, inputs)):
            with stream:
                outs[i] = kernel(*x)
    for stream in streams:
        stream.synchronize()
    assert kernel.streams() >= 2 and outs[0][0] is not outs[1][0]
    for i, (got, want) in enumerate(zip(outs, wants)):
        assert_agree(f"{case_id} stream {i}", [cupy.asnumpy(o) for o in got], want, _dtypes(c), TOLERANCE.get)


@pytest.mark.parametrize("case_id", SPLIT_CASES[:1])
def test_a_captured_graph_has_buffers_of_its_own(case_id):
    c = case(case_id)
    kernel = load_kernel(c.graph)
    graph = kernel.capture_graph(*c.inputs, repeat=2)
    direct = kernel(*[-a for a in c.inputs])  # the kernel's own buffers on this stream
    graph.replay()
    cupy.cuda.Device().synchronize()
    assert graph.outputs[0] is not direct[0]
    assert_agree(f"{case_id} graph replay", [cupy.asnumpy(o) for o in graph.outputs], _reference(c), _dtypes(c),
                 TOLERANCE.get)


_SERIALIZE = textwrap.dedent("""
    import pickle, sys, jax
    from jax.experimental.serialize_executable import serialize
    from mugraph import workloads
    from mugraph.api import Kernel
    w = workloads.get("lora").small()
    compiled = jax.jit(Kernel(w.reference(), w.spec()).as_jax("cuda")).lower(*w.random_inputs(0)).compile()
    with open(sys.argv[1], "wb") as f:
        pickle.dump(serialize(compiled), f)
""")

_LOAD = textwrap.dedent("""
    import pickle, sys, jax, numpy as np
    from jax.experimental.serialize_executable import deserialize_and_load
    from mugraph import workloads
    from mugraph.api import Kernel
    from mugraph.jax_ffi import handler_library
    handler_library()  # the FFI targets, before XLA loads an executable that calls them
    other = workloads.get("ntrans").small()  # a module of its own first: no per-process numbering can line up
    jax.jit(Kernel(other.reference(), other.spec()).as_jax("cuda"))(*other.random_inputs(0))
    w = workloads.get("lora").small()
    try:
        with open(sys.argv[1], "rb") as f:
            run = deserialize_and_load(*pickle.load(f))
        got = np.asarray(run(*w.random_inputs(0)), np.float64)
    except Exception as e:
        print("FAILED", e)
        sys.exit(0)
    want = np.asarray(Kernel(w.reference(), w.spec()).run_reference(*w.random_inputs(0)), np.float64)
    print("ERROR", float(np.abs(got - want).max() / np.abs(want).max()))
""")


def _python(script: str, *args, cache: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "MUGRAPH_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@needs_jax_gpu
def test_a_serialized_executable_runs_its_own_module_in_a_process_that_never_built_it(tmp_path):
    """The custom call names lora's module by content: a fresh process (which registered only another kernel)
    loads it from the registry in the shared cache folder; with another cache folder it fails saying why."""
    executable, cache = tmp_path / "lora.xla", tmp_path / "cache"
    _python(_SERIALIZE, executable, cache=cache)
    out = _python(_LOAD, executable, cache=cache)
    assert "ERROR" in out, out
    assert float(out.split("ERROR")[-1]) <= 2e-2, out
    elsewhere = _python(_LOAD, executable, cache=tmp_path / "empty")
    assert "FAILED" in elsewhere and "is not loaded in this process" in elsewhere, elsewhere
