"""The CPU harness: the hand-written tensor-core GEMM and other kernels against NumPy, every injected bug class
caught, every shim fault a typed error that leaves the process running, and the build cache."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mugraph.codegen import cpu
from mugraph.codegen.cpu import KernelFault, build_cpu
from mugraph.ir.errors import CompileError, InvalidInput

KERNELS = Path(__file__).parent / "kernels"
GEMM_SOURCE = (KERNELS / "gemm_tc.cu").read_text()
GEMM_SMEM = 16384
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture(scope="module")
def gemm():
    return build_cpu(GEMM_SOURCE, ["gemm_f16", "gemm_bf16"])


@pytest.fixture(scope="module")
def probes():
    return build_cpu((KERNELS / "probes.cu").read_text(), ["convert_probe", "zfill_probe", "landing_probe"])


@pytest.fixture(scope="module")
def faults():
    names = ["divergent_collectives", "cp_async_at", "store_past_end", "mma_after_exit", "ldmatrix_partial_warp",
             "recurse"]
    return build_cpu((KERNELS / "faults.cu").read_text(), names)


def gemm_operands(m, n, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (k, n)).astype(dtype)


def run_gemm(module, a, b, entry="gemm_f16", **launch) -> np.ndarray:
    (m, k), n = a.shape, b.shape[1]
    c = np.zeros((m, n), np.float32)
    module.run(entry, [a, b, c, n, k], grid=(n // 64, m // 64), block=128, smem_bytes=GEMM_SMEM, **launch)
    return c


def matches_numpy(a, b, c) -> bool:
    """Within 1e-3 of sum |a||b| of the float64 product (HMMA's internal order differs from the emulation's)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return bool(np.all(np.abs(c - a64 @ b64) <= 1e-3 * (np.abs(a64) @ np.abs(b64))))


# ---- the GEMM ------------------------------------------------------------------------------------------------------

SCHEDULES = [("rr", 0), ("reverse", 0), ("random", 1), ("warpgreedy", 1), ("warpgreedy", 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("schedule,seed", SCHEDULES)
def test_gemm_matches_numpy(gemm, dtype, schedule, seed):
    a, b = gemm_operands(128, 128, 128, DTYPES[dtype])
    assert matches_numpy(a, b, run_gemm(gemm, a, b, f"gemm_{dtype}", schedule=schedule, seed=seed))


def test_gemm_result_does_not_depend_on_schedule_or_workers(gemm):
    a, b = gemm_operands(64, 192, 96, np.float16, seed=3)
    first = run_gemm(gemm, a, b, workers=1)
    assert matches_numpy(a, b, first)
    for launch in (dict(workers=2), dict(schedule="warpgreedy", seed=5, workers=2), dict(schedule="reverse")):
        np.testing.assert_array_equal(run_gemm(gemm, a, b, **launch), first)


def test_gemm_runs_on_portable_ucontext_fibers():
    module = build_cpu(GEMM_SOURCE, "gemm_f16", fast_switch=False, pch=False)
    a, b = gemm_operands(64, 64, 64, np.float16)
    assert matches_numpy(a, b, run_gemm(module, a, b, schedule="warpgreedy", seed=1))


# ---- injected bugs -------------------------------------------------------------------------------------------------

# Bugs that corrupt results silently, and the schedules under which the harness must see the corruption.
SILENT_BUGS = {
    "BUG_NO_WAIT": [("rr", 0), ("warpgreedy", 1)],  # copies land only at a wait_group
    "BUG_NO_SYNC_BEFORE_READ": [("warpgreedy", 1), ("warpgreedy", 2), ("warpgreedy", 3)],
    "BUG_NO_SYNC_AFTER_READ": [("warpgreedy", 1), ("warpgreedy", 2), ("warpgreedy", 3)],
    "BUG_LDMATRIX_ROW": [("rr", 0)],
}
TYPED_BUGS = {"BUG_MISALIGNED": "misaligned", "BUG_HALF_WARP_MMA": "deadlock"}


@pytest.fixture(scope="module")
def bug_builds():
    with ThreadPoolExecutor(2) as pool:  # g++ runs in subprocesses: build the variants two at a time
        futures = {bug: pool.submit(build_cpu, GEMM_SOURCE, "gemm_f16", defines=[bug])
                   for bug in [*SILENT_BUGS, *TYPED_BUGS]}
        return {bug: f.result() for bug, f in futures.items()}


@pytest.mark.parametrize("bug", SILENT_BUGS)
def test_silent_bug_gives_wrong_results(bug_builds, bug):
    a, b = gemm_operands(128, 128, 128, np.float16)
    for schedule, seed in SILENT_BUGS[bug]:
        assert not matches_numpy(a, b, run_gemm(bug_builds[bug], a, b, schedule=schedule, seed=seed)), \
            f"{bug} went unnoticed under {schedule} seed {seed}"


@pytest.mark.parametrize("bug", TYPED_BUGS)
def test_fault_bug_raises_a_typed_error_and_the_process_survives(bug_builds, gemm, bug):
    a, b = gemm_operands(128, 128, 128, np.float16)
    with pytest.raises(KernelFault) as info:
        run_gemm(bug_builds[bug], a, b)
    assert info.value.kind == TYPED_BUGS[bug] and "block (" in str(info.value)
    assert matches_numpy(a, b, run_gemm(gemm, a, b))  # the harness still works afterwards


def test_deadlock_report_names_where_each_lane_waits(bug_builds):
    a, b = gemm_operands(64, 64, 32, np.float16)
    with pytest.raises(KernelFault, match=r"lanes 0-15 wait in mma\.sync.*lanes 16-31 wait in __syncthreads"):
        run_gemm(bug_builds["BUG_HALF_WARP_MMA"], a, b)


# ---- warp shuffles -------------------------------------------------------------------------------------------------

def test_shuffle_row_reduction_matches_numpy():
    module = build_cpu((KERNELS / "row_reduce.cu").read_text(), "row_softmax_stats")
    rows, cols = 37, 100  # 37 rows: the last block's last three warps have no row and exit at once
    x = np.random.default_rng(1).normal(0, 3, (rows, cols)).astype(np.float32)
    row_max, row_sumexp = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    lane_sums = np.zeros((rows, 32), np.float32)
    module.run(None, [x, row_max, row_sumexp, lane_sums, rows, cols], grid=(rows + 3) // 4, block=128,
               schedule="random", seed=2)
    np.testing.assert_array_equal(row_max, x.max(axis=1))
    np.testing.assert_allclose(row_sumexp, np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(lane_sums, np.repeat(row_sumexp[:, None], 32, axis=1))  # butterfly: all lanes


# ---- conversions and cp.async ---------------------------------------------------------------------------------------

def conversion_inputs() -> np.ndarray:
    """Every half as a float, the midpoint above each (ties), and random float32 bit patterns."""
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float64))
    ties = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)
    noise = np.random.default_rng(0).integers(0, 2**32, 2**16, dtype=np.uint32).view(np.float32)
    return np.concatenate([halves, ties, noise])


