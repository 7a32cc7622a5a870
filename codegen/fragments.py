"""MMA fragment layouts, ldmatrix layouts and shared-memory tile layouts as small frozen records that check their
own arithmetic when built; tc_intrin.cuh implements the same maps in PTX and in its CPU emulation.

Coordinates are (row, col) of the operand tile: A is m x k, B is k x n, C/D is m x n. A 32-bit register holds two
16-bit values, the lower-numbered one (``half`` = 0) in the low 16 bits.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import product
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Sequence

import numpy as np

from mugraph.ir.errors import InvalidInput

LANES = 32
BANKS = 32
BANK_BYTES = 4
CHUNK_BYTES = 16  # one cp.async, one ldmatrix row

Coord = tuple[int, int]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInput(message)


def _require_bijection(what: str, coords: Sequence[tuple[int, ...]], bounds: tuple[int, ...]) -> None:
    """Every coordinate lies inside ``bounds`` and each of the prod(bounds) cells is hit exactly once."""
    for c in coords:
        _require(all(0 <= x < b for x, b in zip(c, bounds)), f"{what}: coordinate {c} outside {bounds}")
    cells = 1
    for b in bounds:
        cells *= b
    _require(len(coords) == cells and len(set(coords)) == cells,
             f"{what}: {len(set(coords))} distinct coordinates for {cells} cells (each must be covered once)")


# ---- mma.sync fragments ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fragment:
    """Which element of a rows x cols operand tile each (lane, register, half) of a warp holds."""

    name: str
    rows: int
    cols: int
    regs: int  # 32-bit registers per lane
    elems_per_reg: int  # 2: two 16-bit values; 1: one fp32
    coord: Callable[[int, int, int], Coord] = field(repr=False)

    def __post_init__(self):
        _require(self.regs * LANES * self.elems_per_reg == self.rows * self.cols,
                 f"{self.name}: {self.regs} regs x {LANES} lanes x {self.elems_per_reg} != "
                 f"{self.rows} x {self.cols}")
        _require_bijection(self.name, [self.coord(*s) for s in self.slots()], (self.rows, self.cols))

    def slots(self) -> list[tuple[int, int, int]]:
        """Every (lane, reg, half) of the fragment."""
        return [(lane, reg, half) for lane in range(LANES) for reg in range(self.regs)
                for half in range(self.elems_per_reg)]


def _group(lane: int) -> tuple[int, int]:
    """PTX's groupID and threadID_in_group."""
    return lane >> 2, lane & 3


def _m16n8k16_a(lane: int, reg: int, half: int) -> Coord:
    g, t = _group(lane)
    return g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)


def _m16n8k16_b(lane: int, reg: int, half: int) -> Coord:
    g, t = _group(lane)
    return 2 * t + half + 8 * reg, g


def _m16n8k16_c(lane: int, reg: int, half: int = 0) -> Coord:
    g, t = _group(lane)
    return g + 8 * (reg >> 1), 2 * t + (reg & 1)


@dataclass(frozen=True)
class MmaShape:
    """One mma.sync shape: its operand fragments and the tc_intrin.cuh function per input dtype."""

    m: int
    n: int
    k: int
    a: Fragment
    b: Fragment
    c: Fragment
    intrinsics: tuple[tuple[str, str], ...]  # (input dtype, function)

    def __post_init__(self):
        for frag, shape in ((self.a, (self.m, self.k)), (self.b, (self.k, self.n)), (self.c, (self.m, self.n))):
            _require((frag.rows, frag.cols) == shape, f"{frag.name} is {frag.rows}x{frag.cols}, expected {shape}")

    def a_coord(self, lane: int, reg: int, half: int) -> Coord:
        return self.a.coord(lane, reg, half)

    def b_coord(self, lane: int, reg: int, half: int) -> Coord:
        return self.b.coord(lane, reg, half)

    def c_coord(self, lane: int, reg: int, half: int = 0) -> Coord:
        return self.c.coord(lane, reg, half)

    def intrinsic(self, dtype: str) -> str:
        names = dict(self.intrinsics)
        _require(dtype in names, f"no m{self.m}n{self.n}k{self.k} mma for {dtype!r}; have {sorted(names)}")
        return names[dtype]


