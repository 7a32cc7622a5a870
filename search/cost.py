"""Analytical cost model: the time a kernel graph takes on a target GPU, beside the spec's roofline.

Mirage profiles every candidate; mugraph ranks them with this model and profiles only the top few.
The model reads the launch codegen would emit for each custom kernel (``codegen.schedule``: grid
with the loop split over CTAs, cp.async stages, bytes per stage, shared memory, partial state,
registers) and the calibration table's per-target constants (``search.targets``).

Per kernel (each library op is one kernel; transpose/reshape/broadcast fold into the load of
their consumer and cost nothing; each custom op is one kernel). BW below is the bandwidth
streaming kernels reach (`Target.hbm_efficiency` x peak); the roofline uses the peak.

* library kernel (vendor-tuned, grid chosen by the library; GEMMs at the datasheet tensor-core peak), and each
  kernel of the XLA-like baseline:
      t = max(bytes / BW, tc_flops / TC_peak, simt_flops / SIMT_peak) + first-load latency (if it reads) + launch
* custom kernel, C CTAs (blocks x splits), b resident per SM (threads, shared memory, registers: occupancy),
  S SMs, each CTA keeping F bytes in flight (its pipeline's stages while the loop streams; with nothing to
  stream, the tiles it loads at once before the loop, one round trip -- never a free full-bandwidth credit):
      waves = ceil(C / (S*b)),  n = ceil(C / S) CTAs on the busiest SM,  util = C / (n*S)
      fill  = min(SM_fill_BW, min(n, b) x F / latency)     one SM's loads (Little's law), the latency loaded
              when the grid's bytes in flight could keep HBM busy at it, else idle
      rate  = min(BW, sum over SMs of min(SM_fill_BW, its CTAs x F / latency))
                                                           SM coverage: idle SMs pull nothing, and where C is
                                                           not a multiple of S some SMs hold one CTA fewer
      t_memory  = max(hbm_bytes / rate, L2 traffic / L2_BW, n * CTA traffic / fill)
      t_compute = max((tc_flops / TC_mma_sync + simt_flops / SIMT_peak) / util / lanes, t_issue)
  lanes = min(1, warps one SM holds / its processing blocks): a warp issues on one processing block (its
  tensor core and FP32 lanes), so an SM with fewer resident warps than blocks leaves some idle.
  t_issue (`loop_issue`): the busiest SM's trips x the clocks of one trip for its resident warps, from one warp's
  instructions per trip counted from the lowering by class (``codegen.issue``: MMA, MUFU, FP32, integer,
  shared-memory wavefronts, barriers): the largest of the issue slots (one per clock per processing block,
  fewer with too few warps to hide latencies), MUFU (16 per clock per SM), FP32 and integer lanes and shared
  memory (128 bytes per clock), plus the barriers.
      t = max(t_memory', t_compute + first) + split tail + launch,   first = waves * first-load latency,
  t_memory' = t_memory + first when the grid streams at BW (the pipeline fills first), else
  max(t_memory, first + hbm_bytes / BW) (Little's law already spends one round trip per F bytes, the first
  included: no second charge for it, but never faster than a library kernel moving the same bytes)
  split tail (a loop split over s CTAs): the last CTA of each block counts in (one L2 round
  trip) and reads the s partial states at the SM's L2 fill rate. `bound` names the larger of
  t_memory and t_compute, or "latency" when the latencies and launch outweigh both.
* launch (`launch_charges`, `Launch`): as jax.jit pays it by default (a C++ launch, or a command-buffer replay for
  runs of capturable kernels), the same rule for the XLA-like baseline and for mugraph's kernels.
* HBM bytes of a custom kernel: outputs once; each input's traffic is tile bytes x (forloop if
  the loop walks it) x blocks. A tensor read by many blocks (replicated across a grid axis, or a
  broadcast view) costs its unique bytes when it fits in its share of L2 (inputs ordered by size
  share half the L2); otherwise each wave of concurrent blocks reads the distinct tiles it
  touches once, i.e. waves x distinct bytes per wave, between the unique bytes and the full
  traffic. Partial states of split loops stay in L2 (they count as L2 and SM traffic). Cross-
  kernel L2 reuse (a small intermediate written by one kernel and read by the next) is not
  modelled: conservative for unfused graphs.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from enum import Enum

from mugraph.codegen import hopper_model
from mugraph.codegen.arch import get_arch
from mugraph.codegen.mma import FP32_MMA_PRODUCTS
from mugraph.codegen.schedule import KernelSchedule, grid_fill_rate, kernel_schedule, split_tail
from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.errors import MugraphError, ResourceError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import KNode, toposort
from mugraph.ir.ops import ACCUMULATORS, BLOCK_REDUCE, BOp, KERNEL_LAYOUT, KERNEL_LEAF, KOp, TOp
from mugraph.ir.shapes import mma_dtype
from mugraph.ir.thread import ops_of
from mugraph.search.targets import Target, get_target

# ---- shapes the code generator uses ---------------------------------------------------------------
MMA_M, MMA_N, MMA_K = 16, 8, 16   # mma.sync.m16n8k16: smaller matmuls are padded up to it
L2_REUSE_SHARE = 0.5      # share of L2 that replicated inputs may count on

# SIMT FLOPs charged per element, a plain add or mul being 1. Ops on the special-function unit
# (MUFU: ex2, lg2, rsqrt, rcp) run 16 per clock per SM against 64 (A100) or 128 (H100) FP32
# lanes, so each is charged 4 (the A100 ratio; H100's is 8); composites add their parts. The
# SIMT peak counts an FMA as 2, so lone adds are charged half an issue: up to 2x optimistic for
# SIMT-bound kernels, which are rare among the tensor programs this targets.
ELEMENTWISE_FLOPS: dict[TOp, int] = {
    TOp.ADD: 1, TOp.SUB: 1, TOp.MUL: 1, TOp.MAX: 1, TOp.MIN: 1, TOp.NEG: 1, TOp.RELU: 1,
    TOp.SQUARE: 1, TOp.CLAMP: 2,
    TOp.DIV: 5,                      # rcp (MUFU) + mul
    TOp.EXP: 5, TOp.LOG: 5,          # ex2/lg2 (MUFU) + a scaling mul
    TOp.SQRT: 4, TOp.RSQRT: 4,       # MUFU
    TOp.SIGMOID: 11,                 # exp + add + rcp
    TOp.SILU: 12,                    # sigmoid + mul
    TOp.TANH: 12,                    # exp-based: exp + add + rcp + fma
    TOp.ERF: 16,                     # polynomial approximation with an exp
    TOp.GELU: 20,                    # erf + 3 muls/adds
    TOp.POW: 11,                     # lg2 + mul + ex2
    TOp.ABS: 1, TOp.IS_FINITE: 2, TOp.SELECT: 1, TOp.LEAKY_RELU: 2,
    TOp.GT: 1, TOp.GE: 1, TOp.LT: 1, TOp.LE: 1, TOp.EQ: 1, TOp.NE: 1,
    TOp.LOG1P: 8, TOp.EXPM1: 8,      # lg2/ex2 (MUFU) + a correction polynomial
    TOp.SOFTPLUS: 15,                # max + abs + exp + log1p + add
    TOp.CAST: 2,                     # cvt.rn to the 16-bit type and back (to fp32: charged alike)
}


# ---- records ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelEstimate:
    """One kernel's estimate. Library kernels report blocks = blocks_per_sm = waves = 0 (their
    grid is the library's choice)."""

    name: str
    kind: str                # "custom" | "library" | "copy"
    seconds: float
    hbm_bytes: int
    tc_flops: int
    simt_flops: int
    blocks: int
    blocks_per_sm: int
    waves: int
    smem_bytes: int
    bound: str               # "memory" | "compute" | "latency"
    grid: tuple = ()         # launch grid of a custom kernel (blocks x loop splits)
    splits: int = 1          # CTAs sharing each block's loop
    stages: int = 0          # cp.async stages per loop-walked tile
    inflight_per_sm: int = 0  # bytes an SM keeps in flight while the kernel streams

    @property
    def bytes(self) -> int:
        return self.hbm_bytes

    @property
    def flops(self) -> int:
        return self.tc_flops + self.simt_flops


