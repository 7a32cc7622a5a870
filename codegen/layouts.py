"""Where a tile's elements live: register layouts (which thread holds which element) and shared-memory tile layouts.

Register layouts are frozen records that check their own arithmetic:

* ``Frag``: the fp32 accumulators of mma.sync m16n8k16 for a ``[batch.., M, N]`` tile, the block's warps tiling
  the output as a (batch, M/16, N/8) grid of warp tiles (M padded up to 16 and N up to 8);
* ``Rows``: a ``[batch.., M, 1]`` value held in the rows of a ``Frag`` (each lane its rows g and g + 8);
* ``Spread``: any tile, element ``o`` held by the group of ``group`` consecutive threads ``o % groups``
  (slot ``o // groups``); ``group == 1`` is the plain strided layout, larger groups reduce with shuffles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from functools import lru_cache

from mugraph.codegen.fragments import (LANE_BITS, MMA_SYNC_16816, Fragment, SmemLayout, Swizzle, bit_strides,
                                       choose_smem_layout, coord_c, render_index)
from mugraph.ir.errors import InvalidInput

PATH = MMA_SYNC_16816  # the mma shape and ldmatrix loads the generator emits
MMA = PATH.shape
WARP = 32


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def prod(shape) -> int:
    return math.prod(shape)


# ---- registers --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frag:
    """The warps' mma accumulator tiles of a ``[batch, m, n]`` product: a (wb, wm, wn) grid of warps, each holding
    (tb, tm, tn) m16n8 tiles, ``float v[tb][tm][tn][4]`` per lane."""

    batch: int
    m: int
    n: int
    warps: int
    wb: int
    wm: int
    wn: int

    def __post_init__(self):
        if self.used > self.warps or min(self.wb, self.wm, self.wn) < 1:
            raise InvalidInput(f"{self}: warp grid {self.wb}x{self.wm}x{self.wn} exceeds {self.warps} warps")
        if self.wb * self.tb < self.batch or self.wm * self.tm < self.mt or self.wn * self.tn < self.nt:
            raise InvalidInput(f"{self}: warp tiles do not cover the output")

    @property
    def mt(self) -> int:
        return ceil_div(self.m, MMA.m)

    @property
    def nt(self) -> int:
        return ceil_div(self.n, MMA.n)

    @property
    def tb(self) -> int:
        return ceil_div(self.batch, self.wb)

    @property
    def tm(self) -> int:
        return ceil_div(self.mt, self.wm)

    @property
    def tn(self) -> int:
        return ceil_div(self.nt, self.wn)

    @property
    def used(self) -> int:
        return self.wb * self.wm * self.wn

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return self.tb, self.tm, self.tn, MMA.c.regs

    # Which coordinates can fall outside the tile (padding, uneven warp splits, idle warps).
    @property
    def batch_guard(self) -> bool:
        return self.wb * self.tb > self.batch or self.used < self.warps

    @property
    def row_guard(self) -> bool:
        return self.wm * self.tm * MMA.m > self.m

    @property
    def col_guard(self) -> bool:
        return self.wn * self.tn * MMA.n > self.n

    def slot_coord(self, warp: int, lane: int, bi: int, mi: int, ni: int, q: int) -> tuple[int, int, int]:
        """(batch, row, col) of one register, as the generated code computes it (for tests)."""
        wb, wm, wn = warp // (self.wm * self.wn), warp // self.wn % self.wm, warp % self.wn
        row, col = MMA.c_coord(lane, q)
        return (wb * self.tb + bi, (wm * self.tm + mi) * MMA.m + row, (wn * self.tn + ni) * MMA.n + col)


def choose_frag(batch: int, m: int, n: int, warps: int) -> Frag:
    """The warp grid for a product: fewest tiles per warp, then no split of a row across warps (row reductions
    stay in a warp), then fewest fragment loads per k-step, then the most warps in use."""
    mt, nt = ceil_div(m, MMA.m), ceil_div(n, MMA.n)
    best = None
    for wb, wm, wn in product(range(1, min(batch, warps) + 1), range(1, min(mt, warps) + 1),
                              range(1, min(nt, warps) + 1)):
        if wb * wm * wn > warps:
            continue
        tb, tm, tn = ceil_div(batch, wb), ceil_div(mt, wm), ceil_div(nt, wn)
        key = (tb * tm * tn, wn > 1, tb * (tm + tn), -wb * wm * wn, wn)
        if best is None or key < best[0]:
            best = (key, (wb, wm, wn))
    wb, wm, wn = best[1]
    return Frag(batch, m, n, warps, wb, wm, wn)


def same_rows(a: Frag, b: Frag) -> bool:
    """Whether every thread holds the same rows, in the same row slots, in both Frags (their columns may differ)."""
    return (a.batch, a.m, a.warps, a.wb, a.wm, a.wn) == (b.batch, b.m, b.warps, b.wb, b.wm, b.wn)


@dataclass(frozen=True)
class Rows:
    """A ``[batch, m, 1]`` value in a Frag's row registers: ``float v[tb][tm][2]``, rows g and g + 8 of each m16
    tile, the same in the 4 lanes of a quad and in every warp of a warp-grid row."""

    frag: Frag

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.frag.tb, self.frag.tm, 2


@dataclass(frozen=True)
class Spread:
    """``size`` elements over ``threads`` threads in groups of ``group``: element o in group o % groups, slot
    o // groups; every lane of a group holds the element (groups reduce with shuffles)."""

    size: int
    threads: int
    group: int = 1

    def __post_init__(self):
        if self.group < 1 or self.group & (self.group - 1) or self.group > self.threads or \
                (self.group > WARP and self.group % WARP):
            raise InvalidInput(f"{self}: group must be a power of two dividing the block, whole warps above 32")

    @property
    def groups(self) -> int:
        return self.threads // self.group

    @property
    def slots(self) -> int:
        return ceil_div(self.size, self.groups)

    @property
    def guard(self) -> bool:
        return self.size % self.groups != 0

    @property
    def dims(self) -> tuple[int]:
        return (self.slots,)


