"""What tells sm_90a's two code paths apart, for the schedule's choice between them (codegen.schedule) and the
search's cost model (search/cost.py's hook): the tensor-core rate each reaches, the bytes in flight each keeps, and
the instructions a loop trip issues on each.

Per CTA and loop trip (warp instructions; an SM issues ``ISSUE_PER_CLOCK`` per clock):

* cp.async path: every 16-byte chunk of the trip's tiles is one cp.async plus its address arithmetic
  (``COPY_ADDRESS_OPS``), plus a wait and a barrier; products are mma.sync m16n8k16 with their ldmatrix
  (``LDMATRIX_PER_MMA``), at the mma.sync rate (``ArchSpec.mma_rate``, about 2/3 of Hopper's peak).
* TMA path: one thread of the producer warpgroup issues a box copy per swizzled column block with its coordinates
  (``TMA_OPS_PER_BOX``); each consumer warp waits on the stage's mbarrier and releases it (``MBARRIER_OPS``):
  no copy instruction or address arithmetic per chunk. Products that fit wgmma issue one m64nNk16 per warpgroup
  (every warp issues it) with two descriptors, at the full tensor-core rate (``ArchSpec.wgmma_rate``); all
  ``stages`` tiles can be in flight (the producer refills a stage as soon as it is released).

The busiest SM's time is the largest of its issue time, its tensor-core time, its L2 -> SM fill and the loop's HBM
bytes at the rate the bytes in flight sustain (Little's law), as in ``schedule.choose_splits``; between paths equal
on that, the one that issues less (more slack for everything the model leaves out). The instruction counts are
estimates from the instruction shapes, not measured.
"""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.codegen.arch import ArchSpec
from mugraph.codegen.layouts import ceil_div

ISSUE_PER_CLOCK = 4       # warp instructions an SM issues per clock: one per processing block (H100 whitepaper)
COPY_ADDRESS_OPS = 3      # integer instructions per cp.async chunk: row, column, offset (estimate)
BARRIER_OPS = 2           # a cp.async wait and a __syncthreads per trip, per warp
LDMATRIX_PER_MMA = 1.0    # ldmatrix.x4 per mma.sync m16n8k16 of a warp (A and B fragments, estimate)
TMA_OPS_PER_BOX = 3       # the copy and its coordinates, by one producer thread (estimate)
MBARRIER_OPS = 2          # per consumer warp and trip: the full wait and the empty arrive
WGMMA_N = 64              # the n an average wgmma covers, to count its instructions (estimate)
MMA_SYNC_FLOPS = 2 * 16 * 8 * 16


def trip_issue(s, warps: int, sync_flops: int, wgmma_flops: int) -> float:
    """Warp instructions one CTA issues per loop trip on its path."""
    if s.tma:
        copies = ceil_div(s.stage_bytes, 8192) * TMA_OPS_PER_BOX + MBARRIER_OPS * warps
    else:
        copies = ceil_div(s.stage_bytes, 16) * (1 + COPY_ADDRESS_OPS) / 32 + BARRIER_OPS * warps
    mma = sync_flops / MMA_SYNC_FLOPS * (1 + LDMATRIX_PER_MMA)
    wgmma = wgmma_flops / (2 * 64 * WGMMA_N * 16) * 4 * 3  # each warp issues it, with two descriptors
    return copies + mma + wgmma


@dataclass(frozen=True)
class LoopTime:
    """The busiest SM's loop under one schedule, by limiter (seconds)."""

    tensor: float
    issue: float
    fill: float
    memory: float

    @property
    def seconds(self) -> float:
        return max(self.tensor, self.issue, self.fill, self.memory)


def loop_time(s, arch: ArchSpec, trip_flops: int, wgmma_flops: int, hbm_bytes: int) -> LoopTime:
    """The busiest SM's loop time under schedule ``s`` (see the module docstring)."""
    ctas = s.ctas
    per_sm = ceil_div(ctas, arch.sm_count)
    warps = (s.threads - (128 if s.tma else 0)) // 32
    sync_flops = trip_flops - wgmma_flops
    lanes = min(1.0, per_sm * warps / arch.subpartitions)
    tensor = per_sm * s.trips * (sync_flops / arch.mma_rate + (wgmma_flops / arch.wgmma_rate if wgmma_flops else 0))
    tensor /= lanes
    issue = per_sm * s.trips * trip_issue(s, warps, sync_flops, wgmma_flops) / (ISSUE_PER_CLOCK * arch.clock_hz)
    fill = per_sm * s.trips * s.stage_bytes / arch.sm_fill_rate
    rate = min(arch.hbm_rate, max(1.0, in_flight(s, arch)) / arch.latency_s)
    memory = hbm_bytes / rate if hbm_bytes else 0.0
    return LoopTime(tensor, issue, fill, memory)


def in_flight(s, arch: ArchSpec) -> int:
    """Bytes all CTAs of one wave keep in flight: the CTAs shared memory lets an SM hold, times each one's."""
    resident = max(1, (arch.smem_per_sm - 1024) // max(1, s.smem_bytes + 1024)) if s.smem_bytes else 1
    return min(s.ctas, resident * arch.sm_count) * s.bytes_in_flight


def choose(bg, arch: ArchSpec, options: list):
    """The schedule (one per code path) whose loop the model finishes first; ties keep the first (cp.async)."""
    if len(options) == 1:
        return options[0]
    from mugraph.codegen.schedule import _loop_hbm_bytes, trip_flops
    flops, hbm = trip_flops(bg), _loop_hbm_bytes(bg)  # per trip of one block; the loop's HBM bytes
    times = [loop_time(s, arch, flops, s.wgmma_flops, hbm) for s in options]
    best = min(range(len(options)), key=lambda i: (round(times[i].seconds, 12), times[i].issue, i))
    return options[best]


def tensor_core_rate(schedule, mma_sync_flops: float, wgmma_flops: float) -> float:
    """The tensor-core FLOP/s a kernel's products reach on its path: the search's cost model calls this (its sm_90a
    hook) in place of the mma.sync rate; the share of products on wgmma sets the mix."""
    total = schedule.trip_flops
    share = min(1.0, schedule.wgmma_flops / total) if total else (1.0 if schedule.wgmma else 0.0)
    if not share:
        return mma_sync_flops
    return 1.0 / ((1 - share) / mma_sync_flops + share / wgmma_flops)