@dataclass(frozen=True)
class Roofline:
    """The spec's lower bound: inputs read once, outputs written once, essential FLOPs at peak,
    one launch."""

    target: str
    seconds: float
    hbm_bytes: int
    tc_flops: int
    simt_flops: int
    memory_seconds: float
    compute_seconds: float
    launch_seconds: float

    def __str__(self) -> str:
        return (f"roofline on {self.target}: {_us(self.seconds)} µs (memory "
                f"{_us(self.memory_seconds)}, compute {_us(self.compute_seconds)}, launch "
                f"{_us(self.launch_seconds)}; {_mb(self.hbm_bytes)} MB)")


@dataclass(frozen=True)
class Estimate:
    """The modelled time of a kernel graph: totals and one record per kernel, in launch order."""

    target: str
    seconds: float
    hbm_bytes: int
    tc_flops: int
    simt_flops: int
    launches: int
    kernels: tuple[KernelEstimate, ...]

    def vs(self, bound: Roofline) -> float:
        """How many times the roofline bound this estimate is (>= 1 unless FLOPs were removed)."""
        if not bound.seconds:
            return 1.0 if not self.seconds else math.inf
        return self.seconds / bound.seconds

    def __str__(self) -> str:
        return format_table(self)


class Misfit(Enum):
    """Why a block graph cannot run on a target (a cheap rejection for the search)."""

    THREADS = "threads"
    SHARED_MEMORY = "shared_memory"
    REGISTERS = "registers"
    CODEGEN = "codegen"      # the code generator has no rule for it


