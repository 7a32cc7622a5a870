"""Instructions per loop trip counted from the lowering (codegen/issue.py), and what one SM's trip costs."""
from __future__ import annotations

import pytest

from mugraph.codegen.issue import IssueUnits, TripOps, count, loop_code, trip_clocks, trip_seconds
from mugraph.search.targets import get_target

LOOP = """
const int e_ = tid + 3 * 128;
#pragma unroll
for (int i = 0; i < 4; ++i) {
  mg_mma_m16n8k16_f16(acc[i], a, b[i]);
  v[i] = mg_exp(acc[i][0]) * 2.0f;
}
for (int j = lane; j < 64; j += 32) s = s + sm0[j * 2 + 1];
mg_ldmatrix_x4(t, &sm1[lane * 8]);
if (tid == 0) sm2[0] = v[0];
mg_syncthreads();
"""


def test_a_loop_is_counted_by_class_as_by_hand():
    # e_: tid + 3 * 128, runtime: one add (the constant folds into it). The i loop unrolls (4 trips): 4 mma,
    # 4 x (ex2 + its multiply, the * 2.0f): 4 MUFU, 8 FP32; acc[i], b[i], v[i] are registers. The j loop starts
    # at a lane: 2 trips, each j * 2 + 1 (one integer op: the + 1 is the load's immediate offset), one add, one
    # shared load. ldmatrix.x4: 4 wavefronts, one instruction, lane * 8: one integer op (taking the address is
    # none). The if: its test (no arithmetic), one shared store (a constant index). One barrier.
    ops = count(LOOP)
    assert ops == TripOps(mma=4, mufu=4, fp32=10, int=4, shared=7, copies=0, barriers=1, shared_ops=4)
    assert ops.issue == 4 + 4 + 10 + 4 + 4 + 0 + 1


def test_constant_terms_of_an_address_are_its_immediate_offset():
    # a hoisted copy: the shared and global offsets are a base plus constants (codegen/offsets.py)
    hoisted = count("for (int i_ = 0; i_ < 4; ++i_) {\n  mg_cp_async16(&sm1d[i_ * 1024], p1 + (sm1o + i_ * 2048));\n}")
    assert hoisted.int == 4 * 1     # p1 + sm1o: one add per copy
    # the same copy indexing by the element: every operator of both indices, per copy
    plain = count("for (int i_ = 0; i_ < 4; ++i_) {\n  const int e_ = tid + i_ * 128;\n"
                  "  mg_cp_async16(&sm1[(e_ / 8) * 64 + e_ % 8 * 8], p1 + (sm1g + (e_ / 8) * 64 + e_ % 8 * 8));\n}")
    assert plain.int == 4 * (1 + 5 + 7)
    # an ldmatrix address from a hoisted base: one xor with a constant; the row step is the immediate offset
    assert count("mg_ldmatrix_x4(t, &sm1c[(h1_ ^ 16) + 2048]);").int == 1
    # a stored value is floating-point work (though it reads shared memory), its address integer work; two fp16
    # roundings packed are one F2FP.F16.F32.PACK_AB
    stored = count("mg_st16(&sm7[h3_ + 512], mg_u32x4{mg_pack2(mg_f2h(sm1c[h3_] * y), mg_f2h(z * w)), 0, 0, 0});")
    assert (stored.int, stored.fp32) == (0, 2 + 1)


def test_a_trips_clocks_by_hand():
    u = IssueUnits.of(get_target("h200"))
    assert u == IssueUnits(subpartitions=4, fp32_per_clk=128, int32_per_clk=64, mufu_per_clk=16,
                           smem_bytes_per_clk=128, barrier_clk=24, warps_to_fill_issue=2)
    ops = TripOps(mma=4, mufu=4, fp32=10, int=8, shared=6, barriers=1, shared_ops=3)   # 30 issue slots
    # one CTA of 4 warps: one warp per processing block, which then issues every other clock (2 warps to fill)
    one = trip_clocks(ops, warps=4, ctas=1, u=u)
    assert one == {"issue": 60, "mufu": 4 * 128 / 16, "fp32": 10, "int": 8 * 128 / 64, "shared": 4 * 6,
                   "barriers": 24}
    assert trip_seconds(one, 1.98e9) == pytest.approx((60 + 24) / 1.98e9)
    # two such CTAs: 2 warps per block issue every clock; MUFU (4 lanes per block) now limits; the barrier's
    # clocks are hidden by the other CTA half the time
    two = trip_clocks(ops, warps=8, ctas=2, u=u)
    assert two == {"issue": 60, "mufu": 64, "fp32": 20, "int": 32, "shared": 48, "barriers": 12}
    assert trip_seconds(two, 1.98e9) == pytest.approx((64 + 12) / 1.98e9)


def test_the_main_loop_is_found_in_rendered_lines():
    lines = ["x = 1;", "#pragma unroll 1", "for (int it = 0; it < 4; ++it) {", "  a = b;", "  {", "    c = d;",
             "  }", "}", "after();"]
    assert loop_code(lines).split() == ["a", "=", "b;", "{", "c", "=", "d;", "}"]
    assert loop_code(["{  // the loop's single iteration", "  q = r;", "}"]).strip() == "q = r;"
