"""The GPUs the cost model knows: one frozen record of limits and rates per target, read from the
calibration table (codegen/calibration.json), where every number says where it comes from: peaks
from NVIDIA's datasheets and whitepapers, limits from the CUDA C++ Programming Guide, *lead* for
estimates not published or measured here, *measured* for what `bench/gpu.py --calibrate` wrote.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mugraph.codegen import calibration
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
    tc_flops: float             # dense fp16/bf16 tensor-core peak (FLOP/s): the datasheet's, not a measured
                                # or reachable rate; library kernels (cuBLAS, XLA's) are charged at it, which
                                # favours the baseline
    mma_sync_flops: float       # reachable, not a peak: the tensor-core rate mma.sync reaches (custom kernels;
                                # its source names the measurement it comes from)
    simt_flops: float           # fp32 non-tensor peak (FLOP/s; an FMA counts 2)
    hbm_bandwidth: float        # bytes/s, peak (the roofline uses it)
    hbm_efficiency: float       # share of the peak that streaming kernels reach (estimates)
    l2_bytes: int
    l2_bandwidth: float         # bytes/s, L2 -> SMs, all SMs together
    sm_load_bandwidth: float    # bytes/s one SM can pull from L2 (its fill path)
    hbm_latency_s: float        # round trip of a kernel's first global load
    loaded_latency_s: float     # round trip while HBM streams near peak (Little's law: bytes in flight)
    smem_per_sm: int            # bytes a multiprocessor can give to shared memory
    smem_per_block: int         # bytes one block may opt in to
    smem_reserved_per_block: int  # bytes the runtime reserves in each resident block
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    sm_subpartitions: int       # processing blocks per SM (own scheduler, tensor core, FP32 lanes); a warp uses one
    launch_s: float             # per kernel, eager launches from Python (the secondary figure)
    graph_launch_s: float       # per kernel inside a CUDA graph / XLA command buffer
    jit_launch_s: float         # per kernel jax.jit launches from C++ outside a command buffer
    command_buffer_min_kernels: int  # XLA records a run of at least this many capturable kernels as one
    fp32_per_clk: int           # FP32 lanes of one SM (results per clock)
    int32_per_clk: int          # 32-bit integer lanes of one SM
    mufu_per_clk: int           # special-function unit results per clock per SM (ex2, lg2, rsqrt, rcp)
    smem_bytes_per_clk: int     # shared-memory bytes one SM serves per clock (one 128-byte wavefront)
    barrier_clk: int            # clocks a barrier costs a CTA when nothing else on its SM can issue (estimate)
    warps_to_fill_issue: int    # warps one scheduler needs to issue every clock (estimate)

    def replace(self, **changes) -> "Target":
        """A copy with some fields changed (e.g. calibrated rates from a device run)."""
        return dataclasses.replace(self, **changes)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Tensor-core FLOPs per HBM byte above which a kernel is compute-bound."""
        return self.tc_flops / self.hbm_bandwidth


# codegen's arch per GPU: Hopper's is sm_90a, whose kernels take TMA + wgmma where the model says it is faster
# (codegen.schedule / hopper_model) and cp.async + mma.sync elsewhere.
_ARCH = {"a100": "sm_80", "h100": "sm_90a", "h200": "sm_90a"}


def _from_table(name: str) -> Target:
    """A target from the calibration table (codegen/calibration.json: each number with its source)."""
    values = dict(calibration.constants(name))
    fields = {f.name for f in dataclasses.fields(Target)} - {"name", "arch"}
    missing = sorted(fields - set(values))
    if missing:
        raise InvalidInput(f"the calibration table lacks {', '.join(missing)} for {name}",
                           hint=f"add them to {calibration.table_path()}")
    counts = {f.name for f in dataclasses.fields(Target) if f.type == "int"}
    return Target(name=name, arch=_ARCH[name], **{k: int(values[k]) if k in counts else values[k] for k in fields})


def source(target, field: str) -> str:
    """Where a target's constant came from (the calibration table's note)."""
    return calibration.source(get_target(target).name, field)


A100, H100, H200 = (_from_table(n) for n in ("a100", "h100", "h200"))

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