class Launch(Enum):
    """How a program's kernels are launched; each kernel is charged by `launch_charges`."""

    JIT = "jit"       # inside one jax.jit program: the headline path (mugraph's kernels and the baseline alike)
    EAGER = "eager"   # one Python call per kernel (CuPy): the secondary figure
    GRAPH = "graph"   # the whole plan captured as one CUDA graph (bench/gpu.py's replay)


def launch_path(launch=Launch.JIT, cuda_graph: bool = False) -> Launch:
    """A `Launch` from itself or its name; ``cuda_graph=True`` (the older spelling) is `Launch.GRAPH`."""
    return Launch.GRAPH if cuda_graph else Launch(launch)


def launch_charges(target, capturable, launch=Launch.JIT) -> list[float]:
    """Seconds charged to launch each kernel of a program, in launch order; ``capturable[i]``: whether XLA can
    record kernel i into a command buffer (fusions, library GEMMs, FFI handlers declared command-buffer
    compatible). Under jax.jit a run of at least ``command_buffer_min_kernels`` capturable kernels is replayed as
    one command buffer (``graph_launch_s`` each); every other kernel is launched from C++ (``jit_launch_s``).
    Eager: ``launch_s`` each; a CUDA graph: ``graph_launch_s`` each. Sources: codegen/calibration.json."""
    t, how, capturable = get_target(target), Launch(launch), list(capturable)
    if how is Launch.EAGER:
        return [t.launch_s] * len(capturable)
    if how is Launch.GRAPH:
        return [t.graph_launch_s] * len(capturable)
    charges, i = [], 0
    while i < len(capturable):
        j = i
        while j < len(capturable) and capturable[j] == capturable[i]:
            j += 1
        recorded = capturable[i] and j - i >= t.command_buffer_min_kernels
        charges += [t.graph_launch_s if recorded else t.jit_launch_s] * (j - i)
        i = j
    return charges


# ---- FLOP counting ------------------------------------------------------------------------------
def _elems(shape) -> int:
    return math.prod(shape)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def matmul_flops(a_shape, b_shape, tensor_core: bool, pad: bool = True) -> int:
    """2*batch*M*N*K; on tensor cores M, N, K are padded to the m16n8k16 MMA shape."""
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = max(_elems(a_shape[:-2]), _elems(b_shape[:-2]))
    if tensor_core and pad:
        m, n, k = _pad(m, MMA_M), _pad(n, MMA_N), _pad(k, MMA_K)
    return 2 * batch * m * n * k


def _norm_flops(shape, dim: int) -> int:
    """x * rsqrt(mean(x^2) + eps): square, add, mul per element, one rsqrt per row."""
    return 3 * _elems(shape) + ELEMENTWISE_FLOPS[TOp.RSQRT] * _elems(shape) // shape[dim]


def _kernel_tc(node: KNode) -> bool:
    a, b = node.srcs
    return a.dtype.is_16bit and a.dtype is b.dtype


def kernel_node_flops(node: KNode, pad: bool = True) -> tuple[int, int]:
    """(tensor-core, SIMT) FLOPs of one library op (custom ops are counted from their blocks)."""
    op = node.op
    if isinstance(op, TOp):
        return 0, ELEMENTWISE_FLOPS[op] * _elems(node.shape)
    if op is KOp.MATMUL:
        tc = _kernel_tc(node)
        f = matmul_flops(node.srcs[0].shape, node.srcs[1].shape, tc, pad)
        return (f, 0) if tc else (0, f)
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX):
        return 0, _elems(node.srcs[0].shape)
    if op is KOp.RMS_NORM:
        return 0, _norm_flops(node.shape, node.arg[0])
    return 0, 0


def _acc_flops(node) -> int:
    """Per-iteration update of an accumulator."""
    x = _elems(node.srcs[0].shape)
    if node.op is BOp.ACC_RMS_LAST:
        return 2 * x
    if node.op in (BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE):
        # acc * exp(m_prev - m) + x: sub + exp per accumulator element, fma per x element
        return 2 * x + (1 + ELEMENTWISE_FLOPS[TOp.EXP]) * _elems(node.shape)
    return x


def block_node_flops(node) -> tuple[int, int]:
    """(tensor-core, SIMT) FLOPs of one execution of a block op on its tiles."""
    op = node.op
    if isinstance(op, TOp):
        return 0, ELEMENTWISE_FLOPS[op] * _elems(node.shape)
    if op is BOp.MATMUL:  # an fp32 product runs as bf16 products on tensor cores (codegen/mma.py)
        a, b = node.srcs
        f = matmul_flops(a.shape, b.shape, True)
        return (f, 0) if mma_dtype(a.dtype, b.dtype).is_16bit else (FP32_MMA_PRODUCTS * f, 0)
    if op in BLOCK_REDUCE:
        return 0, _elems(node.srcs[0].shape)
    if op is BOp.RMS_NORM:
        return 0, _norm_flops(node.shape, node.arg[0])
    if op in ACCUMULATORS:
        return 0, _acc_flops(node)
    if op is BOp.THREAD:
        return 0, sum(ELEMENTWISE_FLOPS[t.op] for t in ops_of(node.arg)) * _elems(node.shape)
    return 0, 0


