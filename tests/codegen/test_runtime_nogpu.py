"""The GPU runtime where no GPU is: NoDevice naming what runs instead, plan checks, input checks, and the
library-op table against the reference interpreter (through NumPy, the same code CuPy runs on a GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir
from mugraph.codegen import runtime_cupy
from mugraph.codegen.library_ops import LIBRARY_OPS, NOT_LIBRARY, library_op
from mugraph.codegen.runtime_cupy import GpuKernel, gpu_available, load_kernel
from mugraph.ir import KOp, TOp
from mugraph.ir.errors import InvalidGraph, InvalidInput, NoDevice, ResourceError, UnsupportedOp
from tests.codegen import handmade_plan as hp
from tests.codegen.library_cases import CASES, case_arrays


@pytest.fixture
def no_gpu(monkeypatch):
    """Act as a machine without a GPU even where one exists."""
    monkeypatch.setattr(runtime_cupy, "gpu_available", lambda: False)


@pytest.fixture(scope="module")
def kernel():
    return GpuKernel(hp.module())


def _names_what_runs_without_a_gpu(error: NoDevice) -> None:
    text = str(error)
    assert "Kernel.run_reference" in text and "mugraph.codegen.run_on_cpu" in text


# ---- no device -----------------------------------------------------------------------------------------------------

def test_gpu_available_is_false_without_a_gpu():
    import cupy
    if cupy.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_available() is False


def test_gpu_available_never_raises(monkeypatch):
    import cupy
    monkeypatch.setattr(cupy.cuda, "is_available", lambda: 1 / 0)
    assert gpu_available() is False


def test_load_kernel_raises_no_device_naming_the_cpu_paths(no_gpu):
    graph = ir.KernelGraph([ir.input("x", (4, 8), "float16").exp()])
    with pytest.raises(NoDevice) as info:
        load_kernel(graph)
    _names_what_runs_without_a_gpu(info.value)
    assert "cupy.cuda.is_available() is False" in str(info.value)


def test_kernel_call_raises_no_device(no_gpu, kernel):
    x, w = hp.inputs()
    with pytest.raises(NoDevice) as info:
        kernel(x, w)
    _names_what_runs_without_a_gpu(info.value)
    with pytest.raises(NoDevice):
        kernel.capture_graph(x, w)


def test_public_kernel_call_raises_no_device(no_gpu):
    from mugraph.api import Kernel
    graph = ir.KernelGraph([ir.input("x", (4, 8), "float16").exp()])
    with pytest.raises(NoDevice) as info:
        Kernel(graph, graph)(np.zeros((4, 8), np.float16))
    _names_what_runs_without_a_gpu(info.value)


def test_missing_cupy_is_no_device_too(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def without_cupy(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_cupy)
    assert gpu_available() is False
    with pytest.raises(NoDevice, match=r"mugraph\[cuda\]"):
        runtime_cupy.require_gpu()


# ---- arch choice ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,capability,chosen", [(None, "8.0", "sm_80"), (None, "8.6", "sm_80"),
                                                    (None, "9.0", "sm_90a"), (None, "12.0", "sm_90"),
                                                    ("sm_90", "9.0", "sm_90"), ("sm_80", "8.9", "sm_80"),
                                                    (None, None, "sm_90a")])
def test_arch_follows_the_device(arch, capability, chosen):
    from mugraph.codegen.device import for_device
    device = for_device(capability) if capability else None
    assert runtime_cupy._choose_arch(arch, device) == chosen


@pytest.mark.parametrize("arch,capability", [("sm_80", "9.0"), ("sm_90a", "10.0"), ("sm_90", "8.0"),
                                             ("sm_90a", "12.0")])
def test_a_binary_that_does_not_run_on_the_device_is_refused(arch, capability):
    from mugraph.codegen.device import for_device
    with pytest.raises(InvalidInput, match=f"cannot run on this compute capability {capability} device"):
        runtime_cupy._choose_arch(arch, for_device(capability))


# ---- plan and inputs (compiled with NVRTC, no GPU needed) --------------------------------------------------------

def test_handmade_module_compiles_and_its_plan_checks(kernel):
    assert set(kernel.compiled.kernels) == {"twice", "add_one"}
    assert kernel.compiled.resources("twice").spills == 0
    assert "3 launches: twice, matmul, add_one" in repr(kernel)


@pytest.mark.parametrize("arrays,message", [
    ([np.zeros((8, 128), np.float16)], r"takes 2 inputs \['X', 'W'\], got 1"),
    ([np.zeros((8, 64), np.float16), np.zeros((128, 64), np.float16)],
     r"input 'X' has shape \(8, 64\), the kernel expects \(8, 128\) float16"),
    ([np.zeros((8, 128), np.float32), np.zeros((128, 64), np.float16)],
     r"input 'X' has dtype float32, the kernel expects \(8, 128\) float16"),
    ([[1.0, 2.0], np.zeros((128, 64), np.float16)],
     r"input 'X' is a list, the kernel expects a \(8, 128\) float16 array"),
])
def test_inputs_are_checked_by_name_shape_and_dtype(kernel, arrays, message):
    with pytest.raises(InvalidInput, match=message):
        kernel.check_inputs(arrays)


def test_inputs_are_named_after_the_graph_when_given():
    graph = ir.KernelGraph([ir.input("activations", (8, 128), "float16").exp(),
                            ir.input("weights", (128, 64), "float16").exp()])
    k = GpuKernel(hp.module(), graph=graph)
    with pytest.raises(InvalidInput, match="input 'weights' has shape"):
        k.check_inputs([np.zeros((8, 128), np.float16), np.zeros((1, 64), np.float16)])


def test_matching_inputs_pass(kernel):
    kernel.check_inputs(hp.inputs())


def _launch(i, **changes):
    return hp.plan().kernels[i].__class__(**{**vars(hp.plan().kernels[i]), **changes})


@pytest.mark.parametrize("changes,error,field", [
    (dict(kernels=(_launch(0, args=("X", "Q")),)), InvalidGraph, r"plan.kernels\[0\].args\[1\]"),
    (dict(kernels=(_launch(0, name="thrice"),)), InvalidGraph, r"plan.kernels\[0\].name.*thrice"),
    (dict(kernels=(_launch(0, kind="fused"),)), InvalidGraph, r"plan.kernels\[0\].kind"),
    (dict(kernels=(_launch(1, library_op=None),)), InvalidGraph, r"plan.kernels\[0\]"),
    (dict(inputs=("X", "T")), InvalidGraph, r"plan.inputs\[1\]: 'T' is not an input buffer"),
    (dict(outputs=("Z",)), InvalidGraph, r"plan.outputs\[0\]: no buffer 'Z'"),
    (dict(buffers=hp.BUFFERS + hp.BUFFERS[:1]), InvalidGraph, r"plan.buffers"),
    (dict(kernels=(_launch(0, smem_bytes=400 * 1024),)), ResourceError, r"409600 bytes of dynamic shared"),
    (dict(kernels=(_launch(0, block=(2048, 1, 1)),)), ResourceError, r"2048 threads"),
    (dict(kernels=(_launch(0, cluster=(3, 1, 1)),)), InvalidGraph, r"grid \(8, 1, 1\) is not a whole number"),
    (dict(kernels=(_launch(0, cluster=(0, 1, 1)),)), InvalidGraph, r"plan.kernels\[0\].cluster"),
    (dict(kernels=(_launch(0, cluster=(32, 1, 1), grid=(32, 1, 1)),)), InvalidGraph, r"at most 16 blocks"),
])
def test_bad_plans_are_rejected_with_the_field(changes, error, field):
    with pytest.raises(error, match=field):
        GpuKernel(hp.module(**changes))


def test_a_plan_checks_against_the_binary_arch_s_shared_memory():
    """Built for an sm_120 GPU (99 KB per block), a launch asking 100 KB is refused before any GPU is touched."""
    with pytest.raises(ResourceError, match=r"102400 bytes of dynamic shared memory; sm_120 allows 101376"):
        GpuKernel(hp.module(kernels=(_launch(0, smem_bytes=100 * 1024),)), binary_arch="sm_120")
    kernel = GpuKernel(hp.module("sm_90"), binary_arch="sm_120")
    assert kernel.compiled.arch == "sm_120" and ".target sm_120" in kernel.compiled.ptx


def test_a_tensor_map_over_no_buffer_is_refused():
    from mugraph.codegen.hopper_layouts import SWIZZLE_NONE
    from mugraph.codegen.tma import TensorMapSpec
    spec = TensorMapSpec("Q", ir.DType.FLOAT16, (128, 8), (2, 256), (8, 8), SWIZZLE_NONE)
    with pytest.raises(InvalidGraph, match=r"plan.kernels\[0\].tensor_maps\[0\]: tensor map over no buffer 'Q'"):
        GpuKernel(hp.module(kernels=(_launch(0, tensor_maps=(spec,)),)))


# ---- driver launches (tensor maps by value, clusters): packed and configured without a GPU ----------------------

def test_kernel_params_hold_each_pointer_then_each_tensor_map_by_value():
    from mugraph.codegen.hopper_layouts import SWIZZLE_128B
    from mugraph.codegen.tma import TensorMapSpec
    spec = TensorMapSpec("X", ir.DType.FLOAT16, (64, 8), (2, 128), (64, 8), SWIZZLE_128B)
    maps = [spec.encode_cpu(0x10000), bytes(range(128))]
    params = runtime_cupy.KernelParams([0x7F0012345600, 0x20], maps)
    values = params.values()
    assert values[:2] == [(0x7F0012345600).to_bytes(8, "little"), (0x20).to_bytes(8, "little")]
    assert values[2:] == maps and params.sizes == (8, 8, 128, 128)
    import ctypes
    addresses = (ctypes.c_void_p * 4).from_address(params.address)
    assert all(a % 128 == 0 for a in addresses[2:])  # CUtensorMap's alignment
    with pytest.raises(InvalidInput, match="128 bytes"):
        runtime_cupy.KernelParams([1], [b"short"])


def test_launch_config_sets_the_cluster_attribute_only_for_a_cluster():
    pytest.importorskip("cuda.bindings.driver")
    launch = _launch(0, grid=(8, 2, 1), block=(384, 1, 1), smem_bytes=70_000, cluster=(2, 2, 1))
    config = runtime_cupy.launch_config(launch, stream=1234, cluster=launch.cluster)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (8, 2, 1)
    assert (config.blockDimX, config.sharedMemBytes, int(config.hStream)) == (384, 70_000, 1234)
    (attribute,) = config.attrs
    assert config.numAttrs == 1 and attribute.id.name == "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION"
    dims = attribute.value.clusterDim
    assert (dims.x, dims.y, dims.z) == (2, 2, 1)
    assert runtime_cupy.launch_config(launch, stream=0).numAttrs == 0  # compiled __cluster_dims__: no attribute


def test_only_tensor_maps_or_clusters_take_the_driver_path():
    from mugraph.codegen import generate
    from mugraph import workloads
    tma = generate(workloads.get("gqa_safe").small().reference(), "sm_90a").plan.kernels[0]
    plain = generate(workloads.get("gqa_safe").small().reference(), "sm_80").plan.kernels[0]
    assert runtime_cupy.needs_driver_launch(tma) and not runtime_cupy.needs_driver_launch(plain)
    assert runtime_cupy.needs_driver_launch(_launch(0, cluster=(2, 1, 1)))


def test_library_launch_of_an_op_without_an_entry_is_unsupported():
    custom = ir.KernelGraph([ir.input("x", (4, 8), "float16").exp()])
    node = custom.inputs[0]  # an INPUT node: never a library launch
    with pytest.raises(UnsupportedOp, match="input"):
        GpuKernel(hp.module(kernels=(_launch(1, library_op=node),)))


def test_cubin_files_are_content_addressed(tmp_path, monkeypatch):
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path))
    first = runtime_cupy.cubin_path(b"\x7fELF one")
    assert first.read_bytes() == b"\x7fELF one" and first.parent == tmp_path / "cubin"
    assert runtime_cupy.cubin_path(b"\x7fELF one") == first != runtime_cupy.cubin_path(b"\x7fELF two")


# ---- the library-op table ------------------------------------------------------------------------------------------

def test_every_kernel_op_but_input_and_custom_has_a_library_entry():
    assert set(LIBRARY_OPS) == (set(KOp) - NOT_LIBRARY) | set(TOp)
    for op in NOT_LIBRARY:
        with pytest.raises(UnsupportedOp):
            library_op(op)


def test_every_library_op_has_a_case():
    assert set(CASES) == set(LIBRARY_OPS)


@pytest.mark.parametrize("op", list(CASES), ids=lambda op: op.value)
def test_library_op_matches_the_interpreter_in_own_dtype(op):
    node, want, operands = case_arrays(op)
    out = np.full(node.shape, np.nan, node.dtype.numpy)
    library_op(op)(np, node, operands, out)
    np.testing.assert_array_equal(out, want)


# ---- a clustered launch's plan on the CPU harness (the same plan tests/gpu launches through both launchers) -----

@pytest.mark.parametrize("size", [2, 4])
def test_a_clustered_plan_runs_right_on_the_harness(size):
    from mugraph.codegen.cpu import build_cpu
    from mugraph.codegen.run_cpu import run_plan
    from tests.codegen import cluster_plan as cp
    module = cp.module(size)
    cpu = build_cpu(module.source, ["cluster_combine"])
    arrays = cp.inputs(size)
    got = run_plan(module, cpu, arrays)
    want = cp.expected(*arrays, size)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    kernel = GpuKernel(module)  # compiles for sm_90a and checks the plan (cluster tiles the grid) without a GPU
    assert kernel.compiled.arch == "sm_90a" and runtime_cupy.needs_driver_launch(module.plan.kernels[0])
