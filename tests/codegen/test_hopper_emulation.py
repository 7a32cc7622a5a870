"""The CPU harness's emulation of Hopper's instructions (sm90_intrin.cuh), lane by lane against an independent
reading of the PTX ISA's / CuTe's tables (tests/codegen/sm90_probes.py): wgmma's accumulator and A registers with
operands found through descriptors of every swizzle mode and both majors, TMA boxes (dense, swizzled on the shared
address, zero out of bounds), mbarrier phases and transaction counts, cluster ranks and distributed shared memory;
and the same probes through NVRTC for sm_90a."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from mugraph.codegen import hopper_layouts as H
from mugraph.codegen.compile import compile_cuda
from mugraph.codegen.cpu import KernelFault, build_cpu
from mugraph.codegen.run_cpu import aligned_empty
from mugraph.codegen.tma import TensorMapSpec
from mugraph.ir.dtypes import DType
from tests.codegen import sm90_probes as P

DTYPES = {"f16": (np.float16, DType.FLOAT16), "bf16": (ml_dtypes.bfloat16, DType.BFLOAT16)}


@pytest.fixture(scope="module")
def probes():
    return P.build()


# ---- wgmma -----------------------------------------------------------------------------------------------------------

def _place(image: np.ndarray, values: np.ndarray, address) -> None:
    """16-bit values[i, j] at byte address(i, j) of the image (bytes)."""
    bits = np.ascontiguousarray(values).view(np.uint16)
    for i, j in np.ndindex(*values.shape):
        a = address(i, j)
        image[a:a + 2] = np.frombuffer(bits[i, j].tobytes(), np.uint8)


def _strides(major: str, mode: H.SwizzleMode) -> tuple[int, int]:
    if major == "K":
        return (128, 256) if not mode.bits else (16, 8 * mode.width)
    return (128, 256) if not mode.bits else (16 * mode.width, 8 * mode.width)


WGMMA_CASES = [  # n, variant (P.VARIANTS), A's swizzle width, B's swizzle width, dtype
    (64, 1, 128, 128, "f16"), (64, 1, 128, 128, "bf16"), (256, 1, 128, 64, "f16"), (8, 0, 16, 16, "f16"),
    (64, 0, 32, 64, "bf16"), (64, 3, 64, 32, "f16"), (64, 2, 16, 128, "f16"), (256, 4, 16, 128, "f16"),
    (64, 5, 16, 16, "bf16"), (8, 5, 16, 32, "f16"),
]


@pytest.mark.parametrize("n,variant,a_width,b_width,dtype", WGMMA_CASES, ids=str)
def test_wgmma_emulation_lane_by_lane(probes, n, variant, a_width, b_width, dtype):
    np_dtype, _ = DTYPES[dtype]
    a_regs, trans_a, trans_b = P.VARIANTS[variant]
    rng = np.random.default_rng(n + variant)
    a = rng.integers(-4, 5, (64, 16)).astype(np_dtype)
    b = rng.integers(-4, 5, (16, n)).astype(np_dtype)
    c = rng.integers(-8, 9, (64, n)).astype(np.float32)
    a_mode, b_mode = H.SWIZZLES[a_width], H.SWIZZLES[b_width]
    a_major, b_major = ("MN" if trans_a else "K"), ("MN" if trans_b else "K")
    (a_lbo, a_sbo), (b_lbo, b_sbo) = _strides(a_major, a_mode), _strides(b_major, b_mode)
    a_off, b_off = 0, 16384
    image = np.zeros(b_off + 65536, np.uint8)  # room for 256 K-major rows of 128 bytes
    if not a_regs:
        _place(image, a, lambda m, k: P.gmma_address(a_major, a_mode.bits, a_off, a_lbo, a_sbo, m, k))
    _place(image, b, lambda k, j: P.gmma_address(b_major, b_mode.bits, b_off, b_lbo, b_sbo, j, k))
    regs = n // 2
    threads, values = np.meshgrid(np.arange(128), np.arange(regs), indexing="ij")
    where = np.vectorize(lambda t, v: P.wgmma_d_cute(n, t, v), otypes=[object])(threads, values)
    rows = np.vectorize(lambda x: x[0])(where)
    cols = np.vectorize(lambda x: x[1])(where)
    a_bits = a.view(np.uint16)
    reg = np.zeros((128, 4), np.uint32)
    for t, r in np.ndindex(128, 4):
        (m0, k0), (m1, k1) = P.wgmma_a_cute(t, 2 * r), P.wgmma_a_cute(t, 2 * r + 1)
        reg[t, r] = int(a_bits[m0, k0]) | int(a_bits[m1, k1]) << 16
    out = np.zeros((128, regs), np.float32)
    probes.run(f"wgmma_probe_{n}", [image, image.size, np.ascontiguousarray(c[rows, cols]), out, reg, a_off, a_lbo,
                                    a_sbo, a_mode.desc_code, b_off, b_lbo, b_sbo, b_mode.desc_code, variant,
                                    int(dtype == "bf16")], grid=1, block=128, smem_bytes=image.size)
    d = a.astype(np.float64) @ b.astype(np.float64) + c  # small integers: exact in any order
    np.testing.assert_array_equal(out, d[rows, cols].astype(np.float32))


def test_wgmma_without_a_fence_is_a_fault(probes):
    source = P.probe_source().replace("  mg_wgmma_fence();\n", "")
    module = build_cpu(source, ["wgmma_probe_8"])
    z = np.zeros(32768, np.uint8)
    with pytest.raises(KernelFault, match="without a wgmma.fence"):
        module.run("wgmma_probe_8", [z, z.size, np.zeros((128, 4), np.float32), np.zeros((128, 4), np.float32),
                                     np.zeros((128, 4), np.uint32), 0, 128, 256, 0, 16384, 128, 256, 0, 0, 0],
                   grid=1, block=128, smem_bytes=z.size)


# ---- TMA -------------------------------------------------------------------------------------------------------------

def _tma_expected(tensor: np.ndarray, spec: TensorMapSpec, coords) -> np.ndarray:
    """The box as the PTX ISA describes it: elements innermost first, zero out of bounds, each at its dense byte
    offset swizzled (CuTe's Swizzle<B, 4, 3>) -- read independently of the shim."""
    item = spec.dtype.itemsize
    image = np.zeros(spec.box_bytes, np.uint8)
    flat = tensor.view(np.uint8).reshape(-1)
    for e, idx in enumerate(itertools.product(*[range(b) for b in reversed(spec.box)])):
        g = [c + i for c, i in zip(coords, reversed(idx))]  # innermost first
        if all(0 <= x < d for x, d in zip(g, spec.dims)):
            src = sum(x * s for x, s in zip(g, spec.strides))
            value = flat[src:src + item]
        else:
            value = np.zeros(item, np.uint8)
        at = P.cute_swizzle(spec.swizzle.bits, 4, 3, e * item)
        image[at:at + item] = value
    return image


TMA_CASES = [  # dtype, tensor shape (outermost first), box (innermost first), swizzle width, coords (innermost first)
    ("f16", (40, 200), (64, 16), 128, (16, 8)),
    ("f16", (40, 200), (64, 16), 128, (176, 30)),   # past the last column and the last row: zeros
    ("f16", (40, 200), (64, 16), 128, (-8, -3)),    # before the first: zeros
    ("f16", (3, 24, 96), (32, 8, 2), 64, (64, 16, 2)),
    ("f16", (8, 64), (16, 8), 32, (48, 0)),
    ("f16", (8, 64), (8, 8), 16, (40, 3)),
    ("f32", (16, 64), (32, 8), 128, (32, 4)),
    ("f32", (2, 3, 16, 64), (8, 4, 2, 2), 16, (56, 14, 1, 1)),
]


@pytest.mark.parametrize("dtype,shape,box,width,coords", TMA_CASES, ids=str)
def test_tma_box_lands_dense_swizzled_and_zero_filled(probes, dtype, shape, box, width, coords):
    np_dtype = {"f16": np.float16, "f32": np.float32}[dtype]
    ir_dtype = {"f16": DType.FLOAT16, "f32": DType.FLOAT32}[dtype]
    tensor = aligned_empty(shape, np_dtype)
    tensor[...] = np.arange(np.prod(shape)).reshape(shape).astype(np_dtype)
    item = tensor.itemsize
    dims = tuple(reversed(shape))
    strides = tuple(reversed(tuple(s for s in tensor.strides)))
    spec = TensorMapSpec("x", ir_dtype, dims, strides, box, H.SWIZZLES[width])
    out = np.zeros(spec.box_bytes, np.uint8)
    c = list(coords) + [0] * (5 - len(coords))
    for landing in ("wait", "commit"):
        probes.run("tma_probe", [tensor, out, len(dims), *c, spec.box_bytes, 32768, spec.encode_cpu(tensor.ctypes.data)],
                   grid=1, block=64, smem_bytes=32768 + 64, cp_async=landing)
        np.testing.assert_array_equal(out, _tma_expected(tensor, spec, coords))
    assert item in (2, 4)


def test_tma_rejects_a_map_not_encoded_for_the_harness(probes):
    with pytest.raises(KernelFault, match="not encoded for the CPU harness"):
        probes.run("tma_probe", [None, np.zeros(64, np.uint8), 1, 0, 0, 0, 0, 0, 64, 1024, bytes(128)], grid=1, block=32,
                   smem_bytes=2048)


# ---- mbarrier ----------------------------------------------------------------------------------------------------------

INIT, ARRIVE, ARRIVE_TX, TEST, TMA = 1, 2, 3, 5, 6
BOX_BYTES = 128  # the probe's map: a 64 x 1 fp16 box
# (script, what test_wait.parity answers, in order) -- read off the PTX ISA's mbarrier description: a phase
# completes when its pending arrivals and its transaction count both reach zero; then the phase advances and the
# pending count is reloaded; test_wait.parity p is true when the phase of parity p has completed, i.e. the current
# phase's parity is not p (before any completion, "phase -1" of parity 1 counts as completed).
MBARRIER_SCRIPTS = [
    ([INIT, 2, TEST, 0, TEST, 1, ARRIVE, TEST, 0, ARRIVE, TEST, 0, TEST, 1], [0, 1, 0, 1, 0]),
    ([INIT, 1, ARRIVE_TX, 128, TEST, 0, TMA, TEST, 0, TEST, 1], [0, 1, 0]),
    ([INIT, 1, TMA, ARRIVE_TX, 128, TEST, 0], [1]),  # complete_tx before expect_tx: tx goes negative, then to zero
    ([INIT, 2, ARRIVE_TX, 256, TMA, ARRIVE, TEST, 0, TMA, TEST, 0, ARRIVE, TEST, 1, ARRIVE, TEST, 1, TEST, 0],
     [0, 1, 0, 1, 0]),
]


@pytest.mark.parametrize("script,answers", MBARRIER_SCRIPTS, ids=lambda x: str(x)[:40])
def test_mbarrier_phases_and_transaction_counts(probes, script, answers):
    spec = TensorMapSpec("x", DType.FLOAT16, (64, 4), (2, 128), (64, 1), H.SWIZZLE_NONE)
    tensor = aligned_empty((4, 64), np.float16)
    tensor[...] = 1
    out = np.full(16, -1, np.int32)
    program = np.array(script + [0], np.int32)
    probes.run("mbarrier_probe", [tensor, program, out, spec.encode_cpu(tensor.ctypes.data)], grid=1, block=32,
               smem_bytes=2048, cp_async="commit")
    assert out[:len(answers)].tolist() == answers and (out[len(answers):] == -1).all()
    assert spec.box_bytes == BOX_BYTES


def test_more_arrivals_than_the_count_is_a_fault(probes):
    spec = TensorMapSpec("x", DType.FLOAT16, (64, 4), (2, 128), (64, 1), H.SWIZZLE_NONE)
    with pytest.raises(KernelFault, match="more arrivals"):
        probes.run("mbarrier_probe", [None, np.array([INIT, 1, ARRIVE_TX, 64, ARRIVE, 0], np.int32), np.zeros(4, np.int32),
                                      spec.encode_cpu(0)], grid=1, block=32, smem_bytes=2048)


# ---- clusters --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("schedule", ["rr", "warpgreedy"])
def test_cluster_ranks_dsmem_and_a_split_combine(probes, size, schedule):
    blocks, n = 8, 40
    rng = np.random.default_rng(size)
    part = rng.uniform(-1, 1, (blocks, n)).astype(np.float32)
    pmax = rng.uniform(-2, 2, blocks).astype(np.float32)
    out, seen = np.zeros((blocks // size, n), np.float32), np.zeros(blocks, np.float32)
    ranks = np.zeros(blocks, np.uint32)
    probes.run("cluster_probe", [part, pmax, out, seen, ranks, n], grid=blocks, block=64, smem_bytes=4 * (n + 1),
               cluster=(size, 1, 1), schedule=schedule, seed=3)
    assert ranks.tolist() == [b % size for b in range(blocks)]
    right = [b // size * size + (b % size + 1) % size for b in range(blocks)]
    np.testing.assert_array_equal(seen, part[right, 0])
    groups = pmax.reshape(-1, size)
    weights = np.exp(groups - groups.max(axis=1, keepdims=True))[..., None]
    want = (part.reshape(-1, size, n) * weights).sum(axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_grid_that_is_not_whole_clusters_is_refused(probes):
    with pytest.raises(KernelFault, match="whole number of clusters"):
        probes.run("cluster_probe", [np.zeros((6, 4), np.float32), np.zeros(6, np.float32), np.zeros((2, 4),
                   np.float32), np.zeros(6, np.float32), np.zeros(6, np.uint32), 4], grid=6, block=32,
                   smem_bytes=64, cluster=(4, 1, 1))


# ---- the same probes through NVRTC -----------------------------------------------------------------------------------

def test_the_probes_compile_for_sm_90a_to_hopper_sass():
    kernel = compile_cuda(P.probe_source(), "sm_90a", name="sm90_probes")
    assert set(P.entries()) <= set(kernel.kernels)
    assert all(r.spills == 0 for r in kernel.kernels.values())
    try:
        ops = kernel.opcodes()
    except Exception as e:  # cuobjdump / nvdisasm missing: the compile itself is the check
        pytest.skip(f"no SASS tools: {e}")
    names = {op.split(".")[0] for op in ops}
    assert {"HGMMA", "UTMALDG", "SYNCS", "WARPGROUP"} <= names, names
