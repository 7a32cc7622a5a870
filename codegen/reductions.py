"""Reductions over one dim: per row of a Frag with quad shuffles (and a shared combine across warps), else groups
of lanes with warp shuffles (Spread); rms_norm as its row factors in shared memory, read inline."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mugraph.codegen import loops, offsets, values
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import MMA, WARP, Frag, Rows, Spread, c_index, linear, prod, reduce_group, row_shuffles, unravel
from mugraph.codegen.placement import Ctx, Inline, Reg, Smem, describe

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering


def lower_reduce(lw: Lowering, node) -> None:
    reduction(lw, node, node.srcs[0], node.arg, R.REDUCE_C[node.op], square=False)


def reduction(lw: Lowering, node, x, dim: int, comb, *, square: bool) -> Reg:
    """``node`` = comb-reduction of ``x`` (squared first if ``square``) over ``dim``, into registers."""
    p = lw.place[x]
    if isinstance(p, Reg) and x.shape[dim] == 1 and not square:
        reg = p  # over one element: the value itself, where it is (no trip through shared memory)
    elif isinstance(p, Reg) and isinstance(p.layout, Frag) and dim == x.rank - 1:
        reg = _row_reduce(lw, x, p.layout, comb, square)
    else:
        values.addressable(lw, x)
        reg = _spread_reduce(lw, x, dim, comb, square)
    lw.place[node] = reg
    return reg


def _row_reduce(lw: Lowering, x, f: Frag, comb, square: bool) -> Reg:
    var = lw.fresh("v")
    shape = tuple(x.shape)
    probe = loops.probe_ctx(f, shape)
    values.ensure(lw, x, probe)
    reads = values.reads_of(lw, x, probe)
    fv = lw.frag_var(f)

    def value(ctx):
        v = values.read(lw, x, ctx)
        return f"mg_square({v})" if square else v
    ctx = Ctx(f, shape, tuple(loops.frag_coords(shape)), "[bi][mi][ni][q]", "[bi][mi][q >> 1]")
    cond = f"c_ < {f.n}" if f.col_guard else ""
    add = [f"p_ = {comb('p_', value(ctx))};"]
    lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
             f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", "for (int h = 0; h < 2; ++h) {",
             f"  float p_ = {comb.identity};", "  #pragma unroll", f"  for (int ni = 0; ni < {f.tn}; ++ni)",
             "  #pragma unroll", "  for (int q = 2 * h; q < 2 * h + 2; ++q) {"]
    guard_read = reads and loops.frag_valid(f)
    inner = loops.guarded(loops.frag_valid(f) if guard_read else cond, add, "    ")
    lines += loops.consts([("b_", f"{fv}b + bi"), ("r_", f"{fv}m + mi * {MMA.m} + {c_index(loops.ROW_HALF)[0]}"),
                           ("c_", f"{fv}n + ni * {MMA.n} + {c_index('q')[1]}")], inner, "    ") + inner
    lines += ["  }"] + [f"  p_ = {comb('p_', f'mg_shfl_xor(p_, {mask})')};" for mask in row_shuffles()]
    lines += [f"  {var}[bi][mi][h] = p_;", "}"]
    decls = [f"float {var}[{f.tb}][{f.tm}][2];"]
    lw.emit(Step("", lines, decls=decls, reads=reads, note=f"row {'max' if comb is R.MAX else 'sum'} of "
                                                              f"{describe(x)} (quad shuffles)"))
    if f.wn > 1:
        _rows_across_warps(lw, f, var, comb)
    return Reg(Rows(f), var)


def _rows_across_warps(lw: Lowering, f: Frag, var: str, comb) -> None:
    rows = f.batch * f.m
    buf = lw.buffer("scratch", 4 * f.wn * rows, f"row partials of {f.wn} warps")
    lw.frag_var(f)  # declares the fragment's warp coordinates the loops below use
    valid = " && ".join(["t4_ == 0"] + ([x for x in [loops.rows_valid(f)] if x]))
    write = loops.rows_loop(lw, f, lambda ctx: loops.guarded(
        valid, [f"{buf}[warp % {f.wn} * {rows} + b_ * {f.m} + r_] = {var}[bi][mi][h];"], ""),
        guard=False, coords_shape=(f.batch, f.m, 1))
    lw.emit(Step("", write, writes={buf}, note="row partials to shared"))
    read = [f"float p_ = {comb.identity};", "#pragma unroll",
            f"for (int w = 0; w < {f.wn}; ++w) p_ = {comb('p_', f'{buf}[w * {rows} + b_ * {f.m} + r_]')};",
            f"{var}[bi][mi][h] = p_;"]
    lw.emit(Step("", loops.rows_loop(lw, f, lambda ctx: read, guard=True, coords_shape=(f.batch, f.m, 1)),
                 reads={buf}, note="combine the warps' row partials"))


def _spread_reduce(lw: Lowering, x, dim: int, comb, square: bool) -> Reg:
    shape = tuple(x.shape)
    out_shape = shape[:dim] + (1,) + shape[dim + 1:]
    n, length = prod(out_shape), shape[dim]
    group = reduce_group(n, length, lw.T)
    lay = Spread(n, lw.T, group)
    gid, gl = lw.group_var(group)
    var = lw.fresh("v")
    reads = values.reads_plain(lw, x, shape)
    coords = unravel("o_", out_shape)
    coords[dim] = "j_"
    v = values.read_at(lw, x, coords, None, Ctx(None, shape, tuple(coords)))
    v = f"mg_square({v})" if square else v
    inner = _hoisted_sum(lw, v, comb, lay, gid, length) if group == 1 else None
    inner = inner or [f"for (int j_ = {gl}; j_ < {length}; j_ += {group}) p_ = {comb('p_', v)};"]
    inner = loops.guarded(f"o_ < {n}" if lay.guard else "", inner, "  ")
    lines = ["#pragma unroll", f"for (int s = 0; s < {lay.slots}; ++s) {{"]
    lines += loops.consts([("o_", f"s * {lay.groups} + {gid}")], inner, "  ") + [f"  float p_ = {comb.identity};"]
    lines += inner
    off = min(group, WARP) // 2
    while off >= 1:
        lines.append(f"  p_ = {comb('p_', f'mg_shfl_xor(p_, {off})')};")
        off //= 2
    decls = [f"float {var}[{lay.slots}];"]
    if group <= WARP:
        lines += [f"  {var}[s] = p_;", "}"]
        lw.emit(Step("", lines, decls=decls, reads=reads, note=f"reduce {describe(x)} over dim {dim} "
                                                                  f"({group} lanes per element)"))
        return Reg(lay, var)
    per = group // WARP
    buf = lw.buffer("scratch", 4 * lay.slots * lw.W, f"warp partials ({lay.slots} x {lw.W})")
    lines += [f"  if (lane == 0) {buf}[s * {lw.W} + warp] = p_;", "}"]
    lw.emit(Step("", lines, decls=decls, reads=reads, writes={buf},
                 note=f"reduce {describe(x)} over dim {dim} ({group} lanes per element)"))
    comb_lines = ["#pragma unroll", f"for (int s = 0; s < {lay.slots}; ++s) {{", f"  float p_ = {comb.identity};",
                  "  #pragma unroll",
                  f"  for (int w = 0; w < {per}; ++w) p_ = "
                  f"{comb('p_', f'{buf}[s * {lw.W} + {gid} * {per} + w]')};",
                  f"  {var}[s] = p_;", "}"]
    lw.emit(Step("", comb_lines, reads={buf}, note="combine the warps' partials"))
    return Reg(lay, var)


def _hoisted_sum(lw: Lowering, v: str, comb, lay: Spread, gid: str, length: int) -> list[str] | None:
    """One thread's sum over j_ as 8 unrolled steps per outer trip (j_ = 8 jo + ji, the same order), its reads'
    addresses a hoisted base xor and plus constants (``offsets``: a swizzle's xor depends on ji alone); None where
    they are not of that form."""
    if length % 8 or length <= 8:
        return None
    counters = {"s": lay.slots, "jo": length // 8, "ji": 8}
    local = {"o_": f"s * {lay.groups} + {gid}", "j_": "jo * 8 + ji"}
    hoisted, every = offsets.hoist_indices(v, lw.thread_bases, lw.kernel_decls, counters, local)
    if not every or re.search(r"\b(?:o_|j_)\b", hoisted):
        return None
    return ["#pragma unroll", f"for (int jo = 0; jo < {length // 8}; ++jo)", "  #pragma unroll",
            f"  for (int ji = 0; ji < 8; ++ji) p_ = {comb('p_', hoisted)};"]


def lower_rms_norm(lw: Lowering, node) -> None:
    """x * rsqrt(mean(x^2) + eps): the reciprocal root per row goes to shared memory; the product is read
    inline wherever the value is needed."""
    x = node.srcs[0]
    dim, eps = node.arg
    reg = reduction(lw, node, x, dim, R.SUM, square=True)
    n = x.shape[dim]
    shape = tuple(node.shape[:dim]) + (1,) + tuple(node.shape[dim + 1:])
    buf = lw.buffer("fp32", 4 * prod(shape), f"rsqrt(mean(x^2)) of {describe(node)}")
    expr = f"mg_rsqrt({{v}} / {R.literal(n)} + {R.literal(eps)})"
    lines = loops.store_lines(lw, reg, shape, lambda ctx, v: f"{buf}[{linear(ctx.coords, shape)}] = "
                                                             f"{expr.format(v=v)};")
    lw.emit(Step("", lines, writes={buf}, note="the norm's row factors"), lw.home(node))
    lw.mats[(node, "rms")] = Smem(buf, shape)
    values.addressable(lw, x)
    lw.place[node] = Inline()
