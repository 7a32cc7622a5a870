"""Block matmuls: tensor-core products (mma.sync fragments in registers, operands by ldmatrix from input tiles or
16-bit staging buffers, or straight from a previous product's registers), and exact fp32 SIMT products."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import accumulators, loops, offsets, values, wgmma
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import (MMA, PATH, Frag, Spread, TileLayout, broadcast, ceil_div, choose_frag, linear,
                                     load_address, mma_tile, prod, round_up, unravel)
from mugraph.codegen.placement import Ctx, Reg, Tile, describe
from mugraph.ir.block import Phase
from mugraph.ir.dtypes import DType
from mugraph.ir.ops import BOp, RESCALE_ACCUMULATORS
from mugraph.ir.shapes import mma_dtype

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering


def lower_matmul(lw: Lowering, node) -> None:
    if wgmma.lower_matmul(lw, node):  # sm_90a's path, where the product fits wgmma
        return
    a, b = node.srcs
    dt = mma_dtype(a.dtype, b.dtype)
    if not dt.is_16bit and lw.arch.fp32_matmul == "simt":
        simt_matmul(lw, node)
        return
    # fp32 x fp32: three bf16 products of the operands' high and low halves (lo*hi + hi*lo + hi*hi), fp32
    # accumulation: about 2^-16 relative error and fp32's range, on tensor cores. The cross products read hi with
    # its inf/NaN halves zeroed ("hf"): an inf operand's residual is 0, and inf * 0 must not turn the hi*hi
    # product's inf into NaN.
    parts = [("", "")] if dt.is_16bit else [("lo", "hf"), ("hf", "lo"), ("hi", "hi")]  # FP32_MMA_PRODUCTS
    dt = dt if dt.is_16bit else DType.BFLOAT16
    shape = tuple(node.shape)
    f = choose_frag(prod(shape[:-2]), shape[-2], shape[-1], lw.W)
    acc_node = in_place_target(lw, node)
    if acc_node is not None:
        var = accumulators.state_var(lw, acc_node, f)
        lw.in_place.add(acc_node)
        decls = []
    else:
        var = lw.fresh("v")
        decls = [f"float {var}{loops.dims(f)} = {{}};"]
    lines, reads = [], set()
    hoisted = hoist_a(lw, node, f, dt) if parts == [("", "")] else None
    if acc_node is not None and acc_node.op in RESCALE_ACCUMULATORS:
        lines += accumulators.rescale_lines(lw, acc_node, Reg(f, var), shape)
        reads |= accumulators.factor_reads(lw, acc_node, f, shape)
    for part_a, part_b in parts:
        a_src = hoisted or operand(lw, a, "A", dt, f, node, _SPLIT_BUFFER.get(part_a, part_a))
        b_src = operand(lw, b, "B", dt, f, node, _SPLIT_BUFFER.get(part_b, part_b))
        reads |= {s[1] for s in (a_src, b_src) if s[0] == "smem"}
        lines += mma_lines(lw, node, f, var, a_src, b_src, dt, finite=(part_a == "hf", part_b == "hf"))
    lw.place[node] = Reg(f, var)
    how = "tensor cores" if parts == [("", "")] else "tensor cores (fp32 as 3 bf16 products)"
    lw.emit(Step("", lines, decls=decls, reads=reads, note=f"{describe(node)} on {how}"))


FP32_MMA_PRODUCTS = 3  # an fp32 x fp32 block matmul on tensor cores: lo*hi + hi*lo + hi*hi in bf16
HOIST_REGS = 32  # registers per thread a loop-invariant A operand's fragments may keep across the loop
_SPLIT_BUFFER = {"hf": "hi"}  # the finite high half is the high half's buffer, masked in registers after ldmatrix


def hoist_a(lw: Lowering, node, f: Frag, dt: DType):
    """A loop product whose A operand is loop-invariant (a query tile): its fragments are loaded by ldmatrix once,
    before the loop, into registers that every iteration reads (``("hoisted", var)``), when they fit the
    register budget; else None (ldmatrix every iteration)."""
    a = node.srcs[0]
    if lw.phase[node] is not Phase.LOOP or lw.phase[a] is not Phase.INVARIANT:
        return None
    kt = ceil_div(a.shape[-1], MMA.k)
    if f.tb * kt * f.tm * MMA.a.regs > HOIST_REGS:
        return None
    key = (a, f, dt)
    if key not in lw.hoisted:
        src = operand(lw, a, "A", dt, f, node)
        if src[0] != "smem":
            return None
        lw.hoisted[key] = _load_hoisted(lw, node, f, src, dt, kt)
    return lw.hoisted[key]


def _load_hoisted(lw: Lowering, node, f: Frag, src, dt: DType, kt: int):
    _, buf, aptr, alay, ashape = src
    fv = lw.frag_var(f)
    var = lw.fresh("qa")
    lw.kernel_decls.append(f"unsigned {var}[{f.tb}][{kt}][{f.tm}][{MMA.a.regs}];  // A fragments of "
                           f"{describe(node.srcs[0])}, kept in registers across the loop")
    storage = R.DTYPE_C[dt].storage
    body = [f"const {storage}* const a_ = {aptr}" + _offset(_batch_map(ashape, node.shape, "b_"), alay.matrix_elems)
            + ";", "#pragma unroll", f"for (int ks = 0; ks < {kt}; ++ks) {{"]
    body += ["  " + line.replace("a[mi]", f"{var}[bi][ks][mi]") for line in _a_by_ldmatrix(lw, f, fv, alay, kt)] + ["}"]
    lw.emit(Step("", _per_warp_tile(f, fv, body), reads={buf},
                 note=f"A fragments of {describe(node.srcs[0])} into registers, once"), "pro")
    return ("hoisted", var)


def in_place_target(lw: Lowering, node):
    """The acc_sum(_rescale) that this loop product feeds alone: the mma accumulates into its registers."""
    if lw.phase[node] is not Phase.LOOP or lw.uses[node] != 1:
        return None
    users = [n for n in lw.order if node in n.srcs]
    if len(users) != 1:
        return None
    acc = users[0]
    if acc.op not in (BOp.ACC_SUM, BOp.ACC_SUM_RESCALE) or acc.srcs[0] is not node:
        return None
    if acc.op is BOp.ACC_SUM_RESCALE and acc.srcs[1] not in lw.updated:
        return None
    return acc


def operand(lw: Lowering, src, role: str, dt: DType, f: Frag, node, part: str = ""):
    """Where ldmatrix (or the register path) finds operand ``role`` of ``node``; ``part``: the bf16 high
    or low half of an fp32 operand."""
    if part:
        return stage(lw, src, role, dt, part)
    p = lw.place[src]
    k = node.srcs[0].shape[-1]
    if role == "A" and isinstance(p, Reg) and isinstance(p.layout, Frag) and \
            register_a_ok(p.layout, f, src, node, k):
        return ("reg", p.var, p.layout)
    if isinstance(p, Tile) and p.dtype is dt and p.layout.matrix is not None and role in lw.mma_use.get(src, ()):
        return ("smem", p.buf, p.ptr, p.layout, src.shape)
    return stage(lw, src, role, dt)


def register_a_ok(fa: Frag, f: Frag, src, node, k: int) -> bool:
    """A previous product's C fragments can serve as this product's A fragments without a trip to shared."""
    return (fa.wn == 1 and f.wn == 1 and k % 16 == 0 and fa.m == f.m and fa.wb == f.wb and fa.wm == f.wm
            and fa.tb == f.tb and fa.tm == f.tm and tuple(src.shape[:-2]) == tuple(node.shape[:-2])
            and fa.used == f.used)


def stage(lw: Lowering, src, role: str, dt: DType, part: str = "", layout: TileLayout | None = None):
    """A 16-bit, ldmatrix-ready copy of ``src`` (rounded to the mma dtype, K padded with zeros); ``layout``: the
    copy's layout instead (wgmma's swizzled tiles: no padding)."""
    key = (src, role, dt, part, lw.version(src), layout)
    if key in lw.staged:
        return lw.staged[key]
    shape = tuple(src.shape)
    rows, cols = (shape[-2] if len(shape) > 1 else 1), shape[-1]
    batch = prod(shape[:-2])
    rows_p, cols_p = (rows, round_up(cols, 16)) if role == "A" else (round_up(rows, 16), round_up(cols, 8))
    layout = layout or mma_tile(batch, rows_p, cols_p, 2)
    align = getattr(getattr(layout.matrix, "mode", None), "period", 0)
    ctype = R.DTYPE_C[dt]
    convert = R.SPLIT_C[part] if part else _rounded_once(ctype.store.format, dt)
    buf = lw.buffer("operand", layout.nbytes, f"{describe(src)} as {dt.short}{' ' + part if part else ''} "
                    f"operand {role}", ctype=ctype.storage, layout=layout, ldmatrix=True, align=align)
    p = lw.place[src]
    if isinstance(p, Reg) and isinstance(p.layout, Frag):
        lines, reads = _stage_from_frag(lw, src, p, buf, layout, rows, cols, convert)
    else:
        values.addressable(lw, src)
        lines, reads = _stage_from_smem(lw, src, buf, layout, rows, cols, convert)
    lw.emit(Step("", lines, reads=reads, writes={buf}, note=f"stage {describe(src)} for ldmatrix"), lw.home(src))
    result = ("smem", buf, buf, layout, shape)
    lw.staged[key] = result
    return result


def _rounded_once(store, dt: DType):
    """``store`` (a value's rounding to ``dt`` for the operand) without a cast to ``dt`` around the whole value:
    rounding an already-rounded value changes nothing, so f2h(cast_f16(x)) = f2h(x), one conversion, not three."""
    cast = f"mg_cast_{dt.short}("

    def convert(v: str) -> str:
        if v.startswith(cast) and _close(v, len(cast) - 1) == len(v) - 1:
            v = v[len(cast):-1]
        return store(v)
    return convert


def _close(text: str, open_at: int) -> int:
    """The index of the ')' closing the '(' at ``open_at``."""
    depth = 0
    for k in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return k
    return -1


def _stage_from_smem(lw: Lowering, src, buf, layout: TileLayout, rows, cols, convert):
    """16 bytes per thread and step: 8 values of one row, rounded, packed, stored at once."""
    shape = tuple(src.shape)
    per_row = layout.cols // 8
    full = (layout.batch, layout.rows, per_row)
    reads = values.reads_plain(lw, src, shape)

    def body(ctx):
        b, r, cc = ctx.coords
        vals = []
        for j in range(8):
            col = f"{cc} * 8 + {j}" if per_row > 1 else str(j)
            coords = unravel(b, shape[:-2]) + ([r] if len(shape) > 1 else []) + [col]
            v = values.read_at(lw, src, coords, None, Ctx(None, shape, tuple(coords)))
            conds = []
            if layout.cols > cols:
                conds.append(f"{col} < {cols}")
            if layout.rows > rows:
                conds.append(f"{r} < {rows}")
            vals.append(f"({' && '.join(conds)} ? {convert(v)} : (unsigned short)0)" if conds
                        else convert(v))
        words = ", ".join(f"mg_pack2({vals[2 * w]}, {vals[2 * w + 1]})" for w in range(4))
        col0 = f"{cc} * 8" if per_row > 1 else "0"
        return [f"mg_st16(&{buf}[{layout.index(b, r, col0)}], mg_u32x4{{{words}}});"]
    return loops.plain_loop(lw, full, body), reads


def _stage_from_frag(lw: Lowering, src, p: Reg, buf, layout: TileLayout, rows, cols, convert):
    f: Frag = p.layout
    shape = tuple(src.shape)

    def body(ctx):
        cond = []
        if f.batch_guard:
            cond.append(f"b_ < {layout.batch}")
        if f.wm * f.tm * 16 > layout.rows:
            cond.append(f"r_ < {layout.rows}")
        if f.wn * f.tn * 8 > layout.cols:
            cond.append(f"c_ < {layout.cols}")
        valid = []
        if f.row_guard:
            valid.append(f"r_ < {rows}")
        if f.col_guard:
            valid.append(f"c_ < {cols}")
        v = convert(p.var + ctx.slot)
        if valid:
            v = f"({' && '.join(valid)} ? {v} : (unsigned short)0)"
        return loops.guarded(" && ".join(cond), [f"{buf}[{layout.index('b_', 'r_', 'c_')}] = {v};"], "")
    lines = loops.frag_loop(lw, f, body, guard=False, coords_shape=shape)
    cover_r, cover_c = f.wm * f.tm * 16, f.wn * f.tn * 8
    if cover_r < layout.rows or cover_c < layout.cols:  # padding no warp tile reaches: zeros
        def zero(ctx):
            b, r, c = ctx.coords
            return [f"if ({r} >= {cover_r} || {c} >= {cover_c}) {buf}[{layout.index(b, r, c)}] = 0;"]
        lines += loops.plain_loop(lw, (layout.batch, layout.rows, layout.cols), zero)
    return lines, set()


def _batch_map(operand_shape, out_shape, b: str) -> str:
    ob, ab = tuple(out_shape[:-2]), tuple(operand_shape[:-2])
    if prod(ab) == 1:
        return "0"
    if ab == ob:
        return b
    return linear(broadcast(ab, ob, unravel(b, ob)), ab)


def _offset(batch: str, stride: int) -> str:
    if batch == "0":
        return ""
    return f" + {batch} * {stride}"


def mma_lines(lw: Lowering, node, f: Frag, var: str, a_src, b_src, dt: DType,
              finite: tuple = (False, False)) -> list[str]:
    """The k-step loop of one product: A and B fragments by ldmatrix (or A from registers), then the mmas. Every
    lane address and register pairing is rendered from the ``PATH`` tables. ``finite``: zero the inf/NaN halves
    of the A / B fragments after loading them."""
    fv = lw.frag_var(f)
    kt = ceil_div(node.srcs[0].shape[-1], MMA.k)
    out_shape = tuple(node.shape)
    storage = R.DTYPE_C[dt].storage
    body = []
    if a_src[0] == "smem":
        _, _, aptr, alay, ashape = a_src
        body.append(f"const {storage}* const a_ = {aptr}"
                    + _offset(_batch_map(ashape, out_shape, "b_"), alay.matrix_elems) + ";")
    _, _, bptr, blay, bshape = b_src
    body.append(f"const {storage}* const bb_ = {bptr}"
                + _offset(_batch_map(bshape, out_shape, "b_"), blay.matrix_elems) + ";")
    body += ["#pragma unroll", f"for (int ks = 0; ks < {kt}; ++ks) {{"]
    inner = [f"unsigned a[{f.tm}][{MMA.a.regs}], b[{f.tn}][{MMA.b.regs}];"]
    if a_src[0] == "hoisted":
        inner += ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll",
                  f"  for (int r_ = 0; r_ < {MMA.a.regs}; ++r_) a[mi][r_] = {a_src[1]}[bi][ks][mi][r_];"]
    elif a_src[0] == "reg":
        inner += _a_from_registers(f, a_src[1], dt)
    else:
        inner += _a_by_ldmatrix(lw, f, fv, alay, kt)
    inner += _b_by_ldmatrix(lw, f, fv, blay, kt)
    inner += _finite_only("a", f.tm, MMA.a.regs) if finite[0] else []
    inner += _finite_only("b", f.tn, MMA.b.regs) if finite[1] else []
    inner += ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll",
              f"  for (int ni = 0; ni < {f.tn}; ++ni) {R.MMA_C[dt]}({var}[bi][mi][ni], a[mi], b[ni]);"]
    body += ["  " + line for line in inner] + ["}"]
    return _per_warp_tile(f, fv, body)


def _per_warp_tile(f: Frag, fv: str, body: list[str]) -> list[str]:
    """``body`` for each batch tile ``bi`` of this warp (``b_``: its batch index), on the warps holding tiles."""
    b_expr = f"{fv}b + bi"
    if f.wb * f.tb > f.batch:
        b_expr = f"({fv}b + bi < {f.batch} ? {fv}b + bi : {f.batch - 1})"
    body = loops.consts([("b_", b_expr)], body, "") + body
    loop = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi) {{"] + ["  " + x for x in body] + ["}"]
    if f.used < f.warps:
        return [f"if (warp < {f.used}) {{  // warps {f.used}..{f.warps - 1} hold no tile"] + \
            ["  " + x for x in loop] + ["}"]
    return loop


def _finite_only(frag: str, tiles: int, regs: int) -> list[str]:
    return ["#pragma unroll", f"for (int t_ = 0; t_ < {tiles}; ++t_)", "#pragma unroll",
            f"  for (int r_ = 0; r_ < {regs}; ++r_) {frag}[t_][r_] = mg_bf16x2_finite({frag}[t_][r_]);"]


def _a_from_registers(f: Frag, src: str, dt: DType) -> list[str]:
    """A fragments packed from a previous product's C registers (PATH.a_from_c pairs them)."""
    cvt = R.DTYPE_C[dt].store
    per_k = MMA.k // MMA.n
    lines = ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi) {{"]
    for reg, halves in enumerate(PATH.a_from_c()):
        vals = [cvt.format(f"{src}[bi][mi][{per_k} * ks{f' + {dt_}' if dt_ else ''}][{q}]") for dt_, q in halves]
        lines.append(f"  a[mi][{reg}] = mg_pack2({', '.join(vals)});")
    return lines + ["}"]


def _a_by_ldmatrix(lw: Lowering, f: Frag, fv: str, alay, kt: int) -> list[str]:
    r, c = load_address("a_load")
    row = f"{fv}m + mi * {MMA.m} + {r}"
    if f.wm * f.tm * MMA.m > alay.rows:
        row = f"({row} < {alay.rows} ? {row} : {alay.rows - 1})"
    col = f"ks * {MMA.k} + {c}"
    index = _hoisted(lw, alay.index('0', row, col), {"ks": kt, "mi": f.tm})
    return ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi)",
            f"  {PATH.a_load.ld.intrinsic}(a[mi], &a_[{index}]);"]


