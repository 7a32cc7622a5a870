"""Fragment and shared-memory layouts: their self-checks, bank conflicts, rendered index expressions, and agreement
between codegen/fragments.py and the C++ emulation in tc_intrin.cuh (run on the CPU harness)."""
from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mugraph.codegen import fragments as fr
from mugraph.codegen.cpu import build_cpu
from mugraph.ir.errors import InvalidInput

KERNELS = Path(__file__).parent / "kernels"
MMA = fr.MMA_M16N8K16


# ---- self-checks ---------------------------------------------------------------------------------------------------

def test_mma_m16n8k16_fragments_match_the_ptx_tables():
    assert (MMA.m, MMA.n, MMA.k) == (16, 8, 16)
    assert MMA.a_coord(0, 0, 0) == (0, 0) and MMA.a_coord(5, 3, 1) == (9, 11)  # g=1, t=1: a3 -> (g+8, 2t+8+1)
    assert MMA.b_coord(6, 1, 0) == (12, 1)  # g=1, t=2: b1 -> (k = 2t+8, n = g)
    assert MMA.c_coord(31, 2) == (15, 6) and MMA.c_coord(31, 3) == (15, 7)
    assert MMA.intrinsic("bf16") == "mg_mma_m16n8k16_bf16"


def test_a_fragment_with_a_collision_is_rejected():
    with pytest.raises(InvalidInput, match="covered once"):
        fr.Fragment("bad", rows=16, cols=16, regs=4, elems_per_reg=2, coord=lambda lane, reg, half: (lane % 16, 0))


def test_a_fragment_with_wrong_register_count_is_rejected():
    with pytest.raises(InvalidInput, match="regs"):
        fr.Fragment("bad", rows=16, cols=16, regs=2, elems_per_reg=2, coord=MMA.a.coord)


def test_ldmatrix_variants_cover_each_element_once():
    assert [ld.intrinsic for ld in fr.LDMATRIX.values()] == [
        "mg_ldmatrix_x1", "mg_ldmatrix_x1_trans", "mg_ldmatrix_x2", "mg_ldmatrix_x2_trans", "mg_ldmatrix_x4",
        "mg_ldmatrix_x4_trans"]
    with pytest.raises(InvalidInput):
        fr.Ldmatrix(3, False)


def test_operand_loads_reject_a_wrong_address_map():
    assert fr.A_X4.ld.num == 4 and fr.B_X4_TRANS.tiles == 2 and fr.B_X4.transposed
    with pytest.raises(InvalidInput, match="the fragment needs"):
        fr.OperandLoad("A rows 0-7 twice", fr.LDMATRIX[4, False], MMA.a, address=lambda lane: (lane % 8, 0))


# ---- shared-memory layouts -----------------------------------------------------------------------------------------

TILES = [(64, 32, 2), (32, 64, 2), (64, 64, 2), (128, 128, 2), (16, 16, 2), (8, 8, 2), (64, 16, 2), (32, 256, 2),
         (32, 32, 4), (64, 64, 4)]


@pytest.mark.parametrize("rows,cols,dtype_bytes", TILES)
def test_chosen_layouts_are_conflict_free(rows, cols, dtype_bytes):
    layout = fr.choose_smem_layout(rows, cols, dtype_bytes)
    assert layout.pad == 0 and layout.size == rows * cols
    assert fr.bank_conflicts(layout, "ldmatrix") == 0
    assert fr.bank_conflicts(layout, "cp_async") == 0


@pytest.mark.parametrize("rows,cols,dtype_bytes", [(64, 32, 2), (32, 64, 2), (64, 64, 2), (128, 128, 2)])
def test_naive_row_major_layouts_conflict_on_ldmatrix(rows, cols, dtype_bytes):
    naive = fr.SmemLayout(rows, cols, dtype_bytes)
    assert fr.bank_conflicts(naive, "cp_async") == 0
    assert fr.bank_conflicts(naive, "ldmatrix") > 0


def test_bank_conflicts_counts_wavefronts():
    naive = fr.SmemLayout(64, 64, 2)  # 128-byte rows: 8 rows at one column share 4 banks
    assert fr.bank_conflicts(naive, [[(r, 0) for r in range(8)]]) == 7
    assert fr.bank_conflicts(naive, [[(0, c) for c in range(0, 64, 8)]]) == 0  # one contiguous 128-byte line
    assert fr.bank_conflicts(naive, "ldmatrix") == 7 * len(fr.ldmatrix_phases(naive))
    padded = fr.SmemLayout(64, 32, 2, pad=8)  # padding fixes ldmatrix but breaks narrow cp.async stores
    assert fr.bank_conflicts(padded, "ldmatrix") == 0 and fr.bank_conflicts(padded, "cp_async") > 0