def reduce_group(outputs: int, length: int, threads: int) -> int:
    """Lanes per output of a reduction: enough to use the whole block, at most the reduced length (rounded up to
    a power of two), whole warps above 32."""
    group = 1
    while group * 2 <= threads and group * 2 * outputs <= threads and group * 2 <= length:
        group *= 2
    if group > WARP and group % WARP:
        group = WARP
    return group


# ---- C index expressions of the mma path (rendered from the fragment tables) --------------------------------------


def _widths(frag: Fragment) -> tuple[int, int, int]:
    return LANE_BITS, (frag.regs - 1).bit_length(), (frag.elems_per_reg - 1).bit_length()


@lru_cache(maxsize=None)
def c_index(reg) -> tuple[str, str]:
    """(row, col) inside an m x n accumulator tile of C register ``reg`` of this lane: ``reg`` a C variable, or a
    tuple of (bit, C variable) pairs giving the register bit by bit (other bits 0)."""
    arg = dict(reg) if isinstance(reg, tuple) else reg
    return coord_c(MMA.c.coord, ("lane", arg, 0), _widths(MMA.c))


@lru_cache(maxsize=None)
def load_address(which: str) -> tuple[str, str]:
    """(row, col) of the shared-tile row this lane points ldmatrix at, for ``PATH.<which>``."""
    return coord_c(getattr(PATH, which).address, ("lane",), (LANE_BITS,))


@lru_cache(maxsize=None)
def row_shuffles() -> tuple[int, ...]:
    """XOR masks over the lanes that hold the same rows of a C tile (a row reduction's shuffles)."""
    _, strides = bit_strides(MMA.c.coord, _widths(MMA.c))
    lane_rows = strides[0][0]
    return tuple(1 << b for b, s in enumerate(lane_rows) if s == 0)


