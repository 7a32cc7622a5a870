"""Hopper's layouts as data: the shared-memory swizzle modes that TMA writes and wgmma reads, the tile layout both
use, wgmma's register fragments (the m64nNk16 accumulator and the A operand in registers) and the shared-memory
matrix descriptor with the canonical layouts it addresses.

``sm90_intrin.cuh`` holds the same maps in C (its "generated tables" block is rendered from this file by
``render_runtime_tables``; a test keeps the two equal) for the CPU emulation; codegen renders its index expressions
from the same records. Coordinates follow fragments.py: (row, col) of the operand, A is m x k, B is k x n, D is
m x n; a 32-bit register holds two 16-bit values, the lower-numbered (``half`` = 0) in the low 16 bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Mapping

from mugraph.codegen.fragments import LANES, Swizzle, _require, _require_bijection, coord_c
from mugraph.ir.errors import InvalidInput

WARPGROUP = 128          # threads of a warpgroup: 4 consecutive warps, the first one's index a multiple of 4
WGMMA_M, WGMMA_K = 64, 16  # wgmma.mma_async.m64nNk16 with 16-bit operands
WGMMA_NS = tuple(range(8, 257, 8))
CHUNK = 16               # bytes: a core-matrix row, the unit every swizzle moves


# ---- swizzle modes -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SwizzleMode:
    """A shared-memory swizzle both TMA (``CU_TENSOR_MAP_SWIZZLE_*``) and wgmma descriptors (bits 62-63) know:
    rows of ``width`` bytes whose 16-byte chunks are XORed with the row's index within each 8-row period, i.e.
    CuTe's ``Swizzle<bits, 4, 3>`` on byte addresses. The hardware applies it to shared-memory address bits, so a
    tile must start on a ``period``-byte boundary for the pattern to be the tile's own."""

    name: str
    width: int       # bytes of a swizzled row (16: no swizzle, core-matrix rows)
    desc_code: int   # the matrix descriptor's layout type (bits 62-63)
    tma_code: int    # CUtensorMapSwizzle

    @property
    def bits(self) -> int:
        return (self.width // CHUNK).bit_length() - 1

    @property
    def swizzle(self) -> Swizzle:
        return Swizzle(self.bits, 4, 3)

    @property
    def period(self) -> int:
        """Bytes after which the pattern repeats (8 rows): the alignment a swizzled tile needs."""
        return 8 * self.width

    def __call__(self, byte_address: int) -> int:
        return self.swizzle(byte_address)


SWIZZLE_NONE = SwizzleMode("none", 16, desc_code=0, tma_code=0)
SWIZZLE_32B = SwizzleMode("32B", 32, desc_code=3, tma_code=1)
SWIZZLE_64B = SwizzleMode("64B", 64, desc_code=2, tma_code=2)
SWIZZLE_128B = SwizzleMode("128B", 128, desc_code=1, tma_code=3)
SWIZZLES: Mapping[int, SwizzleMode] = {m.width: m for m in (SWIZZLE_NONE, SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_128B)}
BY_DESC_CODE: Mapping[int, SwizzleMode] = {m.desc_code: m for m in SWIZZLES.values()}


# ---- the tile layout TMA writes and wgmma / ldmatrix read ---------------------------------------------------------

@dataclass(frozen=True)
class SwizzledTile:
    """A rows x cols tile of ``dtype_bytes``-byte elements as TMA boxes land it with ``mode``: the columns are cut
    into blocks of ``width`` bytes (one TMA box each, a K-major or MN-major wgmma atom column), blocks one after
    another, each block row-major with ``width``-byte rows, swizzled on the whole byte offset (the hardware swizzles
    address bits, and every block starts on a period boundary). The same layout serves ldmatrix: chunks stay
    whole, and 8 consecutive rows at one chunk column hit 8 distinct chunks of a 128-byte line."""

    rows: int
    cols: int
    dtype_bytes: int
    mode: SwizzleMode

    def __post_init__(self):
        _require(self.mode.width >= 32, f"{self}: a swizzled tile needs rows of 32, 64 or 128 bytes")
        _require(self.dtype_bytes in (2, 4), f"{self}: elements of 2 or 4 bytes")
        _require(self.cols % self.atom_cols == 0, f"{self}: {self.cols} columns are not whole {self.mode.width}-byte "
                                                  f"blocks of {self.atom_cols}")
        _require(self.rows % 8 == 0, f"{self}: rows must be whole 8-row swizzle periods")

    @property
    def atom_cols(self) -> int:
        """Columns in one block (one swizzled row)."""
        return self.mode.width // self.dtype_bytes

    @property
    def blocks(self) -> int:
        return self.cols // self.atom_cols

    @property
    def block_bytes(self) -> int:
        return self.rows * self.mode.width

    @property
    def swizzle(self) -> Swizzle:
        return self.mode.swizzle

    @property
    def pad(self) -> int:
        return 0

    @property
    def row_stride(self) -> int:
        """Elements per row on average (the tile is dense): what TileLayout's per-matrix size reads."""
        return self.cols

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype_bytes

    def linear_bytes(self, row: int, col: int) -> int:
        """The unswizzled byte offset of (row, col): its block, its row in the block, its column in the row."""
        block, within = divmod(col, self.atom_cols)
        return block * self.block_bytes + row * self.mode.width + within * self.dtype_bytes

    def offset(self, row: int, col: int) -> int:
        """The element offset of (row, col)."""
        return self.mode(self.linear_bytes(row, col)) // self.dtype_bytes

    def render_index(self, row: str = "row", col: str = "col") -> str:
        """A C expression (also Python) for ``offset(row, col)`` in elements; fully parenthesised."""
        a = self.atom_cols
        base = (CHUNK // self.dtype_bytes).bit_length() - 1  # Swizzle<bits, 4, 3> on bytes is <bits, base, 3> here
        parts = [f"({row}) * {a}"]
        if self.blocks > 1:
            parts = [f"(({col}) >> {a.bit_length() - 1}) * {self.rows * a}"] + parts + [f"(({col}) & {a - 1})"]
        else:
            parts.append(f"({col})")
        lin = f"({' + '.join(parts)})"
        mask = ((1 << self.mode.bits) - 1) << base
        return f"({lin} ^ (({lin} >> 3) & {mask}))"


def swizzle_for(cols: int, dtype_bytes: int) -> SwizzleMode | None:
    """The widest swizzle whose rows divide ``cols`` columns of ``dtype_bytes`` bytes (None: rows under 32 bytes or
    not whole blocks)."""
    for width in (128, 64, 32):
        if cols * dtype_bytes % width == 0:
            return SWIZZLES[width]
    return None


# ---- wgmma register fragments --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WgFragment:
    """Which element of a rows x cols operand each (thread of the warpgroup, register, half) holds."""

    name: str
    rows: int
    cols: int
    regs: int
    elems_per_reg: int
    coord: Callable[[int, int, int], tuple[int, int]] = field(repr=False)

    def __post_init__(self):
        _require(self.regs * WARPGROUP * self.elems_per_reg == self.rows * self.cols,
                 f"{self.name}: {self.regs} regs x {WARPGROUP} threads x {self.elems_per_reg} != {self.rows} x "
                 f"{self.cols}")
        _require_bijection(self.name, [self.coord(*s) for s in self.slots()], (self.rows, self.cols))

    def slots(self) -> list[tuple[int, int, int]]:
        return [(t, r, h) for t in range(WARPGROUP) for r in range(self.regs) for h in range(self.elems_per_reg)]


def _split(thread: int) -> tuple[int, int, int]:
    """(warp in the warpgroup, groupID, threadID_in_group) of a warpgroup thread."""
    lane = thread % LANES
    return thread // LANES, lane >> 2, lane & 3


def _wgmma_d(thread: int, reg: int, half: int = 0) -> tuple[int, int]:
    w, g, t = _split(thread)
    return 16 * w + g + 8 * ((reg >> 1) & 1), 2 * t + (reg & 1) + 8 * (reg >> 2)


def _wgmma_a(thread: int, reg: int, half: int) -> tuple[int, int]:
    w, g, t = _split(thread)
    return 16 * w + g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)


@lru_cache(maxsize=None)
def wgmma_d(n: int) -> WgFragment:
    """The fp32 accumulator of wgmma.mma_async.m64nNk16: N/2 registers per thread."""
    _require(n in WGMMA_NS, f"wgmma has no n = {n}; n is a multiple of 8 up to 256")
    return WgFragment(f"wgmma.m64n{n}k16.D", WGMMA_M, n, n // 2, 1, _wgmma_d)


WGMMA_A = WgFragment("wgmma.m64nNk16.A (registers)", WGMMA_M, WGMMA_K, 4, 2, _wgmma_a)


def frag_register(ni: int, q: int) -> int:
    """The wgmma D register that holds an mma.sync C register: warp w of the warpgroup holds rows 16w..16w+15 of
    the m64 tile exactly as an m16n8 C fragment per n-tile ``ni`` (``Frag`` with the warps stacked along M), so a
    Frag's ``v[bi][0][ni][q]`` is wgmma register ``4 ni + q`` (checked by ``check_frag_correspondence``)."""
    return 4 * ni + q


def check_frag_correspondence(n: int) -> None:
    """InvalidInput unless every wgmma D register is the Frag register ``frag_register`` names."""
    from mugraph.codegen.layouts import Frag
    f = Frag(1, WGMMA_M, n, 4, 1, 4, 1)
    d = wgmma_d(n)
    for thread in range(WARPGROUP):
        for ni in range(n // 8):
            for q in range(4):
                _, row, col = f.slot_coord(thread // LANES, thread % LANES, 0, 0, ni, q)
                _require((row, col) == d.coord(thread, frag_register(ni, q)),
                         f"thread {thread} Frag register ({ni}, {q}) is ({row}, {col}), wgmma register "
                         f"{frag_register(ni, q)} is {d.coord(thread, frag_register(ni, q))}")


# ---- the shared-memory matrix descriptor ---------------------------------------------------------------------------

DESC_FIELD_BITS = 14  # start address, LBO and SBO: 14 bits each of a byte value >> 4


@dataclass(frozen=True)
class SmemDescriptor:
    """wgmma's 64-bit shared-memory matrix descriptor: start address, leading- and stride-dimension byte offsets
    (each stored >> 4 in 14 bits), the matrix base offset (bits 49-51) and the swizzle mode (bits 62-63)."""

    start: int
    lbo: int
    sbo: int
    mode: SwizzleMode
    base_offset: int = 0

    def __post_init__(self):
        for name in ("start", "lbo", "sbo"):
            value = getattr(self, name)
            _require(value % CHUNK == 0 and 0 <= value >> 4 < 1 << DESC_FIELD_BITS,
                     f"descriptor {name} = {value} is not a multiple of 16 below {CHUNK << DESC_FIELD_BITS}")
        _require(0 <= self.base_offset < 8, f"base offset {self.base_offset} is a 3-bit field")

    def encode(self) -> int:
        return ((self.start >> 4) | (self.lbo >> 4) << 16 | (self.sbo >> 4) << 32 | self.base_offset << 49
                | self.mode.desc_code << 62)

    @staticmethod
    def decode(bits: int) -> "SmemDescriptor":
        field_ = lambda shift: ((bits >> shift) & ((1 << DESC_FIELD_BITS) - 1)) << 4
        return SmemDescriptor(field_(0), field_(16), field_(32), BY_DESC_CODE[(bits >> 62) & 3], (bits >> 49) & 7)


@dataclass(frozen=True)
class Canonical:
    """One canonical layout a descriptor addresses, for 16-bit elements: the byte offset (before the swizzle) of
    element (mn, k) of the operand (mn: a row of A or a column of B), as strides per coordinate bit group.

    ``mn_inner`` elements along MN are contiguous (2 bytes apart) before the ``mn_outer`` stride repeats them;
    k has ``k_inner`` elements per 16-byte chunk step or row step. ``lbo`` / ``sbo`` name which descriptor field
    strides which group (PTX ISA "Shared memory matrix layout"; CuTe make_gmma_desc)."""

    major: str               # "K": k contiguous; "MN": mn contiguous
    mode: SwizzleMode

    def byte_offset(self, mn: int, k: int, lbo: int, sbo: int) -> int:
        w = self.mode.width
        if self.major == "K":
            # ((8, m), (8 elements, 2 chunks)): rows 8 apart by SBO; a row's chunks side by side (swizzled: rows
            # of w bytes), or core matrices along k by LBO (no swizzle)
            row = (mn % 8) * (w if self.mode.bits else CHUNK) + (mn // 8) * sbo
            chunk = (k // 8) * (CHUNK if self.mode.bits else lbo)
            return row + chunk + (k % 8) * 2
        # MN-major: ((w/2 elements, m), (8, k)); no swizzle: ((8 elements, m) by SBO, (8 rows of 16 B, k) by LBO)
        if not self.mode.bits:
            return (mn % 8) * 2 + (mn // 8) * sbo + (k % 8) * CHUNK + (k // 8) * lbo
        inner = w // 2
        return (mn % inner) * 2 + (mn // inner) * lbo + (k % 8) * w + (k // 8) * sbo


def descriptor_address(desc: SmemDescriptor, major: str, mn: int, k: int) -> int:
    """The shared-memory byte address wgmma reads element (mn, k) of a 16-bit operand from."""
    _require(desc.base_offset == 0, "a nonzero matrix base offset is not modelled")
    return desc.mode(desc.start + Canonical(major, desc.mode).byte_offset(mn, k, desc.lbo, desc.sbo))


@dataclass(frozen=True)
class OperandDesc:
    """How codegen describes a SwizzledTile operand to wgmma: the descriptor's LBO and SBO, its major mode, and the
    element offset of k-step ``ks``'s start (plus ``row0`` rows for a warpgroup's share of A)."""

    major: str
    lbo: int
    sbo: int
    mode: SwizzleMode

    @property
    def trans(self) -> int:
        """imm-trans-a / imm-trans-b: 0 for K-major, 1 for MN-major (A is K-major and B MN-major untransposed)."""
        return 1 if self.major == "MN" else 0


def a_operand(tile: SwizzledTile) -> OperandDesc:
    """A (m x k, k contiguous: K-major) in a SwizzledTile: rows 8 apart by SBO = 8 rows of ``width`` bytes."""
    _require(tile.dtype_bytes == 2, "wgmma operands are 16-bit here")
    return OperandDesc("K", CHUNK, 8 * tile.mode.width, tile.mode)


def b_operand(tile: SwizzledTile) -> OperandDesc:
    """B (k x n, n contiguous: MN-major, imm-trans-b = 1): column blocks LBO apart, 8-row k groups by SBO."""
    _require(tile.dtype_bytes == 2, "wgmma operands are 16-bit here")
    return OperandDesc("MN", tile.block_bytes, 8 * tile.mode.width, tile.mode)


def a_start(tile: SwizzledTile, ks: int, row0: int = 0) -> int:
    """Element offset of A's k-step ``ks`` (rows from ``row0``): its block, the step's place in the row."""
    k0 = ks * WGMMA_K
    block, within = divmod(k0, tile.atom_cols)
    return (block * tile.block_bytes + row0 * tile.mode.width) // 2 + within


def b_start(tile: SwizzledTile, ks: int) -> int:
    """Element offset of B's k-step ``ks``: 16 rows of block 0 further."""
    return ks * WGMMA_K * tile.mode.width // 2


# ---- the C tables of the CPU emulation -----------------------------------------------------------------------------

GENERATED_BEGIN = "// ---- BEGIN GENERATED TABLES (codegen/hopper_layouts.py render_runtime_tables) ----"
GENERATED_END = "// ---- END GENERATED TABLES ----"


def render_runtime_tables() -> str:
    """The C of the emulation's fragment maps, rendered from ``wgmma_d`` / ``WGMMA_A`` (bit strides, as codegen
    renders its indices), and of the swizzle modes: the block of sm90_intrin.cuh between the markers."""
    d_row, d_col = coord_c(_wgmma_d, ("t", "i", 0), (7, 7, 0))
    a_row, a_col = coord_c(_wgmma_a, ("t", "r", "h"), (7, 2, 1))
    modes = sorted(SWIZZLES.values(), key=lambda m: m.desc_code)
    widths = ", ".join(str(m.width) for m in modes)
    tma = sorted(SWIZZLES.values(), key=lambda m: m.tma_code)
    tma_widths = ", ".join(str(m.width) for m in tma)
    return "\n".join([
        GENERATED_BEGIN,
        "// wgmma.m64nNk16 fp32 accumulator: thread t (of the warpgroup), register i -> (row, col)",
        f"MG_DEVICE int mgsm90_d_row(int t, int i) {{ return {d_row}; }}",
        f"MG_DEVICE int mgsm90_d_col(int t, int i) {{ return {d_col}; }}",
        "// wgmma.m64nNk16 A in registers: thread t, register r, half h -> (row, k)",
        f"MG_DEVICE int mgsm90_a_row(int t, int r, int h) {{ return {a_row}; }}",
        f"MG_DEVICE int mgsm90_a_col(int t, int r, int h) {{ return {a_col}; }}",
        "// swizzled row width in bytes per descriptor layout type (bits 62-63) and per CUtensorMapSwizzle",
        f"MG_DEVICE int mgsm90_desc_width(int code) {{ const int w[4] = {{{widths}}}; return w[code & 3]; }}",
        f"MG_DEVICE int mgsm90_tma_width(int code) {{ const int w[4] = {{{tma_widths}}}; return w[code & 3]; }}",
        GENERATED_END,
    ])


def runtime_tables_block(header_text: str) -> str:
    """The generated block as it stands in a header's text."""
    start, end = header_text.find(GENERATED_BEGIN), header_text.find(GENERATED_END)
    if start < 0 or end < 0:
        raise InvalidInput("the header has no generated-tables block", hint="restore the markers")
    return header_text[start:end + len(GENERATED_END)]


def write_runtime_tables() -> None:
    """Rewrite the generated block of sm90_intrin.cuh from the tables."""
    from mugraph.codegen.compile import RUNTIME_DIR
    path = RUNTIME_DIR / "sm90_intrin.cuh"
    text = path.read_text()
    path.write_text(text.replace(runtime_tables_block(text), render_runtime_tables()))


if __name__ == "__main__":
    write_runtime_tables()