def test_non_power_of_two_rows_are_padded_to_an_odd_chunk_stride():
    layout = fr.choose_smem_layout(64, 48, 2)  # 6 chunks per row -> stride of 7 chunks
    assert layout.swizzle is None and layout.row_stride == 56
    assert fr.bank_conflicts(layout, "ldmatrix") == 0


@pytest.mark.parametrize("bad", [dict(rows=8, cols=12, dtype_bytes=2), dict(rows=8, cols=64, dtype_bytes=2, pad=4),
                                 dict(rows=8, cols=64, dtype_bytes=2, swizzle=fr.Swizzle(3, 2, 3)),
                                 dict(rows=8, cols=16, dtype_bytes=2, swizzle=fr.Swizzle(3, 3, 3))])
def test_invalid_layouts_are_rejected(bad):
    with pytest.raises(InvalidInput):
        fr.SmemLayout(**bad)


@pytest.mark.parametrize("rows,cols,dtype_bytes", TILES + [(64, 48, 2), (16, 24, 2)])
def test_render_index_computes_the_layouts_offsets(rows, cols, dtype_bytes):
    layout = fr.choose_smem_layout(rows, cols, dtype_bytes)
    index = eval(f"lambda row, col: {fr.render_index(layout)}")  # C and Python share these operators' precedence
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    rendered = np.vectorize(index)(r, c)
    expected = np.vectorize(layout.offset)(r, c)
    np.testing.assert_array_equal(rendered, expected)
    if layout.swizzle:  # a swizzle permutes the tile's elements
        np.testing.assert_array_equal(np.sort(rendered.ravel()), np.arange(layout.size))


def test_the_gemm_kernel_uses_the_rendered_layouts():
    source = (KERNELS / "gemm_tc.cu").read_text()
    macros = dict(re.findall(r"#define (SMEM_[AB]_INDEX)\(row, col\) (.*)", source))
    assert macros["SMEM_A_INDEX"] == fr.render_index(fr.choose_smem_layout(64, 32, 2))
    assert macros["SMEM_B_INDEX"] == fr.render_index(fr.choose_smem_layout(32, 64, 2))


# ---- agreement with the C++ emulation ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def probes():
    return build_cpu((KERNELS / "probes.cu").read_text(), ["ldmatrix_probe", "mma_probe"])


@pytest.mark.parametrize("num,trans", sorted(fr.LDMATRIX))
def test_ldmatrix_emulation_matches_fragments(probes, num, trans):
    matrix = np.arange(32 * 8, dtype=np.uint16)  # element (row, col) holds 8 * row + col
    out = np.zeros((32, 4), np.uint32)
    probes.run("ldmatrix_probe", [matrix, out, num, int(trans)], grid=1, block=32, smem_bytes=512)
    got = np.stack([out[:, :num] & 0xFFFF, out[:, :num] >> 16], axis=-1)  # (lane, reg, half)
    ld = fr.LDMATRIX[num, trans]
    want = np.zeros_like(got)
    for lane, reg, half in np.ndindex(*got.shape):
        matrix_j, row, col = ld.coord(lane, reg, half)
        want[lane, reg, half] = 8 * (8 * matrix_j + row) + col
    np.testing.assert_array_equal(got, want)


def _slot_indices(fragment: fr.Fragment) -> tuple[np.ndarray, np.ndarray]:
    """Row and column index arrays of shape (lanes, regs, elems_per_reg)."""
    coords = np.array([fragment.coord(*s) for s in fragment.slots()])
    shape = (fr.LANES, fragment.regs, fragment.elems_per_reg)
    return coords[:, 0].reshape(shape), coords[:, 1].reshape(shape)


def _pack(fragment: fr.Fragment, bits: np.ndarray) -> np.ndarray:
    rows, cols = _slot_indices(fragment)
    halves = bits[rows, cols].astype(np.uint32)
    return halves[..., 0] | (halves[..., 1] << 16)


def _run_mma(probes, a, b, c, dtype) -> np.ndarray:
    """D = A @ B + C through the emulated mma.sync, with fragments packed and unpacked by fragments.py."""
    bits = lambda x: np.ascontiguousarray(x.astype(dtype)).view(np.uint16)
    a_regs, b_regs = _pack(MMA.a, bits(a)), _pack(MMA.b, bits(b))
    rows, cols = _slot_indices(MMA.c)
    c_regs = np.ascontiguousarray(c.astype(np.float32)[rows[..., 0], cols[..., 0]])
    d_regs = np.zeros((32, 4), np.float32)
    probes.run("mma_probe", [a_regs, b_regs, c_regs, d_regs, int(dtype != np.float16)], grid=1, block=32)
    d = np.zeros((16, 8), np.float32)
    d[rows[..., 0], cols[..., 0]] = d_regs
    return d