def assert_same_bits_or_both_nan(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16 if got.itemsize == 2 else np.uint32),
                                  want[~nan].view(np.uint16 if want.itemsize == 2 else np.uint32))


def test_conversions_round_to_nearest_even_like_numpy(probes):
    f = conversion_inputs()
    n = f.size
    bits = np.resize(np.arange(2**16, dtype=np.uint16), n)
    f2h, f2b = np.zeros(n, np.float16), np.zeros(n, ml_dtypes.bfloat16)
    h2f, b2f = np.zeros(n, np.float32), np.zeros(n, np.float32)
    probes.run("convert_probe", [f, f2h, f2b, bits, h2f, bits, b2f, n], grid=16, block=256)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan inputs are part of the point
        want_f2h, want_f2b = f.astype(np.float16), f.astype(ml_dtypes.bfloat16)
    assert_same_bits_or_both_nan(f2h, want_f2h)
    assert_same_bits_or_both_nan(f2b, want_f2b)
    assert_same_bits_or_both_nan(h2f, bits.view(np.float16).astype(np.float32))
    assert_same_bits_or_both_nan(b2f, bits.view(ml_dtypes.bfloat16).astype(np.float32))


def test_cp_async_zfill_copies_a_prefix_and_zeroes_the_rest(probes):
    src = np.random.default_rng(0).integers(1, 256, (32, 16), dtype=np.uint8)
    src_bytes = (np.arange(32) % 17).astype(np.int32)
    out = np.full((32, 16), 0xEE, np.uint8)
    probes.run("zfill_probe", [src, out, src_bytes], grid=1, block=32, smem_bytes=512)
    keep = np.arange(16)[None, :] < src_bytes[:, None]
    np.testing.assert_array_equal(out, np.where(keep, src, 0))


@pytest.mark.parametrize("landing,visible_before_wait", [("wait", False), ("commit", True)])
def test_cp_async_lands_by_policy(probes, landing, visible_before_wait):
    src, out = np.arange(1, 5, dtype=np.float32), np.zeros(8, np.float32)
    probes.run("landing_probe", [src, out], grid=1, block=1, smem_bytes=16, cp_async=landing)
    np.testing.assert_array_equal(out[4:], src)
    if visible_before_wait:
        np.testing.assert_array_equal(out[:4], src)
    else:
        assert np.isnan(out[:4]).all()  # fresh shared memory is poisoned with NaN


# ---- faults --------------------------------------------------------------------------------------------------------