def _hoisted(lw: Lowering, index: str, counters: dict) -> str:
    """An ldmatrix address computed once per thread (the main loop adds only constants: ``offsets``)."""
    return offsets.hoist_unrolled(index, lw.thread_bases, lw.kernel_decls, counters)


def _b_by_ldmatrix(lw: Lowering, f: Frag, fv: str, blay, kt: int) -> list[str]:
    """B fragments: ``PATH.b_wide`` fills several n-tiles per ldmatrix, ``PATH.b_one`` the odd one left."""
    lines = []
    wide = PATH.b_wide
    groups = f.tn // wide.tiles
    if groups:
        r, c = load_address("b_wide")
        col = _clamp_col(f, blay, f"{fv}n + nj * {wide.tiles * MMA.n} + {c}")
        unpack = ", ".join(f"b[{wide.tiles} * nj{f' + {j // MMA.b.regs}' if j // MMA.b.regs else ''}]"
                           f"[{j % MMA.b.regs}] = t[{j}]" for j in range(wide.ld.num))
        lines += ["#pragma unroll", f"for (int nj = 0; nj < {groups}; ++nj) {{", f"  unsigned t[{wide.ld.num}];",
                  f"  {wide.ld.intrinsic}(t, &bb_[{_hoisted(lw, blay.index('0', f'ks * {MMA.k} + {r}', col), {'ks': kt, 'nj': groups})}]);",
                  f"  {unpack};", "}"]
    for tile in range(groups * wide.tiles, f.tn):
        r, c = load_address("b_one")
        col = _clamp_col(f, blay, f"{fv}n + {tile} * {MMA.n}" + (f" + {c}" if c != "0" else ""))
        index = _hoisted(lw, blay.index('0', f'ks * {MMA.k} + {r}', col), {"ks": kt})
        lines.append(f"{PATH.b_one.ld.intrinsic}(b[{tile}], &bb_[{index}]);")
    return lines


