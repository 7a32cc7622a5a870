"""sm_90a through both launchers on a Hopper GPU (compute capability 9.0; skipped elsewhere): the CuPy runtime and
``as_jax("cuda")`` (the XLA FFI handler) run what codegen emits for sm_90a -- TMA tensor maps encoded at launch
and passed by value, the producer warpgroup in the block, wgmma attention, split plans with workspace, thread-block
clusters through cuLaunchKernelEx -- against the float64 interpreter; the handler's tensor-map encoding is the
Python one byte for byte; a kernel over the GPU's shared memory is a typed error at load. bench/gpu_check.sh runs
this file first."""
from __future__ import annotations

import cupy
import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.api import Kernel
from mugraph.codegen.runtime_cupy import GpuKernel, device_build, load_kernel
from mugraph.ir.errors import ResourceError
from mugraph.jax_integration import jax_has_gpu
from tests.codegen import cluster_plan

TOLERANCE = 1e-2
ATTENTION = ("gqa", "gqa_safe", "qknorm_gqa")

pytestmark = pytest.mark.skipif(not (cupy.cuda.is_available() and cupy.cuda.Device().compute_capability == "90"),
                                reason="needs a compute capability 9.0 GPU (H100 / H200)")
needs_jax_gpu = pytest.mark.skipif(not jax_has_gpu(), reason="JAX sees no GPU (install jax[cuda13])")


def _workload(name: str, size: str):
    w = workloads.get(name)
    return w.small() if size == "small" else w


def _close(got, want, what: str) -> None:
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(g).all(), f"{what} output {i}: {np.count_nonzero(~np.isfinite(g))} elements not finite"
        error = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))
        assert error <= TOLERANCE, f"{what} output {i}: max error {error:.2e} of the output scale"


def _poisoned(kernel, arrays) -> list:
    bound = kernel.bind(*arrays)
    for out in bound.outputs:
        out.fill(np.nan)
    return [cupy.asnumpy(o) for o in bound.launch()]


def test_a_hopper_gpu_builds_sm_90a_within_its_own_shared_memory():
    device = device_build()
    attributes = cupy.cuda.Device().attributes
    assert (device.codegen, device.binary, device.jit) == ("sm_90a", "sm_90a", False)
    assert device.smem_limit == attributes["MaxSharedMemoryPerBlockOptin"]


@pytest.mark.parametrize("size", ["small", "full"])
@pytest.mark.parametrize("name", ATTENTION)
def test_tma_and_wgmma_attention_through_the_cupy_runtime(name, size):
    w = _workload(name, size)
    kernel = load_kernel(w.reference())
    (launch,) = [k for k in kernel.plan.kernels if k.kind == "custom"]
    assert kernel.arch == "sm_90a" and launch.tensor_maps and "mg_wgmma" in kernel.source, name
    assert launch.block[0] == w.reference().custom_ops()[0][0].threads + 128  # the producer warpgroup
    arrays = w.random_inputs(seed=1)
    first = _poisoned(kernel, arrays)
    assert kernel.loader() == "cubin"
    _close(first, ir.interpret(w.spec(), arrays), f"{name} ({size}) through CuPy")
    again = _poisoned(kernel, arrays)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again)), "a TMA kernel's result moved"


def test_a_tma_kernel_replays_in_a_captured_cuda_graph():
    w = workloads.get("gqa").small()
    kernel = load_kernel(w.reference())
    arrays = w.random_inputs(seed=2)
    graph = kernel.capture_graph(*arrays, repeat=2)
    graph.outputs[0].fill(np.nan)
    graph.replay()
    cupy.cuda.Device().synchronize()
    _close([cupy.asnumpy(o) for o in graph.outputs], ir.interpret(w.spec(), arrays), "gqa graph replay")


@needs_jax_gpu
@pytest.mark.parametrize("name", ATTENTION + ("rmsnorm_linear",))
def test_tma_kernels_through_xla_under_jit(name):
    import jax
    w = workloads.get(name).small()
    f = jax.jit(Kernel(w.reference(), w.spec()).as_jax("cuda"))
    arrays = w.random_inputs(seed=3)
    text = f.lower(*arrays).as_text()
    assert "tensor_maps = dense<[" in text, "the sm_90a plan's tensor maps are not in the call"
    for call in range(2):
        _close(f(*arrays), ir.interpret(w.spec(), arrays), f"{name} as_jax('cuda') call {call}")


