"""The sm_90a kernels on a Hopper GPU (skipped elsewhere): every workload's small reference generated for sm_90a,
compiled by NVRTC, launched through the driver API with its tensor maps encoded by ``TensorMapSpec.encode_cuda``
(independently of the launchers), against the float64 interpreter -- the one GPU run that confirms the layouts,
descriptors and swizzles the CPU harness emulates -- and against the CuPy runtime's launch of the same kernel (its
own parameter packing and encoding), which must give the same bits. bench/gpu_check.sh runs this file first."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.codegen import compile_cuda, generate
from tests.codegen.bundle import max_rel_error


def _hopper_device() -> bool:
    try:
        import cupy
        from cuda.bindings import driver  # noqa: F401
        return cupy.cuda.is_available() and cupy.cuda.Device().compute_capability == "90"
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _hopper_device(), reason="needs an sm_90 GPU (H100/H200) "
                                                                             "with CuPy and cuda-bindings")]


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


def _launch(cubin: bytes, launch, buffers: dict) -> None:
    from cuda.bindings import driver as drv
    module = _check(drv.cuModuleLoadData(cubin))
    fn = _check(drv.cuModuleGetFunction(module, launch.name.encode()))
    _check(drv.cuFuncSetAttribute(fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  launch.smem_bytes))
    values = [ctypes.c_void_p(buffers[a].data.ptr) for a in launch.args]
    for spec in launch.tensor_maps:  # by value: 128 bytes, 64-byte aligned
        raw = (ctypes.c_uint8 * 192)()
        pad = -ctypes.addressof(raw) % 64
        tmap = (ctypes.c_uint8 * 128).from_buffer(raw, pad)
        ctypes.memmove(tmap, spec.encode_cuda(buffers[spec.buffer].data.ptr), 128)
        values.append(tmap)
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    _check(drv.cuLaunchKernel(fn, *launch.grid, *launch.block, launch.smem_bytes, 0, ctypes.addressof(params), 0))
    import cupy
    cupy.cuda.runtime.deviceSynchronize()
    _check(drv.cuModuleUnload(module))


def _direct(name: str, arrays) -> list:
    """The workload's small reference for sm_90a, launched through the driver by this file's own code."""
    import cupy
    graph = workloads.get(name).small().reference()
    module = generate(graph, "sm_90a")
    cubin = compile_cuda(module.source, "sm_90a", name=name).cubin
    plan = module.plan
    assert all(k.kind == "custom" for k in plan.kernels), "these references are custom kernels only"
    buffers = {}
    for b in plan.buffers:
        fill = 0 if b.role == "counters" else np.nan
        buffers[b.name] = cupy.full(b.shape, fill, dtype=b.dtype.numpy)
    for name_, array in zip(plan.inputs, arrays):
        buffers[name_][...] = cupy.asarray(array)
    for launch in plan.kernels:
        _launch(cubin, launch, buffers)
    return [cupy.asnumpy(buffers[o]) for o in plan.outputs]


@pytest.mark.parametrize("name", workloads.names())
def test_sm_90a_kernels_run_right_on_a_hopper_gpu(name):
    w = workloads.get(name).small()
    arrays = w.random_inputs(0)
    out = _direct(name, arrays)
    assert max_rel_error(out, ir.interpret(w.reference(), arrays, dtype="float64")) <= 1e-2


@pytest.mark.parametrize("name", workloads.names())
def test_the_cupy_runtime_launches_the_same_kernel_to_the_same_bits(name):
    """load_kernel on this GPU builds sm_90a's code and launches it with its own packing of pointers and tensor
    maps (cuLaunchKernelEx): the outputs are the direct launch's, bit for bit."""
    import cupy
    from mugraph.codegen.runtime_cupy import load_kernel
    w = workloads.get(name).small()
    arrays = w.random_inputs(0)
    kernel = load_kernel(w.reference())
    assert kernel.arch == "sm_90a" and kernel.loader() == "cubin"
    ours = [cupy.asnumpy(o) for o in kernel(*arrays)]
    for i, (a, b) in enumerate(zip(ours, _direct(name, arrays), strict=True)):
        assert np.array_equal(a, b, equal_nan=True), f"{name} output {i}: the runtime's launch differs"
