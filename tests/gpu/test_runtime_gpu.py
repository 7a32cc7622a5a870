"""The CuPy runtime on a real GPU, independent of the generator: a hand-written module (custom kernels, a
library matmul, intermediates), the array paths (NumPy, CuPy, JAX via DLPack), workspace reuse, CUDA graphs,
the library-op table, and the first GPU run of the hand-written tensor-core GEMM against the CPU harness,
which checks the mma/ldmatrix fragment layouts the shim emulates (TOOLCHAIN.md §4)."""
from __future__ import annotations

import shutil
from pathlib import Path

import cupy
import ml_dtypes
import numpy as np
import pytest

from mugraph.codegen.compile import compile_cuda
from mugraph.codegen.library_ops import LIBRARY_OPS
from mugraph.codegen.runtime_cupy import GpuKernel, device_arch, load_cubin
from mugraph.ir.errors import InvalidInput
from tests.codegen import handmade_plan as hp
from tests.codegen.library_cases import case_arrays

KERNELS = Path(__file__).resolve().parents[1] / "codegen" / "kernels"


@pytest.fixture(scope="module")
def kernel():
    k = GpuKernel(hp.module(device_arch() or "sm_90"))
    k.load()
    return k


def _close_to_expected(y, x, w) -> bool:
    want = hp.expected(x, w)
    return bool(np.abs(cupy.asnumpy(y).astype(np.float64) - want).max() <= 1e-2 * np.abs(want).max())


def test_handmade_module_runs_from_numpy_inputs(kernel):
    x, w = hp.inputs()
    (y,) = kernel(x, w)
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float16 and _close_to_expected(y, x, w)
    assert kernel.loader() == "cubin"


def test_outputs_are_the_reused_workspace_unless_copied(kernel):
    x, w = hp.inputs(1)
    (first,) = kernel(x, w)
    kept = first.copy()
    (copied,) = kernel(x, w, copy=True)
    (second,) = kernel(*hp.inputs(2))
    assert second is first  # overwritten in place: the documented contract
    assert copied is not first and cupy.array_equal(copied, kept)


def test_cupy_views_and_misaligned_inputs_are_copied_to_dense_arrays(kernel):
    x, w = hp.inputs(3)
    want = kernel(x, w, copy=True)[0]
    fortran = cupy.asfortranarray(cupy.asarray(x))
    shifted = cupy.zeros(x.size + 4, np.float16)[4:].reshape(x.shape)  # 8 bytes off a 16-byte boundary
    shifted[...] = cupy.asarray(x)
    for variant in (fortran, shifted):
        assert cupy.array_equal(kernel(variant, cupy.asarray(w))[0], want)


def test_jax_gpu_arrays_go_in_without_a_copy(kernel):
    jax = pytest.importorskip("jax")
    if jax.devices()[0].platform != "gpu":
        pytest.skip("JAX sees no GPU here")
    x, w = hp.inputs(4)
    want = kernel(x, w, copy=True)[0]
    xj, wj = jax.device_put(x), jax.device_put(w)
    bound = kernel.bind(xj, wj)
    assert bound.buffers["X"].data.ptr == xj.unsafe_buffer_pointer()  # zero-copy through DLPack
    assert cupy.array_equal(bound.launch()[0], want)


def test_wrong_inputs_are_rejected_on_the_gpu_too(kernel):
    x, w = hp.inputs()
    with pytest.raises(InvalidInput, match=r"input 'W' has shape \(64, 128\)"):
        kernel(cupy.asarray(x), cupy.asarray(w.T.copy()))


def test_cuda_graph_replays_the_plan_and_reads_inputs_in_place(kernel):
    x, w = hp.inputs(5)
    xs, ws = cupy.asarray(x), cupy.asarray(w)
    graph = kernel.capture_graph(xs, ws, repeat=3)
    assert graph.launches == 3
    out = graph.outputs[0]
    out.fill(np.nan)
    graph.replay()
    cupy.cuda.get_current_stream().synchronize()
    assert _close_to_expected(out, x, w)
    x2 = hp.inputs(6)[0]
    graph.bound[0].buffers["X"][...] = cupy.asarray(x2)  # new data, same addresses
    graph.replay()
    cupy.cuda.get_current_stream().synchronize()
    assert _close_to_expected(out, x2, w)


@pytest.mark.parametrize("op", list(LIBRARY_OPS), ids=lambda op: op.value)
def test_library_op_on_the_gpu_matches_the_interpreter(op):
    node, want, operands = case_arrays(op)
    out = cupy.full(node.shape, np.nan, node.dtype.numpy)
    LIBRARY_OPS[op](cupy, node, [cupy.asarray(a) for a in operands], out)
    np.testing.assert_allclose(cupy.asnumpy(out).astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)


# ---- the hand-written GEMM: fragment layouts on real tensor cores -------------------------------------------------

GEMM_SMEM = 16384
GEMM_DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("dtype", GEMM_DTYPES)
def test_handwritten_gemm_on_tensor_cores_matches_the_cpu_harness(dtype):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: the CPU harness needs it")
    from mugraph.codegen.cpu import build_cpu
    source, entry, (m, n, k) = (KERNELS / "gemm_tc.cu").read_text(), f"gemm_{dtype}", (128, 192, 128)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(GEMM_DTYPES[dtype])
    b = rng.uniform(-1, 1, (k, n)).astype(GEMM_DTYPES[dtype])

    function = load_cubin(compile_cuda(source, device_arch(), name="gemm_tc").cubin, [entry])[entry]
    c = cupy.full((m, n), np.nan, np.float32)
    args = (cupy.asarray(a.view(np.uint16)), cupy.asarray(b.view(np.uint16)), c, np.int32(n), np.int32(k))
    function((n // 64, m // 64, 1), (128, 1, 1), args, shared_mem=GEMM_SMEM)
    gpu = cupy.asnumpy(c)

    cpu = np.zeros((m, n), np.float32)
    build_cpu(source, entry).run(entry, [a, b, cpu, n, k], grid=(n // 64, m // 64), block=128, smem_bytes=GEMM_SMEM)

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = np.abs(a64) @ np.abs(b64)
    assert np.all(np.abs(gpu - a64 @ b64) <= 1e-3 * scale), "the GPU result is not the product: layouts are wrong"
    gap = float((np.abs(gpu.astype(np.float64) - cpu) / scale).max())
    print(f"gemm_{dtype} {m}x{n}x{k}: GPU vs CPU harness bit-identical={np.array_equal(gpu, cpu)}, "
          f"max |gpu - cpu| / sum|a||b| = {gap:.2e}")
    assert gap <= 1e-6, f"GPU and CPU harness differ by {gap:.2e} of sum|a||b| (HMMA rounds differently?)"