MMA_M16N8K16 = MmaShape(
    m=16, n=8, k=16,
    a=Fragment("m16n8k16.A", rows=16, cols=16, regs=4, elems_per_reg=2, coord=_m16n8k16_a),
    b=Fragment("m16n8k16.B", rows=16, cols=8, regs=2, elems_per_reg=2, coord=_m16n8k16_b),
    c=Fragment("m16n8k16.C", rows=16, cols=8, regs=4, elems_per_reg=1, coord=_m16n8k16_c),
    intrinsics=(("f16", "mg_mma_m16n8k16_f16"), ("bf16", "mg_mma_m16n8k16_bf16")),
)


# ---- ldmatrix ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ldmatrix:
    """``ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16``: lane 8j+i passes the address of row i of 8x8 matrix j;
    lane l receives in register j two 16-bit values of matrix j."""

    num: int
    trans: bool

    def __post_init__(self):
        _require(self.num in (1, 2, 4), f"ldmatrix loads 1, 2 or 4 matrices, not {self.num}")
        slots = [(lane, reg, half) for lane in range(LANES) for reg in range(self.num) for half in range(2)]
        _require_bijection(self.intrinsic, [self.coord(*s) for s in slots], (self.num, 8, 8))

    @property
    def intrinsic(self) -> str:
        return f"mg_ldmatrix_x{self.num}{'_trans' if self.trans else ''}"

    def coord(self, lane: int, reg: int, half: int) -> tuple[int, int, int]:
        """(matrix, row, col): ``row`` is whose address (lane 8*matrix+row), ``col`` the 16-bit element in it."""
        if self.trans:
            return reg, 2 * (lane % 4) + half, lane // 4
        return reg, lane // 4, 2 * (lane % 4) + half

    @staticmethod
    def address_lane(matrix: int, row: int) -> int:
        return 8 * matrix + row


LDMATRIX = {(num, trans): Ldmatrix(num, trans) for num in (1, 2, 4) for trans in (False, True)}


@dataclass(frozen=True)
class OperandLoad:
    """How one ldmatrix fills ``tiles`` mma operand fragments from a row-major shared-memory tile.

    ``address(lane)`` is the (row, col) of the shared tile whose 16-byte row that lane points at. Register j
    becomes register ``j % fragment.regs`` of fragment ``j // fragment.regs``; fragments sit side by side along
    the fragment's columns. ``transposed``: the shared tile stores the operand transposed (B as n x k).
    """

    name: str
    ld: Ldmatrix
    fragment: Fragment
    address: Callable[[int], Coord] = field(repr=False)
    tiles: int = 1
    transposed: bool = False

    def __post_init__(self):
        _require(self.ld.num == self.tiles * self.fragment.regs,
                 f"{self.name}: {self.ld.intrinsic} fills {self.ld.num} registers, {self.tiles} fragment(s) of "
                 f"{self.fragment.name} need {self.tiles * self.fragment.regs}")
        for lane, reg, half in ((l, r, h) for l in range(LANES) for r in range(self.ld.num) for h in range(2)):
            got, want = self.smem_coord(lane, reg, half), self.fragment_coord(lane, reg, half)
            _require(got == want, f"{self.name}: lane {lane} reg {reg} half {half} loads shared {got}, the "
                                  f"fragment needs {want}")

    def smem_coord(self, lane: int, reg: int, half: int) -> Coord:
        """The shared-tile element that ldmatrix delivers to (lane, reg, half)."""
        matrix, row, col = self.ld.coord(lane, reg, half)
        r0, c0 = self.address(Ldmatrix.address_lane(matrix, row))
        return r0, c0 + col

    def fragment_coord(self, lane: int, reg: int, half: int) -> Coord:
        """Where (lane, reg, half) belongs in the shared tile according to the mma fragment."""
        tile, frag_reg = divmod(reg, self.fragment.regs)
        row, col = self.fragment.coord(lane, frag_reg, half)
        row, col = row, col + tile * self.fragment.cols
        return (col, row) if self.transposed else (row, col)