def _clamp_col(f: Frag, blay, col: str) -> str:
    """Warp tiles past the B tile's columns read its last n-tile (their results are never stored)."""
    if f.wn * f.tn * MMA.n > blay.cols:
        return f"({col} < {blay.cols} ? {col} : {blay.cols - MMA.n})"
    return col


def simt_matmul(lw: Lowering, node) -> None:
    """fp32 x fp32: no tensor-core type keeps fp32 exact, so each thread sums its elements' products."""
    a, b = node.srcs
    values.addressable(lw, a)
    values.addressable(lw, b)
    shape = tuple(node.shape)
    k = a.shape[-1]
    lay = Spread(prod(shape), lw.T)
    var = lw.fresh("v")

    def body(ctx):
        batch = ctx.coords[:-2]
        ac = broadcast(a.shape[:-2], shape[:-2], batch) + [ctx.coords[-2], "k_"]
        bc = broadcast(b.shape[:-2], shape[:-2], batch) + ["k_", ctx.coords[-1]]
        ra = values.read_at(lw, a, ac, None, ctx)
        rb = values.read_at(lw, b, bc, None, ctx)
        return ["float p_ = 0.0f;", f"for (int k_ = 0; k_ < {k}; ++k_) p_ += {ra} * {rb};",
                f"{var}{ctx.slot} = p_;"]
    lines = loops.spread_loop(lw, lay, shape, body, guard=True)
    reads = values.reads_plain(lw, a, a.shape) | values.reads_plain(lw, b, b.shape)
    lw.place[node] = Reg(lay, var)
    lw.emit(Step("", lines, decls=[f"float {var}{loops.dims(lay)};"], reads=reads,
                 note=f"{describe(node)} in fp32 (SIMT)"))