def _k_order_fma(a, b, c) -> np.ndarray:
    """fp32 accumulation with one fma per product in k order; exact in float64 for the operands drawn below."""
    acc = c.astype(np.float32)
    for k in range(a.shape[1]):
        acc = (acc.astype(np.float64) + np.outer(a[:, k], b[k, :]).astype(np.float64)).astype(np.float32)
    return acc


def _operands(seed: int, dtype):
    """Magnitudes in [0.25, 1): every partial sum is a multiple of 2^-24 below 32, so float64 holds it exactly."""
    rng = np.random.default_rng(seed)
    draw = lambda shape: (rng.choice([-1, 1], shape) * rng.uniform(0.25, 1, shape)).astype(dtype).astype(np.float64)
    return draw((16, 16)), draw((16, 8)), draw((16, 8)).astype(np.float16).astype(np.float64)


@settings(max_examples=20)  # each example is a kernel launch; the "ci" profile derandomises
@given(seed=st.integers(0, 2**32 - 1), bf16=st.booleans())
def test_mma_emulation_matches_fragments_and_k_order_fma(probes, seed, bf16):
    dtype = ml_dtypes.bfloat16 if bf16 else np.float16
    a, b, c = _operands(seed, dtype)
    np.testing.assert_array_equal(_run_mma(probes, a, b, c, dtype), _k_order_fma(a, b, c))


def test_mma_emulation_on_one_hot_operands_finds_every_position(probes):
    rng = np.random.default_rng(7)
    a = rng.integers(-4, 5, (16, 16)).astype(np.float64)
    b = rng.integers(-4, 5, (16, 8)).astype(np.float64)
    c = rng.integers(-4, 5, (16, 8)).astype(np.float64)
    np.testing.assert_array_equal(_run_mma(probes, a, b, c, np.float16), a @ b + c)


# ---- C index expressions rendered from the tables ------------------------------------------------------------------

def _eval_c(expr: str, **env) -> int:
    """A rendered index expression (+, *, >>, & on non-negative ints: the same in C and Python)."""
    return eval(expr, {}, env)


def _lane_env(lane: int) -> dict:
    return {"lane": lane, "g_": lane >> 2, "t4_": lane & 3}


def test_rendered_c_fragment_indices_are_the_table():
    widths = (fr.LANE_BITS, 2, 0)
    row, col = fr.coord_c(MMA.c.coord, ("lane", "q", 0), widths)
    assert "g_" in row and "t4_" in col  # PTX's groupID / threadID_in_group variables
    for lane in range(32):
        for q in range(4):
            assert (_eval_c(row, q=q, **_lane_env(lane)), _eval_c(col, q=q, **_lane_env(lane))) == MMA.c_coord(lane, q)
    row_h, col_h = fr.coord_c(MMA.c.coord, ("lane", {1: "h"}, 0), widths)
    for lane in range(32):
        for h in range(2):
            assert (_eval_c(row_h, h=h, **_lane_env(lane)), _eval_c(col_h, h=h, **_lane_env(lane))) == \
                MMA.c_coord(lane, 2 * h)


@pytest.mark.parametrize("load", [fr.A_X4, fr.B_X4_TRANS, fr.B_X2_TRANS, fr.B_X2, fr.B_X4], ids=lambda x: x.name)
def test_rendered_ldmatrix_addresses_are_the_table(load):
    row, col = fr.coord_c(load.address, ("lane",), (fr.LANE_BITS,))
    for lane in range(32):
        assert (_eval_c(row, **_lane_env(lane)), _eval_c(col, **_lane_env(lane))) == load.address(lane)


def test_maps_that_are_not_bit_linear_are_rejected():
    with pytest.raises(InvalidInput, match="not bit-linear"):
        fr.bit_strides(lambda lane: (lane ^ (lane >> 2), 0), (5,))
    with pytest.raises(InvalidInput, match="not bit-linear"):
        fr.bit_strides(lambda lane: (lane * lane, 0), (5,))


def test_a_fragments_from_c_registers_cover_the_same_elements():
    path = fr.MMA_SYNC_16816
    pairs = path.a_from_c()
    assert pairs == (((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1)), ((1, 2), (1, 3)))
    for reg, halves in enumerate(pairs):
        for half, (tile, q) in enumerate(halves):
            for lane in range(32):
                r, c = MMA.c_coord(lane, q)
                assert MMA.a_coord(lane, reg, half) == (r, c + tile * MMA.n)


def test_an_mma_path_checks_its_loads_fit_the_shape():
    with pytest.raises(InvalidInput, match="loads"):
        fr.MmaPath(MMA, a_load=fr.B_X4_TRANS, b_wide=fr.B_X4_TRANS, b_one=fr.B_X2_TRANS)