# ---- block graphs: target-independent analysis, cached on the interned BlockGraph ----------------
@dataclass(frozen=True)
class InputRead:
    """How the blocks of a custom kernel read one input."""

    block_bytes: int          # bytes one block reads of it over the whole kernel
    traffic: int              # block_bytes x blocks
    mapped_axes: tuple        # per grid axis: does imap split the tensor along it?


@dataclass(frozen=True)
class BlockCost:
    """What a block graph costs whatever the target: FLOPs, reads, writes."""

    blocks: int
    threads: int
    grid: tuple
    tc_flops: int             # all blocks
    simt_flops: int
    reads: tuple[InputRead, ...]
    write_bytes: int

    @property
    def traffic(self) -> int:
        return sum(r.traffic for r in self.reads) + self.write_bytes


_BLOCK_CACHE: "weakref.WeakKeyDictionary[BlockGraph, BlockCost]" = weakref.WeakKeyDictionary()


def block_cost(bg: BlockGraph) -> BlockCost:
    """The target-independent costs of a block graph (memoised per interned graph)."""
    found = _BLOCK_CACHE.get(bg)
    if found is None:
        found = _analyse(bg)
        _BLOCK_CACHE[bg] = found
    return found


def _analyse(bg: BlockGraph) -> BlockCost:
    tc, simt = _block_flops(bg.phases(), bg.forloop)
    return BlockCost(blocks=bg.num_blocks, threads=bg.threads, grid=bg.grid,
                     tc_flops=tc * bg.num_blocks, simt_flops=simt * bg.num_blocks,
                     reads=tuple(_input_read(n.arg, bg) for n in bg.inputs),
                     write_bytes=sum(_elems(o.shape) * o.dtype.itemsize for o in bg.outputs))


def _block_flops(phase, forloop: int) -> tuple[int, int]:
    tc = simt = 0
    for node, p in phase.items():
        times = forloop if p in (Phase.LOOP, Phase.ACCUMULATOR) else 1
        t, s = block_node_flops(node)
        tc, simt = tc + t * times, simt + s * times
    return tc, simt


def _input_read(spec, bg: BlockGraph) -> InputRead:
    per_block = _elems(spec.tile_shape) * spec.dtype.itemsize
    if spec.fmap is not None:
        per_block *= bg.forloop
    mapped = tuple(d is not None for d in spec.imap)
    return InputRead(per_block, per_block * bg.num_blocks, mapped)


# ---- codegen's launch of a block graph ----------------------------------------------------------
def schedule(bg: BlockGraph, target="h100") -> KernelSchedule:
    """The launch codegen emits for `bg` on the target's arch (memoised per block graph); raises
    ResourceError when it does not fit and the code generator's errors when it cannot lower it."""
    return kernel_schedule(bg, get_target(target).arch)


def smem_bytes(bg: BlockGraph, target="h100") -> int:
    """Dynamic shared memory of one CTA of `bg`, as codegen's planner places it."""
    return schedule(bg, target).smem_bytes


def registers_per_thread(bg: BlockGraph, target="h100") -> int:
    """Codegen's estimate of the registers a thread of `bg` holds."""
    return schedule(bg, target).regs


