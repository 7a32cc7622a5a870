"""The launch plan, the shared-memory planner (lifetimes, reuse, limits per arch), the renderer's tables and the
register-layout records."""
from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest

from mugraph import ir, workloads
from mugraph.codegen import (Buffer, KernelLaunch, LaunchPlan, generate, generate_cuda, plan_shared_memory,
                             run_on_cpu)
from mugraph.codegen import render as R
from mugraph.codegen.arch import ARCHS, get_arch
from mugraph.codegen.fragments import MMA_M16N8K16
from mugraph.codegen.layouts import Frag, Spread, choose_frag, linear, reduce_group, unravel
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput, ResourceError
from mugraph.ir.ops import ACCUMULATORS, BLOCK_REDUCE, TOp


# ---- the plan --------------------------------------------------------------------------------------------------

def test_plan_of_a_two_kernel_graph():
    g = workloads.split_kv_two_launches(workloads.get("gqa").small_shapes, lambda q, k: q @ k, online=False)
    m = generate(g)
    assert isinstance(m.plan, LaunchPlan)
    assert [k.kind for k in m.plan.kernels] == ["custom", "custom"]
    k0, k1 = m.plan.kernels
    assert isinstance(k0, KernelLaunch) and k0.name == "mg_kernel0" and k0.block == (128, 1, 1)
    assert k0.grid == (2, 2, 2) and k0.smem_bytes > 0
    roles = {b.name: b.role for b in m.plan.buffers}
    assert all(isinstance(b, Buffer) for b in m.plan.buffers)
    assert roles["Q"] == roles["K"] == roles["V"] == "input"
    assert [roles[a] for a in k0.args] == ["input"] * 3 + ["intermediate"] * 2
    assert roles[k1.args[-1]] == "output" and m.plan.outputs == ("out0",)
    assert m.source.splitlines()[0] == '#include "tc_intrin.cuh"'
    assert len(re.findall(r"MG_GLOBAL void MG_LAUNCH_BOUNDS\(128, \d+\) mg_kernel", m.source)) == 2
    assert generate_cuda(g) == m.source


def test_library_ops_are_launches_with_their_node():
    X = ir.input("X", (8, 16), "float16")
    W = ir.input("W", (16, 8), "float16")
    y = (X @ W).exp()
    m = generate(ir.KernelGraph([y], [X, W]))
    assert [(k.kind, k.name, k.args) for k in m.plan.kernels] == [
        ("library", "", ("X", "W", "t2")), ("library", "", ("t2", "out0"))]
    assert m.plan.kernels[0].library_op is y.srcs[0] and m.plan.kernels[1].library_op is y


def test_outputs_may_repeat_and_name_inputs():
    X = ir.input("X", (8, 16), "float16")
    y = X * 2.0
    m = generate(ir.KernelGraph([y, X, y], [X]))
    assert m.plan.outputs == ("out0", "X", "out0")
    out = run_on_cpu(ir.KernelGraph([y, X, y], [X]), [np.ones((8, 16), np.float16)])
    assert [float(o[0, 0]) for o in out] == [2.0, 1.0, 2.0]


def test_custom_kernel_outputs_nobody_reads_still_get_buffers():
    X = ir.input("X", (16, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1))
    x = b.input(X)
    first, _ = b.finish([(x.acc_sum(), None), (x.acc_max_last(), None, "float32")])
    m = generate(ir.KernelGraph([first], [X]))
    assert len(m.plan.kernels[0].args) == 3 and len(m.plan.buffers) == 3


def test_bad_arguments_are_typed_errors():
    g = workloads.get("ntrans").small().reference()
    with pytest.raises(InvalidInput):
        generate(g, "sm_70")
    with pytest.raises(InvalidInput):
        generate(object())
    with pytest.raises(InvalidInput):
        generate(g, prefix="not an identifier")


# ---- shared memory ---------------------------------------------------------------------------------------------

