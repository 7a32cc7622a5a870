"""sm_90a's copy pipeline: the loop-walked input tiles land by TMA (one box per swizzled column block) in a ring of
stages, fed by a producer warpgroup that waits for a stage to be released and issues its copies, while the block's
own threads (the consumers) wait for each stage's mbarrier phase and release it after use.

Per stage s: ``full[s]`` (one arrival: the producer's arrive.expect_tx of the stage's bytes, completed by the
copies' complete_tx) and ``empty[s]`` (one arrival per consumer thread). Trip ``it`` uses stage ``it % S`` in its
phase ``it / S``: consumers wait on full[s] with parity ``(it / S) & 1``, the producer on empty[s] with the other
parity (its first pass finds the "previous" phase complete). The producer warpgroup gives its registers back
(setmaxnreg.dec), the consumers take theirs (setmaxnreg.inc), and consumers synchronise among themselves with a
named barrier, since the producer has left.

The tile layout (hopper_layouts.SwizzledTile) is the one wgmma's descriptors and ldmatrix read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from typing import TYPE_CHECKING

from mugraph.codegen.hopper_layouts import SwizzledTile, WARPGROUP, swizzle_for
from mugraph.codegen.kernel_ir import InputView
from mugraph.codegen.layouts import TileLayout
from mugraph.codegen.tma import MAX_BOX, MAX_RANK, TensorMapSpec
from mugraph.ir.block import AXES

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

PRODUCER_THREADS = WARPGROUP   # setmaxnreg acts on whole warpgroups: the producer is one (a thread of it issues)
PRODUCER_REGS = 40             # what the producer warpgroup keeps (setmaxnreg.dec)
CONSUMER_BARRIER = 1           # the named barrier id the consumers synchronise on (0 is __syncthreads)
MBARRIER_SLOTS = 2 * 16        # full and empty per stage, for the deepest pipeline (codegen.arch.MAX_STAGES)


@dataclass(frozen=True)
class Box:
    """One TMA copy of a stage: ``offset`` elements into the stage's buffer, at tensor coordinates ``coords`` (C
    expressions of the trip ``it``, innermost first)."""

    offset: int
    coords: tuple


@dataclass(frozen=True)
class TmaTile:
    """A loop-walked input tile that lands by TMA: its buffer, layout, tensor map and the boxes of one stage."""

    buf: str
    layout: TileLayout
    param: str          # the C parameter of the tensor it views (generate maps it to the plan's buffer)
    map: TensorMapSpec  # with the C parameter as its buffer until generate renames it
    boxes: tuple

    @property
    def stage_bytes(self) -> int:
        return self.layout.nbytes


@dataclass
class TmaPipeline:
    """The warp-specialised pipeline of one kernel."""

    mbar: str                  # the mbarrier buffer: full[0..S), then empty[0..S)
    stages: int
    trips: int
    consumers: int             # threads of the block graph
    tiles: list = field(default_factory=list)
    consumer_regs: int = 0     # setmaxnreg.inc target (0: none)

    @property
    def threads(self) -> int:
        return self.consumers + PRODUCER_THREADS

    @property
    def stage_bytes(self) -> int:
        return sum(t.stage_bytes for t in self.tiles)


# ---- which tiles, in which layout ------------------------------------------------------------------------------------

def swizzled_layout(tile: tuple, itemsize: int, roles=()) -> TileLayout | None:
    """The TMA / wgmma layout of a tile, or None when it has no such layout: rows of whole 32-, 64- or 128-byte
    blocks, whole 8-row periods, and no padding an mma operand would need (``roles``)."""
    if len(tile) < 2 or itemsize not in (2, 4):
        return None
    rows, cols = tile[-2], tile[-1]
    if ("B" in roles and rows % 16) or ("A" in roles and cols % 16):
        return None
    mode = swizzle_for(cols, itemsize)
    if mode is None or rows % 8 or rows > MAX_BOX:
        return None
    return TileLayout(math.prod(tile[:-2]), rows, cols, itemsize, SwizzledTile(rows, cols, itemsize, mode))


def tma_inputs(lw: Lowering) -> set:
    """The input nodes the pipeline loads: every loop-walked tile when all of them fit TMA (else none: the loop then
    keeps its cp.async pipeline), on an arch with TMA, with whole warpgroups of consumers."""
    if not (lw.arch.tma and lw.hopper) or lw.T % WARPGROUP or lw.T + PRODUCER_THREADS > lw.arch.max_threads:
        return set()
    looped = [(n, v) for n, v in zip(lw.g.inputs, lw.inputs) if n.arg.fmap is not None]
    if not looped or not all(_fits_tma(n, v, lw.mma_use.get(n, set())) for n, v in looped):
        return set()
    return {n for n, _ in looped}


def _fits_tma(node, view: InputView, roles) -> bool:
    spec, item = node.arg, node.arg.dtype.itemsize
    if view.param is None or view.iota is not None or view.strides[-1] != 1:
        return False
    kept = [d for d, extent in enumerate(spec.shape) if extent > 1]
    if len(kept) > MAX_RANK or any(view.strides[d] * item % 16 or view.strides[d] <= 0 for d in kept[:-1]):
        return False
    if spec.shape[-1] == 1:
        return False
    return swizzled_layout(tuple(spec.tile_shape), item, roles) is not None


# ---- the boxes and their tensor map ----------------------------------------------------------------------------------

def tma_tile(lw: Lowering, node, view: InputView, buf: str, layout: TileLayout) -> TmaTile:
    """The tensor map over the tile's tensor (dims of extent 1 dropped) and one stage's boxes: one per batch matrix
    and swizzled column block, at the tile's origin for trip ``it``."""
    spec, item = node.arg, node.arg.dtype.itemsize
    tile = tuple(spec.tile_shape)
    matrix: SwizzledTile = layout.matrix
    kept = [d for d, extent in enumerate(spec.shape) if extent > 1]
    box_full = [1] * (len(tile) - 2) + [tile[-2], matrix.atom_cols]
    tmap = TensorMapSpec(view.param, spec.dtype, tuple(spec.shape[d] for d in reversed(kept)),
                         tuple(view.strides[d] * item for d in reversed(kept)),
                         tuple(box_full[d] for d in reversed(kept)), matrix.mode)
    origin = _origin(lw, spec, tile)
    boxes = []
    for b in range(layout.batch):
        batch = [int(c) for c in np.unravel_index(b, tile[:-2])] if len(tile) > 2 else []
        for block in range(matrix.blocks):
            within = batch + [0, block * matrix.atom_cols]  # the box's first element, in the tile
            coords = [_plus(origin[d], within[d]) for d in range(len(tile))]
            boxes.append(Box(b * layout.matrix_elems + block * matrix.block_bytes // item,
                             tuple(coords[d] for d in reversed(kept))))
    return TmaTile(buf, layout, view.param, tmap, tuple(boxes))


