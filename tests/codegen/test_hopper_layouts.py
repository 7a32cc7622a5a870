"""Hopper's layout tables (codegen/hopper_layouts.py) against an independent reading of the PTX ISA's and CuTe's
tables (tests/codegen/sm90_probes.py): the wgmma accumulator and A-register fragments, the swizzle modes, the
matrix descriptor's fields and canonical layouts, and codegen's swizzled tiles with the descriptors it builds for
them; plus the emulation's generated tables and the tensor-map rules."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mugraph.codegen import hopper_layouts as H
from mugraph.codegen.compile import RUNTIME_DIR
from mugraph.codegen.layouts import TileLayout
from mugraph.codegen.tma import TensorMapSpec
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput
from tests.codegen import sm90_probes as P

MODES = [H.SWIZZLE_NONE, H.SWIZZLE_32B, H.SWIZZLE_64B, H.SWIZZLE_128B]


# ---- fragments ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [8, 16, 24, 64, 128, 200, 256])
def test_wgmma_accumulator_table_is_cutes_clayout(n):
    d = H.wgmma_d(n)
    for thread in range(H.WARPGROUP):
        for reg in range(n // 2):
            assert d.coord(thread, reg) == P.wgmma_d_cute(n, thread, reg), (thread, reg)


def test_wgmma_a_register_table_is_cutes_alayout():
    for thread, reg, half in H.WGMMA_A.slots():
        assert H.WGMMA_A.coord(thread, reg, half) == P.wgmma_a_cute(thread, 2 * reg + half)


def test_wgmma_accumulators_are_the_mma_sync_frag_of_a_64_row_tile():
    for n in H.WGMMA_NS:
        H.check_frag_correspondence(n)
    assert H.frag_register(3, 2) == 14


def test_a_broken_fragment_table_is_rejected():
    with pytest.raises(InvalidInput, match="covered once"):
        H.WgFragment("bad", 64, 16, 4, 2, lambda t, r, h: (t % 64, 0))
    with pytest.raises(InvalidInput, match="no n = 12"):
        H.wgmma_d(12)


# ---- swizzles and descriptors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_swizzle_modes_are_cutes_swizzle_on_byte_addresses(mode):
    addresses = range(0, 4 * 1024)
    assert [mode(x) for x in addresses] == [P.cute_swizzle(mode.bits, 4, 3, x) for x in addresses]
    assert mode.period == 8 * mode.width


def test_descriptor_fields_sit_where_the_ptx_isa_puts_them():
    d = H.SmemDescriptor(start=0x1230, lbo=0x40, sbo=0x400, mode=H.SWIZZLE_128B)
    bits = d.encode()
    assert bits & 0x3FFF == 0x123 and (bits >> 16) & 0x3FFF == 0x4 and (bits >> 32) & 0x3FFF == 0x40
    assert bits >> 62 == 1 and (bits >> 49) & 7 == 0
    assert [m.desc_code for m in MODES] == [0, 3, 2, 1] and [m.tma_code for m in MODES] == [0, 1, 2, 3]
    for mode in MODES:
        d = H.SmemDescriptor(start=0x3FFF0, lbo=16, sbo=0x20000 - 16, mode=mode)
        assert H.SmemDescriptor.decode(d.encode()) == d
    with pytest.raises(InvalidInput, match="multiple of 16"):
        H.SmemDescriptor(start=8, lbo=16, sbo=16, mode=H.SWIZZLE_NONE)


def _lbo_sbo(major: str, mode: H.SwizzleMode, mn_extent: int) -> tuple[int, int]:
    """Non-overlapping strides for a 16-deep operand with ``mn_extent`` rows (K-major) or columns (MN-major)."""
    if major == "K":
        return (128, 256) if not mode.bits else (16, 8 * mode.width)
    if not mode.bits:
        return 128, 256
    return 16 * mode.width, 8 * mode.width


@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_descriptor_addresses_are_the_canonical_layouts(major, mode):
    for start, mn_extent in ((0, 64), (2048, 256)):
        lbo, sbo = _lbo_sbo(major, mode, mn_extent)
        desc = H.SmemDescriptor(start, lbo, sbo, mode)
        got = {(mn, k): H.descriptor_address(desc, major, mn, k) for mn in range(mn_extent) for k in range(16)}
        want = {key: P.gmma_address(major, mode.bits, start, lbo, sbo, *key) for key in got}
        assert got == want
        assert len(set(got.values())) == len(got)  # no two elements share a byte pair


TILES = [(64, 64, H.SWIZZLE_128B), (64, 128, H.SWIZZLE_128B), (128, 64, H.SWIZZLE_128B), (64, 32, H.SWIZZLE_64B),
         (128, 32, H.SWIZZLE_64B), (16, 16, H.SWIZZLE_32B), (64, 192, H.SWIZZLE_64B)]


@pytest.mark.parametrize("rows,cols,mode", TILES, ids=str)
def test_codegens_tiles_agree_with_the_descriptors_it_builds(rows, cols, mode):
    """Element (r, c) of a swizzled tile at byte ``base`` is where the A (K-major) descriptor of k-step c // 16 or
    the B (MN-major) descriptor of k-step r // 16 tells wgmma to read it, by the independent reading."""
    tile, base = H.SwizzledTile(rows, cols, 2, mode), 4096
    a, b = H.a_operand(tile), H.b_operand(tile)
    for r, c in itertools.product(range(rows), range(cols)):
        at = base + 2 * tile.offset(r, c)
        if rows % H.WGMMA_M == 0 and cols % 16 == 0:  # A: rows r of warpgroup r // 64, k-step c // 16
            row0 = r // 64 * 64
            start = base + 2 * H.a_start(tile, c // 16, row0)
            assert P.gmma_address("K", mode.bits, start, a.lbo, a.sbo, r - row0, c % 16) == at
        if rows % 16 == 0 and cols <= 256:  # B: k-step r // 16, every column
            start = base + 2 * H.b_start(tile, r // 16)
            assert P.gmma_address("MN", mode.bits, start, b.lbo, b.sbo, c, r % 16) == at
    assert (a.trans, b.trans) == (0, 1)


@pytest.mark.parametrize("rows,cols,mode", TILES, ids=str)
def test_swizzled_tile_index_renders_its_offsets(rows, cols, mode):
    tile = H.SwizzledTile(rows, cols, 2, mode)
    index = eval(f"lambda row, col: {tile.render_index()}")
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    np.testing.assert_array_equal(np.vectorize(index)(r, c), np.vectorize(tile.offset)(r, c))
    np.testing.assert_array_equal(np.sort(np.vectorize(tile.offset)(r, c).ravel()), np.arange(rows * cols))
    layout = TileLayout(2, rows, cols, 2, tile)  # a batch of two: the second matrix right after the first
    index2 = eval(f"lambda b, row, col: {layout.index('b', 'row', 'col')}")
    assert layout.matrix_elems == rows * cols
    assert index2(1, rows - 1, cols - 1) == rows * cols + tile.offset(rows - 1, cols - 1)


def test_swizzled_tiles_reject_what_tma_cannot_land():
    for bad in [dict(rows=64, cols=8, dtype_bytes=2, mode=H.SWIZZLE_32B), dict(rows=12, cols=64, dtype_bytes=2,
                                                                               mode=H.SWIZZLE_128B),
                dict(rows=64, cols=64, dtype_bytes=2, mode=H.SWIZZLE_NONE)]:
        with pytest.raises(InvalidInput):
            H.SwizzledTile(**bad)
    assert H.swizzle_for(64, 2) is H.SWIZZLE_128B and H.swizzle_for(32, 2) is H.SWIZZLE_64B
    assert H.swizzle_for(16, 2) is H.SWIZZLE_32B and H.swizzle_for(8, 2) is None


# ---- the emulation's generated tables ------------------------------------------------------------------------------

def test_the_emulations_tables_are_rendered_from_the_python_tables():
    header = (RUNTIME_DIR / "sm90_intrin.cuh").read_text()
    assert H.runtime_tables_block(header) == H.render_runtime_tables(), \
        "run `python -m mugraph.codegen.hopper_layouts` to rewrite sm90_intrin.cuh's generated block"


# ---- tensor maps -----------------------------------------------------------------------------------------------------

def test_tensor_maps_check_tmas_rules():
    ok = TensorMapSpec("x", DType.FLOAT16, (4096, 64, 2), (2, 8192, 524288), (64, 64, 1), H.SWIZZLE_128B)
    assert ok.box_bytes == 8192 and len(ok.encode_cpu(0x1000)) == 128
    bad = [dict(strides=(4, 8192, 524288)), dict(strides=(2, 8200, 524288)), dict(box=(64, 300, 1)),
           dict(box=(32, 64, 1)), dict(dims=(4096, 64, 0)), dict(box=(64, 64, 4))]
    base = dict(buffer="x", dtype=DType.FLOAT16, dims=(4096, 64, 2), strides=(2, 8192, 524288), box=(64, 64, 1),
                swizzle=H.SWIZZLE_128B)
    for change in bad:
        with pytest.raises(InvalidInput, match="tensor map"):
            TensorMapSpec(**{**base, **change})
