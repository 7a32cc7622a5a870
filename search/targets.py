"""The GPUs the cost model knows: one frozen record of published limits and rates per target.

Every number cites where it comes from. Rates are peaks from NVIDIA's datasheets and
whitepapers; limits are the CUDA C++ Programming Guide's compute-capability table. Values
marked *lead* are estimates, not published or measured here: a device run should calibrate
them (see `Target.replace`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mugraph.ir.errors import InvalidInput

KB = 1024
MB = 1024 * 1024


@dataclass(frozen=True)
class Target:
    """One GPU: its peak rates, memory sizes, per-SM resource limits and codegen arch."""

    name: str
    arch: str                   # codegen target, e.g. "sm_90"
    sm_count: int
    clock_hz: float             # max boost clock; per-clock widths below scale by it
    tc_flops: float             # dense fp16/bf16 tensor-core peak (FLOP/s), what cuBLAS reaches
    mma_sync_flops: float       # tensor-core rate reachable with mma.sync (custom kernels)
    simt_flops: float           # fp32 non-tensor peak (FLOP/s; an FMA counts 2)
    hbm_bandwidth: float        # bytes/s, peak (the roofline uses it)
    hbm_efficiency: float       # share of the peak that streaming kernels reach (estimates)
    l2_bytes: int
    l2_bandwidth: float         # bytes/s, L2 -> SMs, all SMs together
    sm_load_bandwidth: float    # bytes/s one SM can pull from L2 (its fill path)
    hbm_latency_s: float        # loaded round trip of one global load (Little's law)
    smem_per_sm: int            # bytes a multiprocessor can give to shared memory
    smem_per_block: int         # bytes one block may opt in to
    smem_reserved_per_block: int  # bytes the runtime reserves in each resident block
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    launch_s: float             # per kernel, eager launches from the host
    graph_launch_s: float       # per kernel inside a CUDA graph

    def replace(self, **changes) -> "Target":
        """A copy with some fields changed (e.g. calibrated rates from a device run)."""
        return dataclasses.replace(self, **changes)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Tensor-core FLOPs per HBM byte above which a kernel is compute-bound."""
        return self.tc_flops / self.hbm_bandwidth


# Shared by sm_80 and sm_90 (CUDA C++ Programming Guide, "Features and Technical
# Specifications", table of technical specifications per compute capability 8.0 and 9.0):
# 64K 32-bit registers per SM, 255 registers per thread, 2048 resident threads per SM,
# 1024 threads per block, 32 resident blocks per SM; 1 KB of shared memory per block is
# reserved for the system (cudaDevAttrReservedSharedMemoryPerBlock = 1024 on 8.x and 9.0).
_COMMON = dict(regs_per_sm=65536, max_regs_per_thread=255, max_threads_per_sm=2048,
               max_threads_per_block=1024, max_blocks_per_sm=32, smem_reserved_per_block=1 * KB)

# Launch overhead (lead, not measured in this workplace): a dependent kernel launched
# eagerly from Python (CuPy) costs roughly 3-5 us of host + gap time; inside a CUDA graph
# the per-kernel gap falls to about 1 us (NVIDIA blog "Getting Started with CUDA Graphs",
# 2019, and common measurements). We take 4 us and 1 us.
_LAUNCH = dict(launch_s=4e-6, graph_launch_s=1e-6)

# Loaded HBM latency (lead): pointer-chase microbenchmarks put idle DRAM latency near
# 450-550 ns on A100/H100 (Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of
# Bandwidth", 2023; Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU
# Architecture", 2024); it rises under load. 600 ns means an H100 needs about 2 MB
# (15 KB per SM) in flight to saturate HBM.
_HBM_LATENCY = 600e-9

# Streaming kernels reach about 90% of peak HBM bandwidth: a device-to-device copy moved
# 4.3 TB/s of the H200's 4.8 here (KINDS.md, 2026-10-28 and 2026-11-04); we assume the same
# share on A100 and H100 (lead).
_HBM_EFFICIENCY = 0.9