def _origin(lw: Lowering, spec, tile: tuple) -> list[str]:
    """Per tensor dim, the C expression of the tile's first element at trip ``it`` (of this CTA's share)."""
    terms = [[] for _ in tile]
    for axis, dim in enumerate(spec.imap):
        bid = lw.bid(AXES[axis])
        if dim is not None and bid != "0":
            terms[dim].append(f"(int){bid} * {spec.shape[dim] // spec.grid[axis]}")
    if spec.fmap is not None:
        trip = "it" if lw.splits == 1 else f"(sp_ * {lw.F} + it)"
        terms[spec.fmap].append(f"{trip} * {tile[spec.fmap]}")
    return [" + ".join(t) or "0" for t in terms]


def _plus(expr: str, offset: int) -> str:
    if not offset:
        return expr
    return str(offset) if expr == "0" else f"{expr} + {offset}"


def start(lw: Lowering) -> None:
    """The pipeline of ``lw``'s TMA tiles (copies.lower_inputs placed them): its mbarriers, sized for the deepest
    pipeline so that the footprint does not change with the stages."""
    mbar = lw.buffer("barrier", 8 * MBARRIER_SLOTS, "mbarriers: full and empty per stage",
                     ctype="unsigned long long")
    lw.pipeline = TmaPipeline(mbar, lw.stages, lw.F, lw.T, list(lw.tma_tiles))