def big_tile_graph(rows: int):
    """One block copies a [rows, 1024] f16 tile twice (double-buffered): 4 KiB per row; row sums in registers."""
    X = ir.input("X", (rows, 2048), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    x = b.input(X, fmap=1)
    return b.graph([(x.acc_sum_last(), None)])


def unsplit(arch: str):
    """The arch with loop splitting off: one CTA per block, so the footprints below are the tiles'."""
    return dataclasses.replace(get_arch(arch), split_loops=False)


@pytest.mark.parametrize("name", ["sm_80", "sm_90"])
def test_limits_per_arch(name):
    arch = unsplit(name)
    limit = arch.smem_limit
    assert limit == {"sm_80": 163 * 1024, "sm_90": 227 * 1024}[name]
    fits_80 = big_tile_graph(40)       # 160 KiB
    fits_90_only = big_tile_graph(48)  # 192 KiB
    too_big = big_tile_graph(64)       # 256 KiB
    assert plan_shared_memory(fits_80, arch).total_bytes == 40 * 4096
    if name == "sm_90":
        assert plan_shared_memory(fits_90_only, arch).total_bytes == 48 * 4096
    else:
        with pytest.raises(ResourceError, match="sm_80 allows 166912"):
            plan_shared_memory(fits_90_only, arch)
    with pytest.raises(ResourceError):
        plan_shared_memory(too_big, arch)
    X = ir.input("X", (64, 2048), "float16")
    with pytest.raises(ResourceError):  # generate refuses too, without aborting anything
        generate(ir.KernelGraph([ir.custom(too_big, [X])[0]], [X]), arch)
    assert plan_shared_memory(too_big, name).total_bytes == 64 * 2048  # split in two CTAs, one tile each


def test_planner_reuses_dead_space():
    """rmsnorm_linear's epilogue buffer lives after the loop: it reuses the input tiles' bytes."""
    bg = next(bg for bg, _ in workloads.get("rmsnorm_linear").reference().custom_ops())
    plan = plan_shared_memory(bg, "sm_80")
    tiles = [a for a in plan.allocations if a.role == "tile"]
    late = [a for a in plan.allocations if a.role == "fp32"]
    assert late and all(a.first > max(t.last for t in tiles) or a.last < min(t.first for t in tiles)
                        for a in late)
    assert plan.total_bytes == sum(t.nbytes for t in tiles)  # nothing beyond the double-buffered tiles
    for a, b in itertools.combinations(plan.allocations, 2):
        if a.first <= b.last and b.first <= a.last:
            assert a.end <= b.offset or b.end <= a.offset, (a, b)
    assert all(a.offset % 128 == 0 for a in plan.allocations)


@pytest.mark.parametrize("name", ["sm_80", "sm_90"])
def test_loop_tiles_are_pipelined_by_bytes_in_flight(name):
    """Stages: enough that the tiles in flight reach the arch's bytes per SM (more where blocks re-read a tile from
    L2), within the loop and shared memory."""
    arch = unsplit(name)
    bg = next(bg for bg, _ in workloads.get("gated_mlp").reference().custom_ops())  # 64 CTAs, 17 KiB per trip
    plan = plan_shared_memory(bg, arch)
    stages = plan.by_name("sm0").stages
    assert [a.stages for a in plan.allocations if a.role == "tile"] == [stages] * 3
    assert plan.total_bytes == stages * 2 * (8 * 64 + 64 * 64 + 64 * 64)
    # the GPU's bytes in flight shared by 64 CTAs, times the loop's L2 -> SM bytes over its HBM bytes: each of the
    # 64 blocks re-reads all of X (8 x 4096) beside its share of W1 and W2 (4096 x 4096 each)
    reread = 64 * 64 * 17 * 1024 / ((8 * 4096 + 2 * 4096 * 4096) * 2)
    need = arch.inflight_per_sm * arch.sm_count / 64 * reread
    assert (stages - 1) * 17 * 1024 >= need > (stages - 2) * 17 * 1024
    src = generate(workloads.get("gated_mlp").reference(), arch).source
    assert f"mg_cp_async_wait_group<{stages - 2}>();" in src


def test_pipeline_depth_stays_within_the_loop_and_shared_memory():
    assert plan_shared_memory(big_tile_graph(16), unsplit("sm_90")).by_name("sm0").stages == 2  # forloop 2
    X = ir.input("X", (40, 4096), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=8)
    bg = b.graph([(b.input(X, fmap=1).acc_sum_last(), None)])   # 40 KiB per trip
    arch = unsplit("sm_90")
    assert plan_shared_memory(bg, arch).by_name("sm0").stages == 5  # one CTA wants all the GPU's bytes: 200 KiB
    modest = dataclasses.replace(arch, inflight_per_sm=800)       # 800 B x 132 SMs: three stages of 40 KiB
    assert plan_shared_memory(bg, modest).by_name("sm0").stages == 4
    hungry = dataclasses.replace(arch, inflight_per_sm=10**7)   # wants every stage it can get
    assert plan_shared_memory(bg, hungry).by_name("sm0").stages == 5  # 200 KiB of 227
    assert plan_shared_memory(bg, dataclasses.replace(hungry, max_stages=4)).by_name("sm0").stages == 4
    a100 = dataclasses.replace(unsplit("sm_80"), inflight_per_sm=10**7)
    assert plan_shared_memory(bg, a100).by_name("sm0").stages == 4  # 160 KiB of 163


# ---- tables and records ---------------------------------------------------------------------------------------

def test_every_op_has_a_renderer_entry():
    assert set(R.ELEMENTWISE_C) == set(TOp)
    assert set(R.ACC_C) == set(ACCUMULATORS)
    assert set(R.REDUCE_C) == set(BLOCK_REDUCE)
    assert set(R.DTYPE_C) == set(DType)
    assert set(R.MMA_C) == {DType.FLOAT16, DType.BFLOAT16}
    assert set(ARCHS) >= {"sm_80", "sm_90"}


def test_literals_round_trip_float32():
    for v in (0.125, 1e-6, -3.0, 4096.0, 1 / 3, 6.1e-5, 1e20):
        text = R.literal(v)
        assert text.endswith("f") and np.float32(float(text[:-1])) == np.float32(v)


@pytest.mark.parametrize("batch,m,n,warps", [(1, 16, 64, 4), (1, 8, 64, 4), (1, 64, 64, 4), (1, 16, 16, 4),
                                             (2, 32, 32, 4), (1, 20, 12, 8), (3, 16, 8, 4), (1, 128, 128, 8)])
def test_frag_covers_every_element_once(batch, m, n, warps):
    f = choose_frag(batch, m, n, warps)
    seen = {}
    for w, lane in itertools.product(range(warps), range(32)):
        for bi, mi, ni, q in itertools.product(range(f.tb), range(f.tm), range(f.tn), range(4)):
            b, r, c = f.slot_coord(w, lane, bi, mi, ni, q)
            if b < batch and r < m and c < n and w < f.used:
                assert (b, r, c) not in seen
                seen[b, r, c] = (w, lane)
    assert len(seen) == batch * m * n
    # the generated code's row/col formula is the PTX C fragment's
    for lane, q in itertools.product(range(32), range(4)):
        assert f.slot_coord(0, lane, 0, 0, 0, q)[1:] == MMA_M16N8K16.c_coord(lane, q)


def test_frag_prefers_whole_rows_per_warp():
    f = choose_frag(1, 64, 64, 4)
    assert (f.wm, f.wn, f.tm, f.tn) == (4, 1, 1, 8)


def test_spread_and_reduce_groups():
    assert reduce_group(16, 64, 128) == 8
    assert reduce_group(1, 4096, 128) == 128
    assert reduce_group(64, 64, 128) == 2
    assert reduce_group(1000, 64, 128) == 1
    assert reduce_group(1, 5, 128) == 4
    s = Spread(100, 128, 8)
    assert (s.groups, s.slots, s.guard) == (16, 7, True)
    with pytest.raises(InvalidInput):
        Spread(10, 128, 3)
    with pytest.raises(InvalidInput):
        Frag(1, 16, 16, 4, 2, 2, 2)


@pytest.mark.parametrize("shape", [(4, 1, 6), (3,), (2, 3, 4, 5), (1, 1, 7)])
def test_index_expressions(shape):
    n = int(np.prod(shape))
    for index in range(n):
        coords = [eval(c.replace(" / ", " // "), {}, {"o_": index}) for c in unravel("o_", shape)]  # C division
        assert tuple(coords) == tuple(int(x) for x in np.unravel_index(index, shape))
        assert eval(linear([str(c) for c in coords], shape)) == index
