"""Per-architecture data for the code generator: the limits a kernel must fit and the numbers that size it.

sm_80 and sm_90 run the same generated logic (cp.async, ldmatrix, mma.sync); only these numbers change. sm_90a
adds Hopper's instructions (``FEATURES``): its kernels may take the TMA + wgmma path (hopper_pipeline, wgmma), which
the schedule weighs against the cp.async + mma.sync one (hopper_model). The sizing numbers (SM count, the bytes an
SM must keep in flight) come from the calibration table, for the most demanding GPU of each arch
(``calibration.SIZING_TARGET``: the A100 for sm_80, the H200 for sm_90 and sm_90a).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from mugraph.codegen import calibration
from mugraph.codegen.compile import TARGETS
from mugraph.codegen.issue import IssueUnits
from mugraph.ir.errors import InvalidInput

DEFAULT_DYNAMIC_SMEM = 48 * 1024  # above this a launcher must raise the kernel's max-dynamic-smem attribute
MAX_STAGES = 16                   # cp.async buffers per loop-walked tile, at most


@dataclass(frozen=True)
class ArchSpec:
    """What the generator needs to know about one target architecture."""

    name: str
    smem_limit: int          # dynamic shared memory one block may opt in to (bytes)
    max_threads: int         # threads per block
    sm_count: int = 1        # multiprocessors of the sizing GPU
    smem_per_sm: int = 0     # shared memory of one multiprocessor (bytes)
    threads_per_sm: int = 2048  # resident threads of one multiprocessor
    regs_per_sm: int = 65536  # 32-bit registers of one multiprocessor
    inflight_per_sm: int = 0  # bytes an SM keeps in flight to stream HBM at full rate (bandwidth x latency)
    hbm_rate: float = 0.0    # bytes/s streaming kernels reach (peak x efficiency)
    sm_fill_rate: float = 0.0  # bytes/s one SM pulls from L2
    mma_rate: float = 0.0    # tensor-core FLOP/s of one SM with mma.sync
    handoff_s: float = 0.0   # a split loop's hand-over: partials fenced, counted in, first read (s)
    latency_s: float = 1.0   # the latency a load sees while HBM streams (s): in flight / latency = rate
    idle_latency_s: float = 1.0  # ... while the grid keeps too little in flight to load HBM (s)
    subpartitions: int = 4   # processing blocks per SM: fewer resident warps leave tensor cores idle
    max_stages: int = MAX_STAGES
    smem_align: int = 128    # every shared buffer starts on a 128-byte line (swizzles assume it)
    fp32_matmul: str = "bf16x3"  # fp32 x fp32 block matmuls: "bf16x3" (tensor cores) or "simt" (exact fp32)
    split_loops: bool = True  # split a short grid's loop over several CTAs (split-K / split-KV)
    tma: bool = False        # TMA copies (cp.async.bulk.tensor) and mbarriers: a warp-specialised pipeline
    wgmma: bool = False      # wgmma.mma_async from shared-memory descriptors (sm_90a only)
    wgmma_rate: float = 0.0  # tensor-core FLOP/s of one SM with wgmma
    clock_hz: float = 1.0    # the sizing GPU's boost clock (instruction issue per second)
    issue: IssueUnits | None = None  # the sizing GPU's issue resources (lanes per unit, barrier cost)


# What an arch adds to the logic every arch runs (the "a" of sm_90a: instructions that exist on sm_90a only).
FEATURES: Mapping[str, Mapping[str, bool]] = MappingProxyType({"sm_90a": {"tma": True, "wgmma": True}})


def _spec(name: str, limit: int, threads: int) -> ArchSpec:
    c = calibration.constants(calibration.SIZING_TARGET[name])
    inflight = c["hbm_bandwidth"] * c["hbm_efficiency"] * c["loaded_latency_s"] / c["sm_count"]
    return ArchSpec(name, smem_limit=limit, max_threads=threads, sm_count=int(c["sm_count"]),
                    wgmma_rate=c["tc_flops"] / c["sm_count"], clock_hz=c["clock_hz"], **FEATURES.get(name, {}),
                    smem_per_sm=int(c["smem_per_sm"]), threads_per_sm=int(c["max_threads_per_sm"]),
                    regs_per_sm=int(c["regs_per_sm"]),
                    inflight_per_sm=int(inflight),
                    hbm_rate=c["hbm_bandwidth"] * c["hbm_efficiency"], sm_fill_rate=c["sm_load_bandwidth"],
                    mma_rate=c["mma_sync_flops"] / c["sm_count"], handoff_s=c["hbm_latency_s"],
                    latency_s=c["loaded_latency_s"], idle_latency_s=c["hbm_latency_s"], subpartitions=int(c["sm_subpartitions"]),
                    issue=IssueUnits.of(c))


ARCHS: Mapping[str, ArchSpec] = MappingProxyType({
    name: _spec(name, t.max_smem_per_block, t.max_threads_per_block) for name, t in TARGETS.items()})


def get_arch(arch) -> ArchSpec:
    """The spec of ``arch`` (a name, or an ArchSpec, e.g. a variant made with dataclasses.replace)."""
    if isinstance(arch, ArchSpec):
        return arch
    spec = ARCHS.get(arch)
    if spec is None:
        raise InvalidInput(f"unsupported arch {arch!r}", hint=f"one of: {', '.join(ARCHS)}")
    return spec