def consumer_regs(consumers: int, min_blocks: int) -> int:
    """setmaxnreg.inc's target: the registers each thread has at launch (what ``__launch_bounds__`` allows, which
    ptxas allocates when a kernel changes its register count), at most 240; the producer's release stays in the
    pool for the consumers. 0 when there is nothing to give."""
    per_thread = 65536 // (max(1, min_blocks) * (consumers + PRODUCER_THREADS))
    regs = min(240, per_thread // 8 * 8)
    return regs if regs > PRODUCER_REGS else 0


# ---- rendering ---------------------------------------------------------------------------------------------------------

def _wait_full(p: TmaPipeline, mb: str) -> str:
    return f"mg_mbar_wait({mb} + it % {p.stages}, (it / {p.stages}) & 1);  // this trip's tiles landed (TMA)"


def prologue(p: TmaPipeline, maps: dict) -> list[str]:
    """The kernel's start: the mbarriers, then the producer warpgroup's loop (and exit), then the consumers'
    registers. ``maps``: tile buffer -> the C name of its tensor-map parameter."""
    s, mb, t = p.stages, p.mbar, p.consumers
    lines = ["// warp-specialised pipeline: a producer warpgroup issues every TMA copy, the consumers compute",
             "if (tid == 0) {",
             f"  for (int s_ = 0; s_ < {s}; ++s_) {{",
             f"    mg_mbar_init({mb} + s_, 1);  // full: the producer's arrive.expect_tx, then the copies' bytes",
             f"    mg_mbar_init({mb} + {s} + s_, {t});  // empty: every consumer thread releases the stage",
             "  }", "  mg_fence_mbar_init();", "}", "mg_syncthreads();  // the mbarriers are ready for every thread",
             f"if (tid >= {t}) {{  // the producer warpgroup"]
    lines += [f"  mg_setmaxnreg_dec<{PRODUCER_REGS}>();"] if p.consumer_regs else []
    lines += [f"  if (tid == {t}) {{", "    #pragma unroll 1", f"    for (int it = 0; it < {p.trips}; ++it) {{",
              f"      const int s_ = it % {s};",
              f"      mg_mbar_wait({mb} + {s} + s_, ((it / {s}) & 1) ^ 1);  // the consumers released stage s_",
              f"      mg_mbar_arrive_expect_tx({mb} + s_, {p.stage_bytes});"]
    for tile in p.tiles:
        for box in tile.boxes:
            coords = ", ".join(box.coords)
            lines.append(f"      mg_tma_load_{len(box.coords)}d({tile.buf} + s_ * {tile.layout.elems}"
                         f"{f' + {box.offset}' if box.offset else ''}, &{maps[tile.buf]}, {mb} + s_, {coords});")
    lines += ["    }", "  }", "  return;", "}"]
    lines += [f"mg_setmaxnreg_inc<{p.consumer_regs}>();"] if p.consumer_regs else []
    return lines


def loop_top(p: TmaPipeline) -> list[str]:
    return [_wait_full(p, p.mbar)]


def loop_bottom(p: TmaPipeline) -> list[str]:
    return [f"mg_mbar_arrive({p.mbar} + {p.stages} + it % {p.stages});  // this thread is done with the trip's tiles"]


def consumer_barrier(consumers: int) -> str:
    return f"mg_bar_sync({CONSUMER_BARRIER}, {consumers});"
