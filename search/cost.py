"""Analytical cost model: the time a kernel graph takes on a target GPU, beside the spec's roofline.

Mirage profiles every candidate; mugraph ranks them with this model (bytes moved, tensor-core
and SIMT FLOPs, occupancy, waves, pipeline latency, launches) and profiles only the top few.

The model, per kernel (each library op is one kernel; transpose/reshape/broadcast fold into the
load of their consumer and cost nothing; each custom op is one kernel):

BW below is the bandwidth streaming kernels reach (`Target.hbm_efficiency` x peak); the
roofline uses the peak.

* library kernel (vendor-tuned, grid chosen by the library):
      t = max(bytes / BW, tc_flops / TC_peak, simt_flops / SIMT_peak) + launch
* custom kernel, B blocks, b = blocks per SM (threads, shared memory, registers), S SMs:
      waves = ceil(B / (S*b)),   n = ceil(B / S) blocks on the busiest SM,  util = B / (n*S)
      t_memory  = max(hbm_bytes / BW, traffic / L2_BW, n * block_traffic / SM_fill_BW)
      t_compute = (tc_flops / TC_mma_sync + simt_flops / SIMT_peak) / util
      t_latency = waves * rounds * HBM_latency     (rounds: serial load waits of one block)
      t = max(t_memory, t_compute, t_latency) + launch
  `bound` names the largest term ("latency" also when the launch outweighs the body).
  util < 1 is the cost of a grid that leaves SMs idle or a tail wave; t_latency is Little's
  law for a double-buffered loop: each iteration waits for the tile requested one iteration
  earlier, so a small tile per stage cannot keep HBM busy.
* HBM bytes of a custom kernel: outputs once; each input's traffic is tile bytes x (forloop if
  the loop walks it) x blocks. A tensor read by many blocks (replicated across a grid axis, or a
  broadcast view) costs its unique bytes when it fits in its share of L2 (inputs ordered by size
  share half the L2); otherwise each wave of concurrent blocks reads the distinct tiles it
  touches once (concurrent blocks walk the loop in near lockstep), i.e. waves x distinct bytes
  per wave, between the unique bytes and the full traffic. Cross-kernel L2 reuse (a small
  intermediate written by one kernel and read by the next) is not modelled: conservative for
  unfused graphs.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from enum import Enum

from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.errors import ResourceError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import KNode, toposort
from mugraph.ir.ops import (ACCUMULATORS, BLOCK_LEAF, BLOCK_REDUCE, BOp, KERNEL_LAYOUT,
                            KERNEL_LEAF, KOp, LAST_DIM_ACCUMULATORS, TOp)
from mugraph.ir.shapes import mma_dtype
from mugraph.ir.thread import ops_of
from mugraph.search.targets import Target, get_target

# ---- what the code generator plans (keep in step with codegen's shared-memory planner) ----------
PIPELINE_STAGES = 2       # loop-walked input tiles are double-buffered (cp.async)
MMA_M, MMA_N, MMA_K = 16, 8, 16   # mma.sync.m16n8k16: smaller matmuls are padded up to it
DEFAULT_REGS = 128        # register budget per thread unless accumulators need more
BASE_REGS = 40            # addresses, loop counters, MMA fragments
REG_FILE = 65536          # 32-bit registers per SM (sm_80 and sm_90)
MAX_REGS = 255            # per thread (sm_80 and sm_90)
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
    if op is BOp.MATMUL:
        a, b = node.srcs
        tc = mma_dtype(a.dtype, b.dtype).is_16bit
        f = matmul_flops(a.shape, b.shape, tc)
        return (f, 0) if tc else (0, f)
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
    """What a block graph costs whatever the target: FLOPs, reads, writes, footprint, rounds."""

    blocks: int
    threads: int
    grid: tuple
    tc_flops: int             # all blocks
    simt_flops: int
    reads: tuple[InputRead, ...]
    write_bytes: int
    smem_bytes: int
    regs_per_thread: int
    rounds: int               # serial HBM waits of one block (prologue + loop iterations)

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
    phase = bg.phases()
    tc, simt = _block_flops(phase, bg.forloop)
    regs, spill = _registers(bg, phase)
    return BlockCost(blocks=bg.num_blocks, threads=bg.threads, grid=bg.grid,
                     tc_flops=tc * bg.num_blocks, simt_flops=simt * bg.num_blocks,
                     reads=tuple(_input_read(n.arg, bg) for n in bg.inputs),
                     write_bytes=sum(_elems(o.shape) * o.dtype.itemsize for o in bg.outputs),
                     smem_bytes=_smem(bg, phase) + spill, regs_per_thread=regs,
                     rounds=_rounds(bg))


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


def _rounds(bg: BlockGraph) -> int:
    """The prologue's wait, then one wait per loop iteration that the pipeline cannot cover."""
    looped = any(n.arg.fmap is not None for n in bg.inputs)
    if not looped or bg.forloop == 1:
        return 1
    return 1 + -(-(bg.forloop - 1) // (PIPELINE_STAGES - 1))


def _tile_buffers(spec, forloop: int) -> int:
    bytes_ = _elems(spec.tile_shape) * spec.dtype.itemsize
    return bytes_ * (PIPELINE_STAGES if spec.fmap is not None and forloop > 1 else 1)


def _smem(bg: BlockGraph, phase) -> int:
    """Input tiles (loop-walked ones double-buffered, in their own dtype), matmul operands that
    are computed values (staged in 16-bit for ldmatrix), and the largest cross-warp reduction
    scratch (reused). Accumulators live in registers (see `_registers`)."""
    tiles = sum(_tile_buffers(n.arg, bg.forloop) for n in bg.inputs)
    staged = {s for n in phase if n.op is BOp.MATMUL for s in n.srcs if s.op is not BOp.INPUT}
    staged_bytes = sum(2 * _elems(s.shape) for s in staged)
    scratch = max((4 * (bg.threads // 32) * _reduced(n) for n in phase), default=0)
    return tiles + staged_bytes + scratch


def _reduced(node) -> int:
    """Values a cross-warp reduction produces (one fp32 partial per warp each), else 0."""
    if node.op in BLOCK_REDUCE or node.op in LAST_DIM_ACCUMULATORS:
        return _elems(node.shape)
    if node.op is BOp.RMS_NORM:
        return _elems(node.shape) // node.shape[node.arg[0]]
    return 0


def _registers(bg: BlockGraph, phase) -> tuple[int, int]:
    """(registers per thread, bytes spilled to shared memory).

    Live fp32 values: every accumulator, hoisted invariant values, and the largest loop matmul
    product that is not accumulated in place (its MMA fragments; elementwise chains on it run
    in those registers, and elementwise ops on input tiles stream from shared memory into
    their reduction or accumulator); spread over the block's threads on top of BASE_REGS.
    The budget is DEFAULT_REGS unless more are needed, up to what the register file allows
    for this many threads; the excess goes to shared memory.
    """
    acc = sum(_elems(n.shape) for n, p in phase.items() if p is Phase.ACCUMULATOR)
    inv = sum(_elems(n.shape) for n, p in phase.items()
              if p is Phase.INVARIANT and n.op not in BLOCK_LEAF)
    in_place = _accumulated_in_place(phase)
    work = max((_elems(n.shape) for n, p in phase.items()
                if p is Phase.LOOP and n.op is BOp.MATMUL and n not in in_place), default=0)
    need = BASE_REGS + -(-(acc + inv + work) // bg.threads)
    cap = min(MAX_REGS, REG_FILE // bg.threads // 8 * 8)
    regs = min(cap, max(DEFAULT_REGS, need))
    return regs, max(0, need - cap) * bg.threads * 4


def _accumulated_in_place(phase) -> set:
    """Matmuls read only by acc_sum: the MMA accumulates straight into the accumulator's
    registers, so the product needs no registers of its own."""
    users: dict = {}
    for n in phase:
        for s in n.srcs:
            users.setdefault(s, set()).add(n.op)
    return {n for n in phase if n.op is BOp.MATMUL and users.get(n) == {BOp.ACC_SUM}}


def smem_bytes(bg: BlockGraph) -> int:
    """Shared memory one block of `bg` needs (the planner's footprint; see `_smem`)."""
    return block_cost(bg).smem_bytes


def registers_per_thread(bg: BlockGraph) -> int:
    return block_cost(bg).regs_per_thread


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
    c = block_cost(bg)
    if c.threads > t.max_threads_per_block:
        return Misfit.THREADS
    if c.smem_bytes > t.smem_per_block:
        return Misfit.SHARED_MEMORY
    if blocks_per_sm(t, c.threads, c.smem_bytes, c.regs_per_thread) == 0:
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
    return 0 if root.op is KOp.CONSTANT else _tensor_bytes(root)


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
    seconds, bound = _finish({"memory": hbm / _bandwidth(t),
                              "compute": max(tc / t.tc_flops, simt / t.simt_flops)}, launch)
    kind = "copy" if node.op in KERNEL_LAYOUT else "library"
    return KernelEstimate(name, kind, seconds, hbm, tc, simt, 0, 0, 0, 0, bound)


def fused_kernel(name: str, reads, write_bytes: int, tc_flops: int, simt_flops: int,
                 target="h100", *, cuda_graph: bool = False) -> KernelEstimate:
    """One vendor-style kernel (a library call, an XLA fusion) that reads the tensors `reads` once
    each (a layout view counts as its root, constants are free) and writes `write_bytes`: the
    library-kernel formula of the module docstring. Used by `search.baseline`."""
    t = get_target(target)
    launch = t.graph_launch_s if cuda_graph else t.launch_s
    hbm = sum(_unique_bytes(r) for r in {_root(n) for n in reads}) + write_bytes
    seconds, bound = _finish({"memory": hbm / _bandwidth(t),
                              "compute": max(tc_flops / t.tc_flops, simt_flops / t.simt_flops)},
                             launch)
    return KernelEstimate(name, "library", seconds, hbm, tc_flops, simt_flops, 0, 0, 0, 0, bound)


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
    c = block_cost(bg)
    per_sm = blocks_per_sm(t, c.threads, c.smem_bytes, c.regs_per_thread)
    if per_sm == 0:
        raise ResourceError(
            f"custom kernel {name} needs {c.smem_bytes} B of shared memory and {c.threads} "
            f"threads x {c.regs_per_thread} registers per block; {t.name} allows "
            f"{t.smem_per_block} B per block", hint="smaller tiles (a larger grid or forloop); "
            "the search should call cost.fits() before estimating")
    slots = t.sm_count * per_sm
    waves = -(-c.blocks // slots)
    busiest = -(-c.blocks // t.sm_count)
    util = c.blocks / (busiest * t.sm_count)
    hbm = _hbm_reads(c, srcs, t, min(c.blocks, slots), waves) + c.write_bytes
    memory = max(hbm / _bandwidth(t), c.traffic / t.l2_bandwidth,
                 busiest * c.traffic / c.blocks / t.sm_load_bandwidth)
    compute = (c.tc_flops / t.mma_sync_flops + c.simt_flops / t.simt_flops) / util
    latency = waves * c.rounds * t.hbm_latency_s
    seconds, bound = _finish({"memory": memory, "compute": compute, "latency": latency}, launch)
    return KernelEstimate(name, "custom", seconds, hbm, c.tc_flops, c.simt_flops, c.blocks,
                          per_sm, waves, c.smem_bytes, bound)


def _kernels(graph: KernelGraph, t: Target, launch: float) -> list[KernelEstimate]:
    out, seen_custom = [], {}
    outputs = set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        op = node.op
        if op in KERNEL_LEAF or op is KOp.RESHAPE:
            continue
        if op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if key not in seen_custom:
                seen_custom[key] = name = f"k{len(seen_custom)}"
                out.append(_custom_kernel(name, node.arg[0], node.srcs, t, launch))
            continue
        if op in KERNEL_LAYOUT and node not in outputs:
            continue   # a view: its consumer loads through it
        out.append(_library_kernel(f"%{i} {op.value}", node, t, launch))
    return out


# ---- the public entry points ---------------------------------------------------------------------
_ESTIMATE_CACHE: "weakref.WeakKeyDictionary[KernelGraph, dict]" = weakref.WeakKeyDictionary()


def estimate(graph: KernelGraph, target="h100", *, cuda_graph: bool = False) -> Estimate:
    """The modelled run time of `graph` on `target` (see the module docstring for the formulas).

    Raises ResourceError if a custom kernel does not fit the target (check `fits` first).
    """
    t = get_target(target)
    per_graph = _ESTIMATE_CACHE.setdefault(graph, {})
    key = (t, cuda_graph)
    if key not in per_graph:
        per_graph[key] = _estimate(graph, t, t.graph_launch_s if cuda_graph else t.launch_s)
    return per_graph[key]


def _estimate(graph: KernelGraph, t: Target, launch: float) -> Estimate:
    ks = tuple(_kernels(graph, t, launch))
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


def roofline(spec: KernelGraph, target="h100", *, cuda_graph: bool = False) -> Roofline:
    """The spec's lower bound: inputs read once and outputs written once at HBM bandwidth vs its
    essential (unpadded) FLOPs, matmuls at the tensor-core peak and the rest at the SIMT peak;
    one launch. seconds = max(memory, tensor-core, SIMT) + launch."""
    t = get_target(target)
    if not _does_work(spec):   # outputs are inputs or views of them: nothing to launch
        return Roofline(t.name, 0.0, 0, 0, 0, 0.0, 0.0, 0.0)
    used = {n for n in toposort(spec.outputs) if n.op is KOp.INPUT}
    hbm = sum(_tensor_bytes(n) for n in used) + sum(_tensor_bytes(o) for o in set(spec.outputs))
    tc, simt = _essential_flops(spec)
    memory = hbm / t.hbm_bandwidth
    compute = max(tc / t.tc_flops, simt / t.simt_flops)
    launch = t.graph_launch_s if cuda_graph else t.launch_s
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