# L2 -> SM widths: A100 whitepaper gives 5120 B/clk of L2 read bandwidth; Hopper's is not
# published, so we assume the same width per clock (lead). One SM's fill path: 64 B/clk (lead).
_L2_BYTES_PER_CLK = 5120
_SM_BYTES_PER_CLK = 64


def _target(name, arch, sm_count, clock_hz, **rates) -> Target:
    return Target(name=name, arch=arch, sm_count=sm_count, clock_hz=clock_hz,
                  l2_bandwidth=_L2_BYTES_PER_CLK * clock_hz,
                  sm_load_bandwidth=_SM_BYTES_PER_CLK * clock_hz,
                  hbm_latency_s=_HBM_LATENCY, hbm_efficiency=_HBM_EFFICIENCY,
                  **rates, **_COMMON, **_LAUNCH)


# A100 SXM4 80GB. NVIDIA A100 Tensor Core GPU datasheet (2021): FP16/BF16 tensor core
# 312 TFLOP/s dense (624 with sparsity), FP32 19.5 TFLOP/s, HBM2e 2,039 GB/s.
# NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 40 MB L2,
# 1410 MHz boost, up to 164 KB shared memory per SM. Programming Guide cc 8.0: 163 KB per
# block (opt-in). mma.sync is Ampere's native tensor-core path: full rate.
A100 = _target("a100", "sm_80", 108, 1.41e9,
               tc_flops=312e12, mma_sync_flops=312e12, simt_flops=19.5e12,
               hbm_bandwidth=2.039e12, l2_bytes=40 * MB,
               smem_per_sm=164 * KB, smem_per_block=163 * KB)

# H100 SXM5 80GB. NVIDIA H100 Tensor Core GPU datasheet (2023): FP16/BF16 tensor core
# 1,979 TFLOP/s with sparsity = 989 dense, FP32 67 TFLOP/s, HBM3 3.35 TB/s.
# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs (SXM5), 50 MB L2,
# 228 KB shared memory per SM; Programming Guide cc 9.0: 227 KB per block (opt-in).
# 1980 MHz max boost (the FP32 peak: 132 SMs x 128 lanes x 2 x 1.98 GHz = 66.9 TFLOP/s).
# mma.sync (not wgmma) reaches about 2/3 of the Hopper tensor-core peak (Shah et al.,
# "FlashAttention-3", 2024, section 2): 660 TFLOP/s for our custom kernels.
H100 = _target("h100", "sm_90", 132, 1.98e9,
               tc_flops=989e12, mma_sync_flops=660e12, simt_flops=67e12,
               hbm_bandwidth=3.35e12, l2_bytes=50 * MB,
               smem_per_sm=228 * KB, smem_per_block=227 * KB)

# H200 SXM 141GB. NVIDIA H200 Tensor Core GPU datasheet (2024): FP16/BF16 tensor core
# 1,979 TFLOP/s with sparsity = 989 dense, FP32 67 TFLOP/s, HBM3e 4.8 TB/s. The same GH100
# die as H100 SXM5 (132 SMs, cc 9.0 limits). L2: the datasheet is silent; we keep H100's
# 50 MB, though PyTorch reported 60 MB on this workplace's H200 (KINDS.md, 2026-10-28).
# Measured here (KINDS.md): device copy ~4.3 TB/s, bf16 GEMM 770-800 TFLOP/s on random data.
H200 = _target("h200", "sm_90", 132, 1.98e9,
               tc_flops=989e12, mma_sync_flops=660e12, simt_flops=67e12,
               hbm_bandwidth=4.8e12, l2_bytes=50 * MB,
               smem_per_sm=228 * KB, smem_per_block=227 * KB)

TARGETS: dict[str, Target] = {t.name: t for t in (A100, H100, H200)}


def get_target(target) -> Target:
    """A `Target` from itself or its name ("a100", "h100", "h200"; case-insensitive)."""
    if isinstance(target, Target):
        return target
    found = TARGETS.get(str(target).lower())
    if found is None:
        raise InvalidInput(f"unknown target {target!r}",
                           hint=f"use one of {', '.join(sorted(TARGETS))} or a Target record")
    return found