A_X4 = OperandLoad("A (m x k) via ldmatrix.x4", LDMATRIX[4, False], MMA_M16N8K16.a,
                   address=lambda lane: (lane % 16, 8 * (lane // 16)))
B_X2_TRANS = OperandLoad("B (k x n) via ldmatrix.x2.trans", LDMATRIX[2, True], MMA_M16N8K16.b,
                         address=lambda lane: (lane % 16, 0))
B_X4_TRANS = OperandLoad("two B (k x n) via ldmatrix.x4.trans", LDMATRIX[4, True], MMA_M16N8K16.b,
                         address=lambda lane: (lane % 16, 8 * (lane // 16)), tiles=2)
B_X2 = OperandLoad("B stored n x k via ldmatrix.x2", LDMATRIX[2, False], MMA_M16N8K16.b,
                   address=lambda lane: (lane % 8, 8 * (lane // 8 % 2)), transposed=True)
B_X4 = OperandLoad("two B stored n x k via ldmatrix.x4", LDMATRIX[4, False], MMA_M16N8K16.b,
                   address=lambda lane: (lane % 8 + 8 * (lane // 16), 8 * (lane // 8 % 2)), tiles=2,
                   transposed=True)


# ---- the generator's path through the tables -----------------------------------------------------------------

@dataclass(frozen=True)
class MmaPath:
    """How the generator feeds one mma shape: the ldmatrix loads of its A fragments and of its B fragments, one
    load filling ``b_wide.tiles`` n-tiles side by side and ``b_one`` a single n-tile. Every index the generated
    code computes for these instructions is rendered from these records (``coord_c``)."""

    shape: MmaShape
    a_load: OperandLoad
    b_wide: OperandLoad
    b_one: OperandLoad

    def __post_init__(self):
        for load, frag in ((self.a_load, self.shape.a), (self.b_wide, self.shape.b), (self.b_one, self.shape.b)):
            _require(load.fragment is frag, f"{load.name} loads {load.fragment.name}, not {frag.name}")
        _require(self.b_one.tiles == 1, f"{self.b_one.name} must fill one n-tile")

    def a_from_c(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per A register, per half: (n-tile offset, C register) of the C fragment element that holds the same
        (row, k) for every lane -- how a product's accumulators become the next product's A fragment (n-tile
        ``ks * k / n + offset`` at k-step ks)."""
        m = self.shape
        where = {}
        for dt in range(m.k // m.n):
            for q in range(m.c.regs):
                cells = tuple(_shift(m.c_coord(lane, q), 0, dt * m.n) for lane in range(LANES))
                where[cells] = (dt, q)
        out = []
        for reg in range(m.a.regs):
            halves = []
            for half in range(m.a.elems_per_reg):
                cells = tuple(m.a_coord(lane, reg, half) for lane in range(LANES))
                _require(cells in where, f"A register {reg} half {half} is held by no C register of one lane")
                halves.append(where[cells])
            out.append(tuple(halves))
        return tuple(out)


def _shift(c: Coord, dr: int, dc: int) -> Coord:
    return c[0] + dr, c[1] + dc


# mma.sync m16n8k16 with fp16/bf16 operands, as the generator emits it (sm_80 and sm_90).
MMA_SYNC_16816 = MmaPath(MMA_M16N8K16, a_load=A_X4, b_wide=B_X4_TRANS, b_one=B_X2_TRANS)


# ---- C index expressions from the tables ----------------------------------------------------------------------
# Every map above is bit-linear: each coordinate is a sum over the bits of lane, register and half of bit x stride.
# ``bit_strides`` reads the strides off a map (and checks the form on every input); ``coord_c`` renders them as C.

LANE_BITS = 5
# PTX's groupID (lane >> 2) and threadID_in_group (lane & 3): kernel-scope variables of every generated kernel.
LANE_NAMES = {("lane", 2, 5): "g_", ("lane", 0, 2): "t4_"}


def bit_strides(fn: Callable, widths: Sequence[int]) -> tuple[tuple[int, ...], tuple]:
    """(base, strides) with ``fn(*args)[c] == base[c] + sum(strides[c][i][b] * bit b of args[i])`` for every
    argument whose i-th value has ``widths[i]`` bits; InvalidInput if ``fn`` is not of that form."""
    base = tuple(fn(*[0] * len(widths)))
    strides = tuple(
        tuple(tuple(fn(*[1 << b if j == i else 0 for j in range(len(widths))])[c] - base[c] for b in range(w))
              for i, w in enumerate(widths))
        for c in range(len(base)))
    for args in product(*(range(1 << w) for w in widths)):
        got = fn(*args)
        for c, per_arg in enumerate(strides):
            want = base[c] + sum(s * ((a >> b) & 1) for a, ss in zip(args, per_arg) for b, s in enumerate(ss))
            _require(got[c] == want, f"map is not bit-linear: {args} -> {got}, the bit sum gives {want} at {c}")
    return base, strides


def coord_c(fn: Callable, args: Sequence, widths: Sequence[int]) -> tuple[str, ...]:
    """C expressions of ``fn``'s coordinates. ``args[i]``: the C variable holding argument i, an int (a known
    value), or a dict {bit: C variable or int} giving argument i bit by bit (its other bits 0)."""
    base, strides = bit_strides(fn, widths)
    return tuple(_render_coord(b, per_arg, args, widths) for b, per_arg in zip(base, strides))


def _render_coord(base: int, per_arg, args, widths) -> str:
    terms, const = [], base
    for arg, ss, width in zip(args, per_arg, widths):
        if isinstance(arg, int):
            const += sum(s * ((arg >> b) & 1) for b, s in enumerate(ss))
        elif isinstance(arg, dict):
            for b, s in enumerate(ss):
                bit = arg.get(b, 0)
                if isinstance(bit, int):
                    const += s * bit
                elif s:
                    terms.append(_scaled(bit, s))
        else:
            terms += [_scaled(_field(arg, lo, hi, width), s) for lo, hi, s in _runs(ss)]
    if const:
        terms.append(str(const))
    return " + ".join(terms) or "0"


def _runs(strides: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs [lo, hi) of bits with nonzero strides doubling from bit to bit: (lo, hi, stride of lo)."""
    runs, b = [], 0
    while b < len(strides):
        if not strides[b]:
            b += 1
            continue
        lo = b
        while b + 1 < len(strides) and strides[b + 1] == 2 * strides[b]:
            b += 1
        runs.append((lo, b + 1, strides[lo]))
        b += 1
    return runs


def _field(var: str, lo: int, hi: int, width: int) -> str:
    """Bits [lo, hi) of ``var`` (a ``width``-bit value) as a C expression."""
    named = LANE_NAMES.get((var, lo, hi))
    if named:
        return named
    mask = (1 << (hi - lo)) - 1
    if lo == 0:
        return var if hi == width else f"({var} & {mask})"
    return f"({var} >> {lo})" if hi == width else f"(({var} >> {lo}) & {mask})"


def _scaled(term: str, stride: int) -> str:
    return term if stride == 1 else f"{term} * {stride}"


# ---- shared-memory tile layouts ----------------------------------------------------------------------------------

def _log2(x: int) -> int:
    return x.bit_length() - 1


@dataclass(frozen=True)
class Swizzle:
    """CuTe's ``Swizzle<bits, base, shift>`` on element offsets: ``o ^ ((o >> shift) & mask)`` where ``mask``
    selects ``bits`` bits from bit ``base`` up; so bits ``base+shift..`` are XORed into bits ``base..``."""

    bits: int
    base: int
    shift: int

    def __post_init__(self):
        _require(min(self.bits, self.base, self.shift) >= 0, f"{self}: fields must be >= 0")
        _require(self.shift >= self.bits, f"{self}: shift < bits would XOR a bit field into itself")

    @property
    def mask(self) -> int:
        return ((1 << self.bits) - 1) << self.base

    def __call__(self, offset: int) -> int:
        return offset ^ ((offset >> self.shift) & self.mask)


@dataclass(frozen=True)
class SmemLayout:
    """A rows x cols tile in shared memory: row-major with ``pad`` extra elements per row, or XOR-swizzled."""

    rows: int
    cols: int
    dtype_bytes: int
    pad: int = 0
    swizzle: Swizzle | None = None

    def __post_init__(self):
        _require(self.dtype_bytes in (1, 2, 4, 8), f"dtype_bytes must be 1, 2, 4 or 8, not {self.dtype_bytes}")
        _require(self.rows >= 1 and self.cols >= 1 and self.pad >= 0, f"bad tile shape {self}")
        _require(self.cols * self.dtype_bytes % CHUNK_BYTES == 0,
                 f"a row of {self.cols} x {self.dtype_bytes} bytes is not a whole number of 16-byte chunks")
        _require(self.pad * self.dtype_bytes % CHUNK_BYTES == 0, f"padding must keep rows 16-byte aligned: {self}")
        if self.swizzle:
            self._check_swizzle(self.swizzle)

    def _check_swizzle(self, s: Swizzle) -> None:
        _require(self.pad == 0, "a layout is swizzled or padded, not both")
        _require((1 << s.base) * self.dtype_bytes >= CHUNK_BYTES,
                 f"{s} splits 16-byte chunks (base must be >= {_log2(CHUNK_BYTES // self.dtype_bytes)})")
        _require(self.row_stride % (1 << (s.base + s.bits)) == 0, f"{s} moves chunks between rows of {self.cols}")
        # The swizzle reads and writes only bits below log2(period), so it commutes with adding a
        # multiple of the period: it permutes [0, size) exactly when it permutes [0, period) and
        # the tail [0, size % period). Checking those windows is exact and bounded, where one array
        # over the tile took 16 GB for the 2^31-element tiles that search sizing tries.
        period = 1 << (s.base + s.shift + s.bits)
        windows = {min(self.size, period)} | ({self.size % period} if self.size > period else set())
        for n in windows - {0}:
            offsets = np.arange(n, dtype=np.int64)
            mapped = offsets ^ ((offsets >> s.shift) & s.mask)
            _require(bool((mapped >= 0).all() and (mapped < n).all())
                     and np.bincount(mapped, minlength=n).max() == 1,
                     f"{s} on {self.rows}x{self.cols}: not a permutation of the {self.size} cells")

    @property
    def row_stride(self) -> int:
        return self.cols + self.pad

    @property
    def size(self) -> int:
        """Elements of shared memory the tile occupies."""
        return self.rows * self.row_stride

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype_bytes

    def offset(self, row: int, col: int) -> int:
        """The element offset of (row, col)."""
        linear = row * self.row_stride + col
        return self.swizzle(linear) if self.swizzle else linear


@lru_cache(maxsize=None)  # a layout checks its swizzle is a bijection when built: once per shape
def choose_smem_layout(rows: int, cols: int, dtype_bytes: int) -> SmemLayout:
    """A layout for a tile stored by 16-byte cp.async (row-major chunk order) and read by ldmatrix.

    Rows of a power-of-two number C of 16-byte chunks are XOR-swizzled, unpadded: the low bits of the 128-byte
    line index permute the chunks of each line, so 8 consecutive rows at one chunk column hit 8 distinct bank
    groups (0 ldmatrix conflicts) and every 8 consecutive chunks still fill one 128-byte line (0 cp.async
    conflicts). For C >= 8 that is Swizzle(3, base, log2 C) -- the row index's low 3 bits -- and for C < 8
    Swizzle(log2 C, base, 3). Other rows get one chunk of padding when C is even, so that the row stride is an
    odd number of chunks: 0 ldmatrix conflicts, though cp.async stores may then conflict (bank_conflicts says).
    """
    _require(dtype_bytes in (1, 2, 4, 8), f"dtype_bytes must be 1, 2, 4 or 8, not {dtype_bytes}")
    chunk = CHUNK_BYTES // dtype_bytes
    _require(cols % chunk == 0, f"{cols} columns of {dtype_bytes} bytes are not a whole number of 16-byte chunks")
    chunks = cols // chunk
    if chunks & (chunks - 1) == 0:
        c = _log2(chunks)
        swizzle = Swizzle(bits=min(c, 3), base=_log2(chunk), shift=max(c, 3)) if c else None
        return SmemLayout(rows, cols, dtype_bytes, swizzle=swizzle)
    return SmemLayout(rows, cols, dtype_bytes, pad=0 if chunks % 2 else chunk)


def render_index(layout: SmemLayout, row: str = "row", col: str = "col") -> str:
    """A C expression for ``layout.offset(row, col)`` in elements; fully parenthesised, so it is also Python."""
    if hasattr(layout, "render_index"):  # a layout that renders itself (hopper_layouts.SwizzledTile)
        return layout.render_index(row, col)
    linear = f"(({row}) * {layout.row_stride} + ({col}))"
    s = layout.swizzle
    return f"({linear} ^ (({linear} >> {s.shift}) & {s.mask}))" if s else linear


# ---- bank conflicts ----------------------------------------------------------------------------------------------

def ldmatrix_phases(layout: SmemLayout) -> list[list[Coord]]:
    """One phase per 8x8 matrix an ldmatrix reads: 8 consecutive rows at one 16-byte chunk column."""
    chunk = CHUNK_BYTES // layout.dtype_bytes
    return [[(r0 + i, c0) for i in range(8) if r0 + i < layout.rows]
            for r0 in range(0, layout.rows, 8) for c0 in range(0, layout.cols, chunk)]


def cp_async_phases(layout: SmemLayout) -> list[list[Coord]]:
    """Chunks in row-major order, thread t copying chunks t, t + threads, ...: a warp's 16-byte stores are served
    8 lanes (128 bytes) per phase, so each run of 8 consecutive chunks is one phase."""
    chunk = CHUNK_BYTES // layout.dtype_bytes
    chunks = [(r, c) for r in range(layout.rows) for c in range(0, layout.cols, chunk)]
    return [chunks[i:i + 8] for i in range(0, len(chunks), 8)]


def bank_conflicts(layout: SmemLayout, access: str | Iterable[Sequence[Coord]]) -> int:
    """Extra shared-memory wavefronts (0 = conflict-free) of 16-byte accesses to ``layout``.

    ``access``: ``"ldmatrix"``, ``"cp_async"``, or explicit phases, each a list of (row, col) chunk starts that
    the hardware serves together. A phase costs as many wavefronts as the most distinct 4-byte words any bank holds.
    """
    phases = {"ldmatrix": ldmatrix_phases, "cp_async": cp_async_phases}.get(access) if isinstance(access, str) \
        else None
    if isinstance(access, str) and phases is None:
        raise InvalidInput(f"unknown access pattern {access!r}", hint="'ldmatrix', 'cp_async' or a list of phases")
    return sum(_extra_wavefronts(layout, phase) for phase in (phases(layout) if phases else access))


def _extra_wavefronts(layout: SmemLayout, phase: Sequence[Coord]) -> int:
    words_per_bank: dict[int, set[int]] = defaultdict(set)
    for row, col in phase:
        start = layout.offset(row, col) * layout.dtype_bytes // BANK_BYTES
        for word in range(start, start + CHUNK_BYTES // BANK_BYTES):
            words_per_bank[word % BANKS].add(word)
    return max((len(words) for words in words_per_bank.values()), default=1) - 1