@pytest.mark.parametrize("name", ("gqa", "rmsnorm_linear", "lora"))
def test_the_handler_encodes_each_tensor_map_as_python_does(name):
    """cuTensorMapEncodeTiled called by the FFI handler from the custom call's record, and by TensorMapSpec
    through cuda-bindings, for the same device buffer: the same 128 bytes."""
    from mugraph.codegen import generate
    from mugraph.jax_ffi import encode_tensor_map
    plan = generate(workloads.get(name).reference(), "sm_90a").plan
    buffers = {b.name: b for b in plan.buffers}
    maps = [m for k in plan.kernels for m in k.tensor_maps]
    assert maps, name
    for spec in maps:
        b = buffers[spec.buffer]
        array = cupy.zeros(b.shape, b.dtype.numpy)
        ours = encode_tensor_map((0, 0, *spec.record()), array.data.ptr)
        assert ours == spec.encode_cuda(array.data.ptr), spec


@pytest.mark.parametrize("size", [2, 4])
def test_a_cluster_launch_through_the_cupy_runtime(size):
    kernel = GpuKernel(cluster_plan.module(size))
    arrays = cluster_plan.inputs(size)
    got = _poisoned(kernel, arrays)
    want = cluster_plan.expected(*arrays, size)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])  # cluster ranks: the launch set the cluster shape


@needs_jax_gpu
@pytest.mark.parametrize("size", [2, 4])
def test_a_cluster_launch_through_xla(size):
    import jax
    from mugraph.jax_ffi import CudaLauncher, device_build as jax_device
    from mugraph.jax_integration import run_plan
    module = cluster_plan.module(size)
    launcher = CudaLauncher(module, jax_device())
    arrays = cluster_plan.inputs(size)
    got = jax.jit(lambda *a: run_plan(module.plan, a, launcher))(*arrays)
    want = cluster_plan.expected(*arrays, size)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got[2]), want[2])


def test_a_split_tma_plan_with_workspace_through_both_launchers():
    w = workloads.get("lora").small()
    kernel = load_kernel(w.reference())
    (launch,) = [k for k in kernel.plan.kernels if k.kind == "custom"]
    assert launch.tensor_maps and kernel.plan.workspace, "pick a lora shape whose sm_90a plan splits with TMA"
    arrays = w.random_inputs(seed=4)
    want = ir.interpret(w.spec(), arrays)
    for n in range(3):  # the counters reset for the next launch
        _close(_poisoned(kernel, arrays), want, f"lora split CuPy launch {n}")
    if jax_has_gpu():
        import jax
        f = jax.jit(Kernel(w.reference(), w.spec()).as_jax("cuda"))
        for n in range(3):
            _close(f(*arrays), want, f"lora split as_jax call {n}")


_BIG = r"""#include "tc_intrin.cuh"
MG_GLOBAL void big(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float fixed[12288];  // 48 KB static
  MG_SHARED_DYN(smem);
  float* dyn = (float*)smem;
  fixed[mg_tid_x()] = x[mg_tid_x()];
  dyn[mg_tid_x()] = 2.0f * x[mg_tid_x()];
  __syncthreads();
  y[mg_tid_x()] = fixed[(mg_tid_x() + 1) % 128] + dyn[mg_tid_x()];
}
"""


def _big_module():
    from mugraph.codegen.generate import GeneratedModule
    from mugraph.codegen.plan import Buffer, KernelLaunch, LaunchPlan
    f32 = ir.DType.FLOAT32
    launch = KernelLaunch("big", "custom", (1, 1, 1), (128, 1, 1), 200 * 1024, ("x", "y"))
    plan = LaunchPlan((launch,), (Buffer("x", (128,), f32, "input"), Buffer("y", (128,), f32, "output")), ("x",),
                      ("y",))
    return GeneratedModule(_BIG, plan, "sm_90a", (_BIG,))


def test_a_kernel_over_the_gpus_shared_memory_is_a_typed_error_at_load_not_a_launch_failure():
    module = _big_module()
    kernel = GpuKernel(module)  # 200 KB dynamic passes the plan check; with 48 KB static it does not fit
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    with pytest.raises(ResourceError, match=rf"kernel 'big' needs 49152 \+ 204800 = 253952 bytes.*allows {limit}"):
        kernel.load()
    if jax_has_gpu():
        import jax
        from mugraph.jax_ffi import CudaLauncher, device_build as jax_device
        from mugraph.jax_integration import run_plan
        launcher = CudaLauncher(module, jax_device())
        with pytest.raises(Exception, match=rf"kernel 'big' needs 49152 \+ 204800 bytes.*allows {limit}"):
            jax.block_until_ready(jax.jit(lambda x: run_plan(module.plan, [x], launcher))(np.ones(128, np.float32)))
