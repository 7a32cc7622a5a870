"""The public API: superoptimize -> Kernel, jit, the command line."""
from __future__ import annotations

import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import workloads
from mugraph.codegen import runtime_cupy
from mugraph.errors import InvalidInput, NoDevice
from mugraph.search import SearchConfig

QUICK = SearchConfig(max_kernel_ops=1, budget_seconds=120)


def gated(X, W1, W2):
    return jax.nn.silu(X @ W1) * (X @ W2)


ARGS = [jax.ShapeDtypeStruct((8, 128), jnp.float16), jax.ShapeDtypeStruct((128, 128), jnp.float16),
        jax.ShapeDtypeStruct((128, 128), jnp.float16)]


@pytest.fixture(scope="module")
def kernel():
    return mugraph.superoptimize(gated, *ARGS, config=QUICK, progress=lambda *a: None)


def test_superoptimize_returns_a_fused_verified_kernel(kernel):
    assert isinstance(kernel, mugraph.Kernel)
    assert len(kernel.graph.custom_ops()) == 1
    assert kernel.report.verification.equivalent
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(a.shape) * 0.5).astype(np.float16) for a in ARGS]
    got = kernel.run_reference(*arrays)
    want = np.asarray(gated(*[jnp.asarray(a, jnp.float32) for a in arrays]))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_kernel_has_tensor_core_cuda_and_a_picture(kernel, capsys):
    source = kernel.cuda_source
    assert '#include "tc_intrin.cuh"' in source and "mg_mma_m16n8k16" in source
    text = kernel.show()
    assert "in grid(" in text and "estimated speedup" in text   # the loop nest and the report
    assert "block graph" in capsys.readouterr().out


def test_kernel_runs_on_the_cpu_harness(kernel):
    rng = np.random.default_rng(1)
    arrays = [(rng.standard_normal(a.shape) * 0.5).astype(np.float16) for a in ARGS]
    got = kernel.run_on_cpu(*arrays).astype(np.float64)
    want = kernel.run_reference(*arrays)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


@pytest.mark.skipif(runtime_cupy.gpu_available(), reason="checks the no-GPU path")
def test_calling_a_kernel_without_a_gpu_names_what_runs_instead(kernel):
    with pytest.raises(NoDevice, match="run_reference"):
        kernel(np.zeros((8, 128), np.float16), np.zeros((128, 128), np.float16),
               np.zeros((128, 128), np.float16))


@pytest.mark.skipif(runtime_cupy.gpu_available(), reason="checks the no-GPU path")
def test_jit_falls_back_to_jax_with_one_warning():
    fn = mugraph.jit(gated)
    x = jnp.ones((8, 128), jnp.float16)
    w = jnp.full((128, 128), 0.01, jnp.float16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = fn(x, w, w)
        b = fn(x, w, w)
    assert sum("no GPU" in str(c.message) for c in caught) == 1
    np.testing.assert_allclose(np.asarray(a), np.asarray(gated(x, w, w)))
    np.testing.assert_allclose(np.asarray(b), np.asarray(a))


def test_superoptimize_rejects_bad_input():
    with pytest.raises(InvalidInput, match="JAX function or a KernelGraph"):
        mugraph.superoptimize(42)
    with pytest.raises(InvalidInput, match="takes no example arguments"):
        mugraph.superoptimize(workloads.get("lora").small().spec(), 1)


def test_cli_show_prints_spec_fused_graph_and_check():
    out = subprocess.run([sys.executable, "-m", "mugraph", "show", "rmsnorm_linear"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for needle in ("the spec (traced from JAX)", "hand-written fused", "for i in range(64)",
                   "agree"):
        assert needle in out.stdout


def test_cli_reports_errors_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "mugraph", "show", "no_such_workload"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "mugraph: error" in out.stderr and "Traceback" not in out.stderr