def blocks_per_sm(target, threads: int, smem: int, regs_per_thread: int) -> int:
    """Resident blocks per SM, limited by threads, blocks, shared memory and registers
    (allocation granularities: 128 B of shared memory plus the runtime's reserve per block;
    registers in units of 256 per warp). 0 when one block does not fit."""
    t = get_target(target)
    if threads > t.max_threads_per_block or smem > t.smem_per_block:
        return 0
    by_smem = t.smem_per_sm // (_pad(smem, 128) + t.smem_reserved_per_block)
    warp_regs = _pad(regs_per_thread * 32, 256)
    by_regs = t.regs_per_sm // (warp_regs * (threads // 32))
    return min(t.max_blocks_per_sm, t.max_threads_per_sm // threads, by_smem, by_regs)


def misfit(bg: BlockGraph, target) -> Misfit | None:
    """None if `bg` can run on `target`, else the first limit it breaks."""
    t = get_target(target)
    if bg.threads > t.max_threads_per_block:
        return Misfit.THREADS
    try:
        s = schedule(bg, t)
    except ResourceError:
        return Misfit.SHARED_MEMORY
    except MugraphError:
        return Misfit.CODEGEN
    if s.smem_bytes > t.smem_per_block:
        return Misfit.SHARED_MEMORY
    if blocks_per_sm(t, s.threads, s.smem_bytes, s.regs) == 0:
        return Misfit.REGISTERS
    return None


def fits(bg: BlockGraph, target="h100") -> bool:
    """Whether one block of `bg` fits the target (shared memory, threads, registers)."""
    return misfit(bg, target) is None


# ---- kernels ------------------------------------------------------------------------------------
def _root(node: KNode) -> KNode:
    """The tensor a layout view reads (layout ops fold into their consumer's load)."""
    while node.op in KERNEL_LAYOUT:
        node = node.srcs[0]
    return node


def _tensor_bytes(node: KNode) -> int:
    return _elems(node.shape) * node.dtype.itemsize


def _unique_bytes(node: KNode) -> int:
    root = _root(node)
    return 0 if root.op in (KOp.CONSTANT, KOp.IOTA) else _tensor_bytes(root)  # an iota is computed


def _bandwidth(t: Target) -> float:
    """The HBM bandwidth estimates use: what streaming kernels reach, not the peak."""
    return t.hbm_bandwidth * t.hbm_efficiency


def _finish(body: dict, launch: float) -> tuple[float, str]:
    bound = max(body, key=body.get)
    top = body[bound]
    return top + launch, "latency" if launch >= top else bound


def _library_kernel(name: str, node: KNode, t: Target, launch: float) -> KernelEstimate:
    reads = sum(_unique_bytes(r) for r in {_root(s) for s in node.srcs})
    hbm = reads + _tensor_bytes(node)
    tc, simt = kernel_node_flops(node)
    seconds, bound = _vendor(reads, hbm, tc, simt, t, launch)
    kind = "copy" if node.op in KERNEL_LAYOUT else "library"
    return KernelEstimate(name, kind, seconds, hbm, tc, simt, 0, 0, 0, 0, bound)


def fused_kernel(name: str, reads, write_bytes: int, tc_flops: int, simt_flops: int,
                 target="h100", *, launch_s: float | None = None, cuda_graph: bool = False) -> KernelEstimate:
    """One vendor-style kernel (a library call, an XLA fusion) that reads the tensors `reads` once
    each (a layout view counts as its root, constants are free) and writes `write_bytes`: the
    library-kernel formula of the module docstring, plus ``launch_s`` (default: a lone kernel under jax.jit, or
    in a CUDA graph with ``cuda_graph``). Used by `search.baseline`."""
    t = get_target(target)
    launch = launch_s if launch_s is not None else launch_charges(t, [True], launch_path(cuda_graph=cuda_graph))[0]
    read = sum(_unique_bytes(r) for r in {_root(n) for n in reads})
    seconds, bound = _vendor(read, read + write_bytes, tc_flops, simt_flops, t, launch)
    return KernelEstimate(name, "library", seconds, read + write_bytes, tc_flops, simt_flops, 0, 0, 0, 0, bound)


def _vendor(read: int, hbm: int, tc: int, simt: int, t: Target, launch: float) -> tuple[float, str]:
    """A library kernel's or XLA fusion's time: its bytes at BW or its FLOPs at the peaks, after its first load
    (one HBM round trip, charged as a custom kernel's is, where it reads anything), plus its launch."""
    first = t.hbm_latency_s if read else 0.0
    body = {"memory": hbm / _bandwidth(t), "compute": max(tc / t.tc_flops, simt / t.simt_flops)}
    seconds, bound = _finish(body, first + launch)
    return seconds, bound


def _distinct_tiles(mapped, grid, concurrent: int) -> int:
    """Distinct tiles of one input among `concurrent` consecutive blocks (x fastest)."""
    distinct, stride = 1, 1
    for axis in range(3):
        if mapped[axis]:
            distinct *= min(grid[axis], -(-concurrent // stride))
        stride *= grid[axis]
    return distinct


def _hbm_reads(c: BlockCost, srcs, t: Target, concurrent: int, waves: int) -> int:
    """HBM bytes of the inputs under the L2 model of the module docstring."""
    budget, total = L2_REUSE_SHARE * t.l2_bytes, 0
    for read, src in sorted(zip(c.reads, srcs), key=lambda rs: _unique_bytes(rs[1])):
        unique = _unique_bytes(src)
        if read.traffic <= unique:
            total += read.traffic
        elif unique <= budget:
            budget -= unique
            total += unique
        else:
            per_wave = _distinct_tiles(read.mapped_axes, c.grid, concurrent) * read.block_bytes
            total += min(read.traffic, max(unique, waves * per_wave))
    return total


def _custom_kernel(name: str, bg: BlockGraph, srcs, t: Target, launch: float) -> KernelEstimate:
    c, s = block_cost(bg), schedule(bg, t)
    per_sm = blocks_per_sm(t, s.threads, s.smem_bytes, s.regs)
    if per_sm == 0:
        raise ResourceError(
            f"custom kernel {name} needs {s.smem_bytes} B of shared memory and {s.threads} "
            f"threads x {s.regs} registers per block; {t.name} allows "
            f"{t.smem_per_block} B per block", hint="smaller tiles (a larger grid or forloop); "
            "the search should call cost.fits() before estimating")
    slots = t.sm_count * per_sm
    waves = -(-s.ctas // slots)
    busiest = -(-s.ctas // t.sm_count)
    util = s.ctas / (busiest * t.sm_count)
    resident = min(s.ctas, slots)
    hbm = _hbm_reads(c, srcs, t, min(c.blocks, slots), waves) + c.write_bytes
    partials = 2 * s.ctas * s.state_bytes          # published, then read by the last CTAs
    fill, rate = _fill_rates(s, t, min(per_sm, busiest), resident)
    memory = max(hbm / rate if hbm else 0.0, (c.traffic + partials) / t.l2_bandwidth,
                 busiest * (c.traffic + partials) / s.ctas / fill)
    compute = max((c.tc_flops / _tc_rate(s, t) + c.simt_flops / t.simt_flops) / util / _lanes(s, t, per_sm, busiest),
                  loop_issue(bg, s, t, per_sm, busiest).seconds)
    first = waves * t.hbm_latency_s                # each wave's first load, before its loop can start
    if rate >= _bandwidth(t):                      # streaming at the bandwidth: the pipeline fills first
        memory += first
    else:   # below it, Little's law spends a round trip per F bytes, the first included; never less than the
        memory = max(memory, first + hbm / _bandwidth(t))   # first load and the bytes at the bandwidth
    body = max(memory, compute + first)
    seconds = body + _split_tail(s, t) + launch
    bound = ("memory" if memory >= compute + first else "compute") if max(memory, compute) >= first + launch \
        else "latency"
    inflight_sm = min(busiest, per_sm) * _cta_in_flight(s)
    return KernelEstimate(name, "custom", seconds, hbm, c.tc_flops, c.simt_flops, s.ctas,
                          per_sm, waves, s.smem_bytes, bound, s.launch_grid, s.splits, s.stages,
                          inflight_sm)


# ---- the busiest SM: its loads (fill rate) and its loop's instructions (issue) ----------------------------------
def _cta_in_flight(s: KernelSchedule) -> int:
    """Bytes one CTA has requested and not consumed: its pipeline's stages while the loop streams, else the tiles
    it copies at once before the loop (one round trip: no more in flight than that)."""
    return s.bytes_in_flight or s.invariant_bytes


def _fill_rates(s: KernelSchedule, t: Target, on_sm: int, resident: int) -> tuple[float, float]:
    """(bytes/s one SM's loads sustain, bytes/s the whole grid streams from HBM). Little's law per SM: the bytes
    its ``on_sm`` resident CTAs keep in flight over the latency they see (loaded when the grid's bytes in flight
    could keep HBM busy, else idle), at most its L2 -> SM path; the grid: every SM at the rate of the CTAs it holds
    (``schedule.grid_fill_rate``: where the CTAs do not divide evenly over the SMs, some hold one fewer and pull
    less), at most the streaming bandwidth. A kernel that loads nothing is charged its path and the bandwidth."""
    per_cta = _cta_in_flight(s)
    if not per_cta:
        return t.sm_load_bandwidth, _bandwidth(t)
    latency = t.loaded_latency_s if resident * per_cta >= _bandwidth(t) * t.loaded_latency_s else t.hbm_latency_s
    fill = min(t.sm_load_bandwidth, on_sm * per_cta / latency)
    return fill, min(_bandwidth(t), grid_fill_rate(s.ctas, t.sm_count, on_sm, per_cta / latency, t.sm_load_bandwidth))


@dataclass(frozen=True)
class LoopIssue:
    """The busiest SM's loop by the unit that limits it (seconds), from the lowering's instructions per trip."""

    issue: float
    mufu: float
    fp32: float
    int: float
    shared: float
    barriers: float

    @property
    def seconds(self) -> float:
        return max(self.issue, self.mufu, self.fp32, self.int, self.shared) + self.barriers


def loop_issue(bg: BlockGraph, s: KernelSchedule, t: Target, per_sm: int, busiest: int) -> LoopIssue:
    """The busiest SM's loop time by instruction class: ``busiest`` CTAs run there, ``min(per_sm, busiest)`` at once
    (occupancy), each of their warps issuing one trip's instructions as the lowering emits them (``codegen.issue``:
    counted from the rendered loop, by class) per trip, over the units ``issue.trip_clocks`` shares out.
    Tensor-core time is the FLOP term of ``_custom_kernel``."""
    from mugraph.codegen.arch import get_arch
    from mugraph.codegen.issue import IssueUnits, trip_clocks, trip_ops
    if s.forloop < 1 or not s.trips:
        return LoopIssue(0, 0, 0, 0, 0, 0)
    ops = trip_ops(bg, get_arch(s.arch), s.stages, s.splits, s.path)
    on_sm = max(1, min(per_sm, busiest))
    warps = on_sm * max(1, (s.threads - (128 if s.tma else 0)) // 32)
    clocks = trip_clocks(ops, warps, on_sm, IssueUnits.of(t))
    rounds = -(-busiest // on_sm) * s.trips / t.clock_hz
    return LoopIssue(**{k: v * rounds for k, v in clocks.items()})


# ---- sm_90a hook (codegen/hopper_model.py): products on wgmma reach the tensor-core peak, not mma.sync's; a TMA
# pipeline's bytes in flight and producer warpgroup are already in the schedule (bytes_in_flight, threads) ----------
def _tc_rate(s: KernelSchedule, t: Target) -> float:
    return hopper_model.tensor_core_rate(s, t.mma_sync_flops, t.tc_flops)


def _tc_peak(t: Target) -> float:
    """The fastest tensor-core rate a custom kernel can reach on the target's arch (a floor's rate)."""
    return max(t.mma_sync_flops, t.tc_flops) if get_arch(t.arch).wgmma else t.mma_sync_flops


def _lanes(s: KernelSchedule, t: Target, per_sm: int, busiest: int) -> float:
    """The share of an SM's processing blocks the resident warps keep busy: a warp issues on one processing
    block (its tensor core and FP32 lanes), so an SM holding fewer warps than it has blocks leaves some idle."""
    warps = min(per_sm, busiest) * (s.threads // 32)
    return min(1.0, warps / t.sm_subpartitions)


def _split_tail(s: KernelSchedule, t: Target) -> float:
    """The last CTA of a split block: it counts in (an L2 round trip), then reads every partial from L2 (the
    schedule weighs splits with the same tail, ``schedule.split_tail``)."""
    return split_tail(s.splits, s.state_bytes, t.hbm_latency_s, t.sm_load_bandwidth)


def _launches(graph: KernelGraph):
    """(name, node, custom?) of every kernel `graph` launches, in launch order."""
    seen_custom, outputs = {}, set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        op = node.op
        if op in KERNEL_LEAF or op is KOp.RESHAPE:
            continue
        if op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if key not in seen_custom:
                seen_custom[key] = name = f"k{len(seen_custom)}"
                yield name, node, True
            continue
        if op in KERNEL_LAYOUT and node not in outputs:
            continue   # a view: its consumer loads through it
        yield f"%{i} {op.value}", node, False


def _capturable(bg: BlockGraph, t: Target) -> bool:
    """Whether XLA can record the custom kernel into a command buffer: mugraph's FFI handler for plans without
    workspace is declared command-buffer compatible, the one for plans with workspace (split loops) is not."""
    try:
        return schedule(bg, t).splits == 1
    except MugraphError:
        return True   # it does not fit: _custom_kernel says so


def _kernels(graph: KernelGraph, t: Target, how: Launch) -> list[KernelEstimate]:
    launches = list(_launches(graph))
    charges = launch_charges(t, [not custom or _capturable(node.arg[0], t) for _, node, custom in launches], how)
    return [_custom_kernel(name, node.arg[0], node.srcs, t, launch) if custom else
            _library_kernel(name, node, t, launch) for (name, node, custom), launch in zip(launches, charges)]


def _custom_floor(bg: BlockGraph, srcs, t: Target, launch: float) -> float:
    """At most `_custom_kernel`'s seconds for `bg` whatever its schedule, computed without one: each input's HBM
    bytes at least the smaller of its traffic and its unique bytes, no partial states, the streaming rate at most
    BW with no first load (a rate below BW spends it inside the memory term), the busiest SM at least an even
    share, utilisation and lanes at most 1, one wave before the products, no split tail. Each
    term is the formula's with an operand moved the way that cannot raise it, and IEEE operations are monotone,
    so the bound holds as computed, not only in exact arithmetic."""
    c = block_cost(bg)
    hbm = sum(min(r.traffic, _unique_bytes(s)) for r, s in zip(c.reads, srcs)) + c.write_bytes
    memory = max(hbm / _bandwidth(t), c.traffic / t.l2_bandwidth, c.traffic / t.sm_count / t.sm_load_bandwidth)
    compute = c.tc_flops / _tc_peak(t) + c.simt_flops / t.simt_flops
    return max(memory, compute + t.hbm_latency_s) + launch


# ---- the public entry points ---------------------------------------------------------------------
_ESTIMATE_CACHE: "weakref.WeakKeyDictionary[KernelGraph, dict]" = weakref.WeakKeyDictionary()


def estimate(graph: KernelGraph, target="h100", *, launch=Launch.JIT, cuda_graph: bool = False) -> Estimate:
    """The modelled run time of `graph` on `target` (see the module docstring for the formulas), its kernels
    launched as ``launch`` says (`Launch`: inside jax.jit by default; ``cuda_graph=True`` is `Launch.GRAPH`).

    Raises ResourceError if a custom kernel does not fit the target (check `fits` first).
    """
    t, how = get_target(target), launch_path(launch, cuda_graph)
    per_graph = _ESTIMATE_CACHE.setdefault(graph, {})
    key = (t, how)
    if key not in per_graph:
        per_graph[key] = _estimate(graph, t, how)
    return per_graph[key]


def estimate_floor(graph: KernelGraph, target="h100", *, launch=Launch.JIT, cuda_graph: bool = False) -> float:
    """A lower bound on `estimate(graph, target).seconds` that needs no launch plan (so no lowering): library
    kernels as estimated, custom kernels by `_custom_floor`, every kernel charged as capturable (a split plan's
    kernel is not, which only raises its charge). The search's sizing skips the options whose floor cannot beat
    the ones it keeps; it holds for graphs that do not fit the target too."""
    t = get_target(target)
    launches = list(_launches(graph))
    charges = launch_charges(t, [True] * len(launches), launch_path(launch, cuda_graph))
    return sum(_custom_floor(node.arg[0], node.srcs, t, charge) if custom else
               _library_kernel(name, node, t, charge).seconds
               for (name, node, custom), charge in zip(launches, charges))


def _estimate(graph: KernelGraph, t: Target, how: Launch) -> Estimate:
    ks = tuple(_kernels(graph, t, how))
    return Estimate(t.name, sum(k.seconds for k in ks), sum(k.hbm_bytes for k in ks),
                    sum(k.tc_flops for k in ks), sum(k.simt_flops for k in ks), len(ks), ks)


def _essential_flops(spec: KernelGraph) -> tuple[int, int]:
    """Unpadded FLOPs of the library ops; a custom op in a spec counts its blocks' FLOPs."""
    flops = [kernel_node_flops(n, pad=False) for n in spec.nodes if n.op is not KOp.CUSTOM]
    flops += [(block_cost(bg).tc_flops, block_cost(bg).simt_flops) for bg, _ in spec.custom_ops()]
    return sum(f[0] for f in flops), sum(f[1] for f in flops)


def _does_work(spec: KernelGraph) -> bool:
    """False when every output is an input or a constant, possibly reshaped (no copy needed)."""
    def leaf(node):
        while node.op is KOp.RESHAPE:
            node = node.srcs[0]
        return node.op in KERNEL_LEAF
    return not all(leaf(o) for o in spec.outputs)


def roofline(spec: KernelGraph, target="h100", *, launch=Launch.JIT, cuda_graph: bool = False) -> Roofline:
    """The spec's lower bound: inputs read once and outputs written once at HBM bandwidth vs its
    essential (unpadded) FLOPs, matmuls at the tensor-core peak and the rest at the SIMT peak;
    one launch (a lone kernel on the ``launch`` path). seconds = max(memory, tensor-core, SIMT) + launch."""
    t = get_target(target)
    if not _does_work(spec):   # outputs are inputs or views of them: nothing to launch
        return Roofline(t.name, 0.0, 0, 0, 0, 0.0, 0.0, 0.0)
    used = {n for n in toposort(spec.outputs) if n.op is KOp.INPUT}
    hbm = sum(_tensor_bytes(n) for n in used) + sum(_tensor_bytes(o) for o in set(spec.outputs))
    tc, simt = _essential_flops(spec)
    memory = hbm / t.hbm_bandwidth
    compute = max(tc / t.tc_flops, simt / t.simt_flops)
    launch = launch_charges(t, [True], launch_path(launch, cuda_graph))[0]
    return Roofline(t.name, max(memory, compute) + launch, hbm, tc, simt, memory, compute,
                    launch)


# ---- reports ------------------------------------------------------------------------------------
def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def format_estimate(est: Estimate, bound: Roofline) -> str:
    """'x.xx µs (y.y× the roofline bound z.zz µs)'."""
    ratio = est.vs(bound)
    return f"{_us(est.seconds)} µs ({ratio:.1f}× the roofline bound {_us(bound.seconds)} µs)"


_COLUMNS = ("kernel", "kind", "µs", "HBM MB", "TC GFLOP", "SIMT GFLOP", "blocks", "/SM",
            "waves", "smem KB", "bound")


def _row(k: KernelEstimate) -> tuple:
    grid = (str(k.blocks), str(k.blocks_per_sm), str(k.waves)) if k.blocks else ("-", "-", "-")
    return (k.name, k.kind, _us(k.seconds), _mb(k.hbm_bytes), f"{k.tc_flops / 1e9:.3f}",
            f"{k.simt_flops / 1e9:.3f}", *grid, f"{k.smem_bytes / 1024:.1f}", k.bound)


def format_table(est: Estimate, bound: Roofline | None = None) -> str:
    """A small table: one line per kernel, then the total (and the roofline when given)."""
    rows = [_COLUMNS] + [_row(k) for k in est.kernels]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    total = (f"total on {est.target}: {_us(est.seconds)} µs, {est.launches} launches, "
             f"{_mb(est.hbm_bytes)} MB HBM, {est.tc_flops / 1e9:.3f} TC GFLOP, "
             f"{est.simt_flops / 1e9:.3f} SIMT GFLOP")
    lines.append(total if bound is None else f"{total}; {format_estimate(est, bound)}")
    return "\n".join(lines)