# ---- shared memory tiles -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileLayout:
    """A ``[batch, rows, cols]`` tile in shared memory: ``batch`` matrices one after another, each row-major with
    ``row_stride`` elements per row, XOR-swizzled or padded when ldmatrix reads it (``matrix``)."""

    batch: int
    rows: int
    cols: int
    itemsize: int
    matrix: SmemLayout | None = None  # the per-matrix ldmatrix layout (fragments.choose_smem_layout)

    @property
    def row_stride(self) -> int:
        return self.matrix.row_stride if self.matrix else self.cols

    @property
    def matrix_elems(self) -> int:
        return self.rows * self.row_stride

    @property
    def elems(self) -> int:
        return self.batch * self.matrix_elems

    @property
    def nbytes(self) -> int:
        return self.elems * self.itemsize

    @property
    def swizzle(self) -> Swizzle | None:
        return self.matrix.swizzle if self.matrix else None

    def index(self, b: str, r: str, c: str) -> str:
        """The element offset of (b, r, c) as a C expression."""
        inner = render_index(self.matrix, r, c) if self.matrix else _linear([r, c], [self.rows, self.cols])
        outer = _term(b, self.matrix_elems) if self.batch > 1 else ""
        return f"{outer} + {inner}" if outer else inner


def plain_tile(batch: int, rows: int, cols: int, itemsize: int) -> TileLayout:
    return TileLayout(batch, rows, cols, itemsize)


def mma_tile(batch: int, rows: int, cols: int, itemsize: int) -> TileLayout:
    """A tile ldmatrix reads: 16-byte rows, swizzled (power-of-two chunks per row) or padded."""
    return TileLayout(batch, rows, cols, itemsize, choose_smem_layout(rows, cols, itemsize))


# ---- C index expressions ----------------------------------------------------------------------------------------


def _term(coord: str, stride: int) -> str:
    if coord == "0" or stride == 0:
        return ""
    return coord if stride == 1 else f"{_paren(coord)} * {stride}"


def _paren(expr: str) -> str:
    return expr if expr.replace("_", "").isalnum() else f"({expr})"


def _linear(coords, shape) -> str:
    terms, stride = [], 1
    for c, d in reversed(list(zip(coords, shape))):
        if d > 1:
            t = _term(c, stride)
            if t:
                terms.append(t)
        stride *= d
    return " + ".join(reversed(terms)) or "0"


def linear(coords, shape) -> str:
    """Row-major offset of ``coords`` (C expressions) in ``shape``; unit dims contribute nothing."""
    return _linear(coords, shape)


def strided(coords, strides) -> str:
    """Offset of ``coords`` with explicit element ``strides``."""
    terms = [t for t in (_term(c, s) for c, s in zip(coords, strides)) if t]
    return " + ".join(terms) or "0"


def unravel(index: str, shape) -> list[str]:
    """C expressions for the coordinates of row-major ``index`` in ``shape`` ("0" for unit dims)."""
    coords, stride = [], prod(shape)
    for i, d in enumerate(shape):
        stride //= d
        if d == 1:
            coords.append("0")
            continue
        c = _paren(index)
        if stride > 1:
            c = f"{c} / {stride}"
        if i > 0 and prod(shape[:i]) > 1:
            c = f"{_paren(c)} % {d}" if stride > 1 else f"{c} % {d}"
        coords.append(c)
    return coords


def broadcast(src_shape, dst_shape, dst_coords) -> list[str]:
    """Coordinates in ``src_shape`` of the element at ``dst_coords`` of ``dst_shape`` (NumPy broadcasting)."""
    offset = len(dst_shape) - len(src_shape)
    return ["0" if d == 1 else dst_coords[offset + i] for i, d in enumerate(src_shape)]
