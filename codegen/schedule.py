"""How codegen runs one block graph on one arch -- the launch plan the cost model reads: how many CTAs share each
block's loop (splits), how deep the cp.async pipeline is (stages, chosen by the bytes an SM must keep in flight),
the resulting grid, shared memory, partial state and registers.

The rules, in order:

* splits: each block's loop is split over S CTAs (S divides the loop) when two stages of its tiles do not fit
  shared memory (the smallest S that fits), or when the grid alone cannot stream HBM at
  full rate: the smallest S (1 first) whose CTAs can keep the bytes in flight the arch needs
  (``inflight_per_sm`` x SMs: bandwidth x loaded latency) with the deepest pipeline that fits, and whose SMs
  can pull the bandwidth (``sm_fill_rate`` each); only S whose combine (the last CTA reads S partial states)
  reads no more than one split streams from its inputs; if none streams at full rate, the one that keeps the
  most bytes in flight.
* loops with tensor-core work: among all S that fit, the one whose busiest SM finishes first
  (``split_loop_seconds``): the largest of its share of the products (at the mma.sync rate, scaled down when it
  holds fewer warps than processing blocks), of its loop's instructions (``issue.trip_clocks`` on one warp's
  instructions per trip, counted from the one-stage lowering), of the bytes it pulls from L2 at the rate its
  resident CTAs' bytes in flight sustain (Little's law, at most ``sm_fill_rate``) and of the loop's HBM bytes at
  the rate all SMs pull together (``grid_fill_rate``: an SM holding one CTA fewer pulls less), plus the combine's
  tail (``split_tail``: the hand-over and the last CTA's read of every partial), each split weighed at the stages
  and path it then runs with. More CTAs put more SMs to work; more partials lengthen the tail; an SM given 2 CTAs
  while others hold 1 finishes last.
* stages: enough that the CTAs' loop-walked tiles in flight ((stages - 1) each on cp.async, every stage on TMA)
  reach the arch's total times the loop's L2 -> SM bytes over its HBM bytes (tiles every block re-reads, as X in
  X @ W, add to each SM's loads but not to HBM's), at most one per loop trip and ``arch.max_stages``, within
  shared memory for the CTAs an SM holds (never below two).
* path (sm_90a): the schedule above for the cp.async + mma.sync code and for Hopper's (a TMA pipeline with a
  producer warpgroup, wgmma where a product fits it) when that differs; the one ``hopper_model`` estimates
  faster runs (a tie keeps cp.async + mma.sync).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from mugraph.codegen.arch import ArchSpec, get_arch
from mugraph.codegen.layouts import ceil_div
from mugraph.codegen.mma import FP32_MMA_PRODUCTS
from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.ops import BOp
from mugraph.ir.shapes import mma_dtype

BASE_REGS = 32      # indices, addresses, loop counters: a lead, ptxas's figures are in kernels_generated/
MAX_REGS = 255
SMEM_RESERVED = 1024  # shared memory the runtime keeps per CTA (cudaDevAttrReservedSharedMemoryPerBlock)


@dataclass(frozen=True)
class KernelSchedule:
    """One block graph's launch on one arch, as codegen emits it."""

    arch: str
    grid: tuple             # the block graph's grid
    threads: int
    forloop: int            # the block graph's loop trips
    splits: int             # CTAs sharing each block's loop; the last to finish combines their partials
    stages: int             # cp.async buffers per loop-walked tile
    stage_bytes: int        # one loop trip's tiles (what one stage copies)
    invariant_bytes: int    # tiles copied once, before the loop
    smem_bytes: int         # dynamic shared memory of one CTA (the planner's total)
    state_bytes: int        # partial state one CTA publishes when split (0 otherwise)
    regs: int               # registers per thread (estimate: state, fragments, live values)
    path: str = "sync"      # "sync": cp.async + mma.sync; "hopper" (sm_90a): TMA pipeline and / or wgmma
    tma: bool = False       # the loop's tiles land by TMA (a producer warpgroup: ``threads`` includes it)
    wgmma: bool = False     # some block matmul runs on wgmma
    trip_flops: int = 0     # tensor-core FLOPs of one block's loop trip
    wgmma_flops: int = 0    # ... of them on wgmma

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def ctas(self) -> int:
        return self.blocks * self.splits

    @property
    def launch_grid(self) -> tuple:
        return (self.grid[0], self.grid[1], self.grid[2] * self.splits)

    @property
    def trips(self) -> int:
        """Loop trips of one CTA."""
        return self.forloop // self.splits

    @property
    def bytes_in_flight(self) -> int:
        """Bytes one CTA has requested and not yet consumed while its loop streams: every stage the TMA producer
        has refilled, or all but the one cp.async stage being computed on."""
        if not self.stage_bytes:
            return 0
        return (min(self.stages, self.trips) if self.tma else max(1, min(self.stages, self.trips) - 1)) * \
            self.stage_bytes

    @property
    def min_blocks(self) -> int:
        """CTAs one SM holds at once under this plan (shared memory, threads, and no more than the grid spreads
        onto each SM): the occupancy ptxas must leave registers for (``__launch_bounds__``'s second argument)."""
        a = get_arch(self.arch)
        by_smem = a.smem_per_sm // (self.smem_bytes + SMEM_RESERVED) if self.smem_bytes else a.threads_per_sm
        return max(1, min(by_smem, a.threads_per_sm // self.threads, ceil_div(self.ctas, a.sm_count)))

    @property
    def scratch_floats(self) -> int:
        """The partial-state buffer of all CTAs (floats)."""
        return self.ctas * self.state_bytes // 4

    def summary(self) -> str:
        split = f" = {self.blocks} blocks x {self.splits} splits" if self.splits > 1 else ""
        return (f"grid {self.launch_grid}{split} x {self.threads} threads, {self.trips} trips x "
                f"{self.stage_bytes / 1024:.1f} KB, {self.stages} stages, {self.smem_bytes / 1024:.1f} KB smem")


def kernel_schedule(bg: BlockGraph, arch="sm_90") -> KernelSchedule:
    """The schedule codegen uses for ``bg`` on ``arch`` (memoised per interned block graph and arch);
    ResourceError when not even two stages fit the arch's shared memory. One lowering measures it (two when the
    loop is split): see ``_derived_at``."""
    return _schedule(bg, get_arch(arch))


@lru_cache(maxsize=4096)
def _schedule(bg: BlockGraph, arch: ArchSpec) -> KernelSchedule:
    return plan_schedule(bg, arch, DERIVED)


def full_schedule(bg: BlockGraph, arch="sm_90") -> KernelSchedule:
    """The same schedule with every figure read off a full lowering at the stages and splits it weighs (three
    lowerings, not memoised): the reference ``kernel_schedule`` is tested against."""
    return plan_schedule(bg, get_arch(arch), FULL)


def plan_schedule(bg: BlockGraph, arch: ArchSpec, measure) -> KernelSchedule:
    """The module docstring's rules on the footprint of ``bg`` at one stage and one CTA per loop, for each code
    path the arch has; ``measure`` (``DERIVED`` or ``FULL``) gives the partial state a split would publish and the
    figures at the chosen plan."""
    from mugraph.codegen import hopper_model
    options = [plan_path(bg, arch, measure, "sync")]
    if arch.tma or arch.wgmma:
        hopper = plan_path(bg, arch, measure, "hopper")
        if hopper.tma or hopper.wgmma:
            options.append(hopper)
    return hopper_model.choose(bg, arch, options)


def plan_path(bg: BlockGraph, arch: ArchSpec, measure, path: str) -> KernelSchedule:
    """The schedule of ``bg`` on one code path."""
    from mugraph.codegen.plan import lowered
    state_of, figures_at = measure
    ir, plan = lowered(bg, arch, 1, 1, path)  # one buffer per tile: the footprint every deeper pipeline adds to
    stage_bytes = sum(ir.buffers[b].nbytes for b in ir.staged_inputs)
    invariant = sum(b.nbytes for b in ir.buffers.values() if b.role == "tile" and b.name not in ir.staged_inputs)
    state = state_of(bg, arch, ir) if arch.split_loops else 0
    splits = choose_splits(bg.num_blocks, bg.forloop, arch, state, stage_bytes, plan.total_bytes,
                           trip_flops(bg), _loop_hbm_bytes(bg), bg.threads // 32, _trip_ops(bg, ir, plan, state),
                           _room(arch, ir.block_threads, _registers(ir)), ir.pipeline is not None)
    stages = choose_stages(bg, arch, splits, stage_bytes, plan.total_bytes, ir.pipeline is not None)
    stages, smem, state, regs = figures_at(bg, arch, ir, plan, stages, splits)
    s = KernelSchedule(arch.name, bg.grid, ir.block_threads, bg.forloop, splits, stages, stage_bytes, invariant,
                       smem, state, regs, ir.path, ir.pipeline is not None, ir.async_reads, trip_flops(bg),
                       ir.wgmma_flops)
    if s.tma:  # setmaxnreg: the kernel launches with the registers its consumers take (hopper_pipeline)
        from mugraph.codegen.hopper_pipeline import consumer_regs
        s = replace(s, regs=max(regs, consumer_regs(bg.threads, s.min_blocks)))
    return s


def _room(arch: ArchSpec, threads: int, regs: int) -> int:
    """CTAs of ``threads`` threads with ``regs`` registers each that one SM's threads and registers hold (registers
    are allocated per warp in units of 256)."""
    warp_regs = ceil_div(regs * 32, 256) * 256
    return max(1, min(arch.threads_per_sm // threads, arch.regs_per_sm // (warp_regs * max(1, threads // 32))))


def _trip_ops(bg: BlockGraph, ir, plan, state: int):
    """One warp's instructions per trip of the one-stage lowering (only where a split is weighed)."""
    if not state or bg.forloop < 2 or not trip_flops(bg):
        return None
    from mugraph.codegen.issue import ir_trip_ops
    return ir_trip_ops(ir, plan)


def _derived_state(bg: BlockGraph, arch: ArchSpec, one) -> int:
    """The partial state a split CTA publishes, as the unsplit lowering records it (it does not depend on the
    split)."""
    return 4 * one.split_state_floats


def _derived_at(bg: BlockGraph, arch: ArchSpec, one, plan, stages: int, splits: int) -> tuple:
    """(stages, shared memory, partial state, registers) at the chosen plan from the one-stage lowering (of the
    split loop when it is split): stages change nothing but the pipeline's buffers (``_smem_at``)."""
    if splits > 1:
        from mugraph.codegen.plan import lowered
        one, plan = lowered(bg, arch, 1, splits, one.path)
    stages = max(1, min(stages, one.trips))  # as the lowering clamps them
    return stages, _smem_at(one, plan, arch, stages), 4 * one.state_floats, _registers(one)


def _smem_at(ir, plan, arch: ArchSpec, stages: int) -> int:
    """The planner's shared memory for ``ir`` (lowered at one stage, placed by ``plan``) lowered at ``stages``.

    More stages change only the pipeline (``copies``): each loop-walked tile's buffer holds ``stages`` tiles, and
    the prologue's later stage copies and the loop's prefetch are steps next to steps the staged buffers already
    live through, writing no other buffer and declaring no register. So every buffer keeps the lifetimes,
    relative to the others, it has at one stage, and placing the larger staged buffers by those lifetimes is the
    plan the full lowering gets (tests/codegen/test_schedule_plan.py checks it against that lowering)."""
    if stages == ir.stages:
        return plan.total_bytes
    from mugraph.codegen.plan import lifetimes, plan_buffers
    buffers = {name: replace(b, nbytes=b.nbytes * stages, stages=stages, what=f"{b.what} x {stages} stages")
               if name in ir.staged_inputs else b for name, b in ir.buffers.items()}
    return plan_buffers(ir.graph, buffers, lifetimes(ir), arch).total_bytes


def _full_state(bg: BlockGraph, arch: ArchSpec, one) -> int:
    """The partial state of the loop lowered split by its smallest divisor."""
    divisors = [d for d in range(2, bg.forloop + 1) if bg.forloop % d == 0]
    if not divisors:
        return 0
    from mugraph.codegen.plan import lowered
    return 4 * lowered(bg, arch, 1, divisors[0], one.path)[0].state_floats


def _full_at(bg: BlockGraph, arch: ArchSpec, one, plan, stages: int, splits: int) -> tuple:
    from mugraph.codegen.plan import lowered
    ir, plan = lowered(bg, arch, stages, splits, one.path)
    return ir.stages, plan.total_bytes, 4 * ir.state_floats, _registers(ir)


DERIVED = (_derived_state, _derived_at)   # what kernel_schedule measures with
FULL = (_full_state, _full_at)            # the full lowering at every plan weighed


def trip_flops(bg: BlockGraph) -> int:
    """Tensor-core FLOPs of one block's loop trip (its loop products, padded to the mma shape; an fp32 product is
    three bf16 ones)."""
    total = 0
    for node, phase in bg.phases().items():
        if node.op is BOp.MATMUL and phase is Phase.LOOP:
            a, b = node.srcs
            m, k, n = ceil_div(a.shape[-2], 16) * 16, ceil_div(a.shape[-1], 16) * 16, ceil_div(b.shape[-1], 8) * 8
            products = 1 if mma_dtype(a.dtype, b.dtype).is_16bit else FP32_MMA_PRODUCTS
            total += 2 * math.prod(node.shape[:-2]) * m * n * k * products
    return total


def _loop_hbm_bytes(bg: BlockGraph) -> int:
    """Bytes the loop-walked tiles bring from HBM: each tensor once when its blocks re-read it (from L2), else
    the tiles themselves."""
    total = 0
    for node in bg.inputs:
        spec = node.arg
        if spec.fmap is not None:
            traffic = math.prod(spec.tile_shape) * spec.dtype.itemsize * bg.forloop * bg.num_blocks
            total += min(traffic, math.prod(spec.shape) * spec.dtype.itemsize)
    return total


def choose_splits(blocks: int, forloop: int, arch: ArchSpec, state_bytes: int, stage_bytes: int,
                  smem_one: int, flops: int = 0, hbm_bytes: int = 0, warps: int = 4, ops=None, room: int = 0,
                  tma: bool = False) -> int:
    """CTAs per block loop (the module docstring's rule); ``smem_one``: one CTA's footprint at one stage;
    ``flops``: the tensor-core FLOPs of one block's loop trip; ``hbm_bytes``: what the loop brings from HBM;
    ``warps``: per CTA; ``ops``: one warp's instructions per trip (``issue.TripOps``, from the lowering);
    ``room``: the CTAs an SM's threads and registers hold (0: no limit beyond shared memory); ``tma``: the loop's
    tiles land by TMA (every stage in flight, not all but one)."""
    if not arch.split_loops or forloop < 2 or not state_bytes or not stage_bytes:
        return 1
    fits = [d for d in range(1, forloop + 1) if forloop % d == 0 and
            smem_one + (min(2, forloop // d) - 1) * stage_bytes <= arch.smem_limit]  # two stages, or one trip
    streaming = _streaming_splits(blocks, forloop, arch, state_bytes, stage_bytes, smem_one, fits)
    if not flops or not arch.mma_rate:
        return streaming
    busy = lambda d: split_loop_seconds(d, blocks, forloop, arch, state_bytes, stage_bytes, smem_one, flops,  # noqa
                                        hbm_bytes, warps, ops, room, tma)
    return min(fits or [streaming], key=lambda d: (busy(d), d))


def split_loop_seconds(d: int, blocks: int, forloop: int, arch: ArchSpec, state_bytes: int, stage_bytes: int,
                       smem_one: int, flops: int, hbm_bytes: int, warps: int, ops=None, room: int = 0,
                       tma: bool = False) -> float:
    """The busiest SM's loop with each block's loop split over ``d`` CTAs, then the combine's tail: the largest of
    its products, its instructions (``issue.trip_clocks``), its L2 -> SM fill at the rate its resident CTAs' bytes
    in flight sustain (Little's law, at most ``sm_fill_rate``; the pipeline ``choose_stages`` gives that split)
    and HBM at the rate all SMs pull together (``grid_fill_rate``: an SM holding one CTA fewer pulls less).
    The busiest SM holds ``ceil(blocks * d / SMs)`` CTAs: its share of the loop's L2 -> SM bytes (HBM's tiles and
    the tiles every block re-reads from L2) is that many CTAs' worth."""
    from mugraph.codegen.issue import trip_clocks, trip_seconds
    ctas, trips = blocks * d, forloop // d
    per_sm = ceil_div(ctas, arch.sm_count)
    stages = _stages_for(ctas, trips, arch, stage_bytes, smem_one, _reread(blocks, forloop, stage_bytes, hbm_bytes),
                         tma)
    by_smem = max(1, (arch.smem_per_sm - 1024) // max(1, smem_one + (stages - 1) * stage_bytes + 1024))
    resident = min(per_sm, by_smem, room or by_smem)
    cta_in_flight = _cta_in_flight(stages, trips, stage_bytes, tma)
    cta_rate = cta_in_flight / _latency(arch, min(ctas, by_smem * arch.sm_count) * cta_in_flight)
    fill = min(arch.sm_fill_rate, resident * cta_rate)
    rate = min(arch.hbm_rate, grid_fill_rate(ctas, arch.sm_count, resident, cta_rate, arch.sm_fill_rate))
    mma = arch.mma_rate * min(1.0, resident * warps / arch.subpartitions)  # a warp keeps one tensor core busy
    issue = 0.0
    if ops is not None and arch.issue is not None:
        clocks = trip_clocks(ops, resident * warps, resident, arch.issue)
        issue = ceil_div(per_sm, resident) * trips * trip_seconds(clocks, arch.clock_hz)
    loop = max(per_sm * flops * trips / mma, per_sm * trips * stage_bytes / fill, hbm_bytes / rate, issue)
    return loop + split_tail(d, state_bytes, arch.handoff_s, arch.sm_fill_rate)


def _latency(arch: ArchSpec, grid_in_flight: float) -> float:
    """The latency the loads see: loaded when the grid keeps enough in flight to load HBM, else idle (as the cost
    model's ``_fill_rates``)."""
    return arch.latency_s if grid_in_flight >= arch.hbm_rate * arch.latency_s else arch.idle_latency_s


def split_tail(splits: int, state_bytes: int, handoff_s: float, sm_rate: float) -> float:
    """A split block's combine after its loops: the last CTA counts in (``handoff_s``), then reads every CTA's
    partial state from L2 at one SM's fill rate. The cost model charges the same (search/cost.py)."""
    return (splits > 1) * (handoff_s + splits * state_bytes / sm_rate)


def grid_fill_rate(ctas: int, sm_count: int, on_sm: int, cta_rate: float, sm_rate: float) -> float:
    """Bytes/s the SMs' loads pull together: each SM the rate of the CTAs it holds at once (``cta_rate`` each,
    at most ``on_sm``), at most ``sm_rate``. When ``ctas`` is not a multiple of ``sm_count`` some SMs hold one CTA
    fewer and pull less (192 CTAs on 132 SMs: 60 SMs hold 2, 72 hold 1 -- not 132 SMs at the rate of 2)."""
    q, r = divmod(ctas, sm_count)
    return r * min(sm_rate, min(q + 1, on_sm) * cta_rate) + (sm_count - r) * min(sm_rate, min(q, on_sm) * cta_rate)


def _cta_in_flight(stages: int, trips: int, stage_bytes: int, tma: bool) -> int:
    """Bytes one CTA keeps in flight while its loop streams (as ``KernelSchedule.bytes_in_flight``)."""
    return (min(stages, trips) if tma else max(1, min(stages, trips) - 1)) * stage_bytes


def _reread(blocks: int, forloop: int, stage_bytes: int, hbm_bytes: int) -> float:
    """The loop's L2 -> SM bytes over its HBM bytes: above 1 when blocks re-read tiles from L2 (every block reads
    all of X in X @ W), so each SM pulls that much more than its share of HBM."""
    return max(1.0, blocks * forloop * stage_bytes / hbm_bytes) if hbm_bytes else 1.0


def _streaming_splits(blocks: int, forloop: int, arch: ArchSpec, state_bytes: int, stage_bytes: int,
                      smem_one: int, fits: list) -> int:
    """The split that streams HBM at full rate (the module docstring's first rule)."""
    cheap = [d for d in fits if d == 1 or d * state_bytes <= (forloop // d) * stage_bytes] or fits[-1:]
    if not cheap:
        return 1
    for d in cheap:
        if _streams_at_full_rate(blocks * d, forloop // d, arch, stage_bytes, smem_one):
            return d
    return max(cheap, key=lambda d: (_in_flight(blocks * d, forloop // d, arch, stage_bytes, smem_one), -d))


def _in_flight(ctas: int, trips: int, arch: ArchSpec, stage_bytes: int, smem_one: int) -> int:
    """Bytes all CTAs together keep in flight with the deepest pipeline that fits (the CTAs one wave holds)."""
    stages = _deepest(ctas, trips, arch, stage_bytes, smem_one, arch.max_stages)
    per_sm = max(1, (arch.smem_per_sm - 1024) // max(1, smem_one + (stages - 1) * stage_bytes + 1024))
    return min(ctas, per_sm * arch.sm_count) * (stages - 1) * stage_bytes


def _streams_at_full_rate(ctas: int, trips: int, arch: ArchSpec, stage_bytes: int, smem_one: int) -> bool:
    return _in_flight(ctas, trips, arch, stage_bytes, smem_one) >= arch.inflight_per_sm * arch.sm_count and \
        min(ctas, arch.sm_count) * arch.sm_fill_rate >= arch.hbm_rate


def _deepest(ctas: int, trips: int, arch: ArchSpec, stage_bytes: int, smem_one: int, want: int) -> int:
    """At most ``want`` stages, one per trip, within the shared memory of the CTAs one SM holds (>= 2)."""
    per_sm = max(1, ceil_div(ctas, arch.sm_count))
    budget = min(arch.smem_limit, arch.smem_per_sm // per_sm - 1024)
    stages = min(want, trips, arch.max_stages)
    while stages > 2 and smem_one + (stages - 1) * stage_bytes > budget:
        stages -= 1
    return max(2, stages)


def choose_stages(bg: BlockGraph, arch: ArchSpec, splits: int, stage_bytes: int, smem_one: int,
                  tma: bool = False) -> int:
    """Pipeline depth by bytes in flight (the module docstring's rule); ``smem_one``: the footprint at one."""
    trips = bg.forloop // splits
    if trips < 2 or not stage_bytes:
        return 2
    return _stages_for(bg.num_blocks * splits, trips, arch, stage_bytes, smem_one,
                       _reread(bg.num_blocks, bg.forloop, stage_bytes, _loop_hbm_bytes(bg)), tma)


def _stages_for(ctas: int, trips: int, arch: ArchSpec, stage_bytes: int, smem_one: int, reread: float,
                tma: bool = False) -> int:
    """Stages whose bytes in flight let each CTA move its share of the loop's L2 -> SM bytes while HBM streams at
    full rate: the GPU's bytes in flight shared out over the CTAs, times ``reread``; a cp.async pipeline has all
    but one stage in flight, a TMA one every stage."""
    need = arch.inflight_per_sm * arch.sm_count / ctas * reread
    return _deepest(ctas, trips, arch, stage_bytes, smem_one, (0 if tma else 1) + ceil_div(int(need), stage_bytes))


_ARRAY = re.compile(r"\b(?:float |unsigned )?\w+((?:\[\d+\])+)")  # a register array in a declaration


def _floats(lines, kind: str = "float ") -> int:
    """Words the ``kind`` array declarations among ``lines`` hold."""
    total = 0
    for line in lines:
        if line.startswith(kind):
            code = line.split("//")[0].split("=")[0] if "= {" in line else line.split("//")[0]
            total += sum(math.prod(int(d) for d in re.findall(r"\d+", m.group(1))) for m in _ARRAY.finditer(code))
    return total


def _registers(ir) -> int:
    """Words each thread keeps in registers: accumulator state, operand fragments held across the loop (kernel
    scope) and the largest step's own arrays."""
    work = max((_floats(s.decls) for s in ir.steps), default=0)
    held = _floats(ir.kernel_decls, "unsigned ")
    return min(MAX_REGS, BASE_REGS + _floats(ir.acc_decls) + held + work)