FAULTS = [
    ("divergent_collectives", lambda out: [out], dict(block=32), "divergent_collective", "shfl.sync.bfly"),
    ("cp_async_at", lambda src: [src, 256, 0], dict(block=32, smem_bytes=256), "smem_out_of_bounds", r"\[256, 272\)"),
    ("cp_async_at", lambda src: [src, -16, 0], dict(block=32, smem_bytes=256), "smem_out_of_bounds", r"\[-16, 0\)"),
    ("cp_async_at", lambda src: [src, 8, 0], dict(block=32, smem_bytes=256), "misaligned", "shared memory byte 8"),
    ("cp_async_at", lambda src: [src, 256, 5], dict(grid=8, block=32, smem_bytes=256, workers=2),
     "smem_out_of_bounds", r"block \(5,0,0\)"),
    ("store_past_end", lambda _: [64], dict(block=32, smem_bytes=256), "smem_out_of_bounds", "byte offset 256"),
    ("mma_after_exit", lambda out: [out], dict(block=32), "deadlock", "lanes 16-31 exited"),
    ("ldmatrix_partial_warp", lambda out: [out], dict(block=48, smem_bytes=256), "bad_launch", "has 16"),
    ("recurse", lambda out: [out, 6], dict(block=32, stack_bytes=16384), "stack_overflow", "stack_bytes"),
]


@pytest.mark.parametrize("entry,args,launch,kind,detail", FAULTS, ids=[f"{f[0]}-{f[3]}" for f in FAULTS])
def test_shim_faults_are_typed_errors(faults, entry, args, launch, kind, detail):
    buffer = np.zeros(1024, np.float32)
    launch = dict(grid=1) | launch
    with pytest.raises(KernelFault, match=detail) as info:
        faults.run(entry, args(buffer), **launch)
    assert info.value.kind == kind and info.value.hint


def test_the_process_survives_every_fault_and_keeps_working(faults, gemm):
    for entry, args, launch, kind, _ in FAULTS:
        with pytest.raises(KernelFault):
            faults.run(entry, args(np.zeros(1024, np.float32)), **(dict(grid=1) | launch))
    a, b = gemm_operands(64, 64, 64, np.float16)
    assert matches_numpy(a, b, run_gemm(gemm, a, b))


# ---- launch arguments and builds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args,launch,message", [
    ([1], {}, "takes 5 arguments"),
    (["A", "B", "C", 64, 64], {}, "pointer"),
    ([None, None, None, 64.5, 64], {}, "integer"),
    ([None, None, None, 2**40, 64], {}, "does not fit"),
    ([np.zeros((8, 8))[:, ::2], None, None, 64, 64], {}, "C-contiguous"),
    ([None] * 3 + [64, 64], dict(block=2048), "at most 1024"),
    ([None] * 3 + [64, 64], dict(schedule="fifo"), "unknown schedule"),
    ([None] * 3 + [64, 64], dict(smem_bytes=10**6), "smem_bytes"),
])
def test_bad_launch_arguments_raise_invalid_input(gemm, args, launch, message):
    launch = dict(grid=1, block=128) | launch
    with pytest.raises(InvalidInput, match=message):
        gemm.run("gemm_f16", args, **launch)


def test_signature_and_entries(gemm):
    assert gemm.entries == ("gemm_f16", "gemm_bf16") and gemm.signature("gemm_f16") == "pppii"
    with pytest.raises(InvalidInput, match="entries: gemm_f16, gemm_bf16"):
        gemm.run("gemm", [], grid=1, block=1)


def test_gxx_error_raises_compile_error_with_excerpt_and_repro(tmp_path):
    source = GEMM_SOURCE.replace("mg_cp_async_commit();", "mg_cp_async_comit();", 1)
    line = source[:source.index("mg_cp_async_comit")].count("\n") + 1
    with pytest.raises(CompileError) as info:
        build_cpu(source, "gemm_f16", cache_dir=tmp_path)
    error = info.value
    assert "mg_cp_async_comit" in error.log and f"> {line:5d} |" in error.source_excerpt
    assert error.repro.startswith("g++ ") and "-DMG_SHIM_FASTSWITCH" in error.repro


def test_builds_are_cached_with_a_precompiled_header(tmp_path):
    source = (KERNELS / "row_reduce.cu").read_text()
    first = build_cpu(source, "row_softmax_stats", cache_dir=tmp_path)
    assert first.build_seconds > 0 and list(tmp_path.glob("pch/*/tc_intrin.cuh.gch"))
    cpu.clear_memo()
    again = build_cpu(source, "row_softmax_stats", cache_dir=tmp_path)
    assert again.path == first.path and again.build_seconds == 0.0


def test_kernel_fault_is_a_public_typed_error():
    from mugraph.errors import KernelFault as Public, MugraphError
    assert Public is KernelFault and issubclass(KernelFault, MugraphError)
