"""Block matmuls on wgmma (sm_90a's path): one warpgroup per 64 rows of the product, each issuing
wgmma.mma_async.m64nNk16 per k-step with A from a swizzled shared tile (its descriptor) or from registers (a
previous product's accumulators, packed as the A fragment), B from a swizzled shared tile, fp32 accumulation.

The accumulators are the mma.sync ``Frag`` of a product whose warps stack along M (hopper_layouts shows wgmma's
registers are exactly that Frag's), so every other lowering module reads them unchanged. A product issues its
k-steps between wgmma.fence and commit_group, then waits for them (wait_group 0): the accumulators are read right
after, and shared memory it reads stays put until then. Operands that are not already swizzled tiles are staged
into one (generic writes: the barrier before the product fences them for the async proxy).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import accumulators, hopper_layouts as H, loops, mma, wgmma_intrinsics
from mugraph.codegen import render as R
from mugraph.codegen.hopper_pipeline import swizzled_layout
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import PATH, Frag, prod
from mugraph.codegen.placement import Reg, Tile, describe
from mugraph.ir.block import Phase
from mugraph.ir.ops import RESCALE_ACCUMULATORS
from mugraph.ir.shapes import mma_dtype

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

MAX_ACC_FLOATS = 128  # accumulator registers per thread a product may take (of 255)


def frag(batch: int, m: int, n: int, warps: int) -> Frag:
    """The accumulators of a [batch, m, n] product on wgmma: warps stacked along M, 16 rows each."""
    return Frag(batch, m, n, warps, 1, warps, 1)


def lower_matmul(lw: Lowering, node) -> bool:
    """Lower ``node`` to wgmma when it fits (nothing emitted and False otherwise): 16-bit operands, 64 rows per
    warpgroup, n a multiple of 8 up to 256, k a multiple of 16, A in registers or a swizzled tile (or one it can
    be staged into), B a swizzled tile (or stageable)."""
    if not (lw.hopper and lw.arch.wgmma) or lw.W % 4:
        return False
    a, b = node.srcs
    dt = mma_dtype(a.dtype, b.dtype)
    shape = tuple(node.shape)
    m, n, k, batch = shape[-2], shape[-1], a.shape[-1], prod(shape[:-2])
    if not dt.is_16bit or m != 16 * lw.W or n not in H.WGMMA_NS or k % H.WGMMA_K or \
            batch * n // 2 > MAX_ACC_FLOATS:
        return False
    f = frag(batch, m, n, lw.W)
    a_kind, b_kind = _a_kind(lw, a, f, dt), _b_kind(lw, b, dt)
    if a_kind is None or b_kind is None:
        return False
    a_src = ("reg", lw.place[a].var) if a_kind == "reg" else _smem(lw, a, "A", dt, a_kind)
    b_src = _smem(lw, b, "B", dt, b_kind)
    _emit(lw, node, f, dt, a_src, b_src)
    return True


def _a_kind(lw: Lowering, a, f: Frag, dt) -> str | None:
    p = lw.place[a]
    if isinstance(p, Reg) and p.layout == frag(f.batch, f.m, a.shape[-1], lw.W):  # a wgmma product's registers
        return "reg"
    if _swizzled_tile(p, dt, (f.m, a.shape[-1])):
        return "tile"
    return "stage" if swizzled_layout(tuple(a.shape), 2, "A") else None


def _b_kind(lw: Lowering, b, dt) -> str | None:
    if _swizzled_tile(lw.place[b], dt, tuple(b.shape[-2:])):
        return "tile"
    return "stage" if swizzled_layout(tuple(b.shape), 2, "B") else None


def _swizzled_tile(p, dt, rows_cols) -> bool:
    return isinstance(p, Tile) and p.dtype is dt and isinstance(p.layout.matrix, H.SwizzledTile) and \
        (p.layout.rows, p.layout.cols) == tuple(rows_cols)


def _smem(lw: Lowering, src, role: str, dt, kind: str):
    """("smem", buffer, pointer, layout, shape) of an operand in a swizzled tile: its input tile, or a staged copy."""
    if kind == "tile":
        p = lw.place[src]
        return ("smem", p.buf, p.ptr, p.layout, tuple(src.shape))
    return mma.stage(lw, src, role, dt, layout=swizzled_layout(tuple(src.shape), 2, role))


def _emit(lw: Lowering, node, f: Frag, dt, a_src, b_src) -> None:
    acc_node = mma.in_place_target(lw, node)
    if acc_node is not None:
        var = accumulators.state_var(lw, acc_node, f)
        lw.in_place.add(acc_node)
        decls = []
    else:
        var = lw.fresh("v")
        decls = [f"float {var}{loops.dims(f)} = {{}};"]
    shape = tuple(node.shape)
    lines, reads = [], {s[1] for s in (a_src, b_src) if s[0] == "smem"}
    if acc_node is not None and acc_node.op in RESCALE_ACCUMULATORS:
        lines += accumulators.rescale_lines(lw, acc_node, Reg(f, var), shape)
        reads |= accumulators.factor_reads(lw, acc_node, f, shape)
    lines += _product(lw, node, f, var, a_src, b_src, dt)
    lw.place[node] = Reg(f, var)
    lw.async_reads = True
    if lw.phase[node] is Phase.LOOP:
        lw.wgmma_flops += 2 * f.batch * f.m * f.n * node.srcs[0].shape[-1]
    source = "registers" if a_src[0] == "reg" else "shared memory"
    lw.emit(Step("", lines, decls=decls, reads=reads,
                 note=f"{describe(node)} on tensor cores (wgmma m64n{f.n}k16, A from {source})"))


def _product(lw: Lowering, node, f: Frag, var: str, a_src, b_src, dt) -> list[str]:
    """fence; per batch matrix and k-step one wgmma per warpgroup; commit; wait for it."""
    kt = node.srcs[0].shape[-1] // H.WGMMA_K
    out_shape = tuple(node.shape)
    storage = R.DTYPE_C[dt].storage
    _, _, bptr, blay, bshape = b_src
    b_tile: H.SwizzledTile = blay.matrix
    bdesc = H.b_operand(b_tile)
    body = [f"const {storage}* const bb_ = {bptr}" + mma._offset(mma._batch_map(bshape, out_shape, "bi"),
                                                                blay.matrix_elems) + ";"]
    b_desc = f"mg_smem_desc(bb_ + ks * {H.b_start(b_tile, 1)}, {bdesc.lbo}, {bdesc.sbo}, {bdesc.mode.desc_code})"
    acc = f"&{var}[bi][0][0][0]"
    if a_src[0] == "reg":
        fn = wgmma_intrinsics.name(f.n, dt.short, "rs")
        inner = _a_registers(a_src[1], dt) + [f"{fn}<{bdesc.trans}>({acc}, a_, {b_desc}, 1);"]
    else:
        _, _, aptr, alay, ashape = a_src
        a_tile: H.SwizzledTile = alay.matrix
        adesc = H.a_operand(a_tile)
        body.append(f"const {storage}* const a_ = {aptr}" + mma._offset(mma._batch_map(ashape, out_shape, "bi"),
                                                                        alay.matrix_elems) + _wg_rows(lw, a_tile) + ";")
        a_desc = f"mg_smem_desc(a_ + {_a_step(a_tile)}, {adesc.lbo}, {adesc.sbo}, {adesc.mode.desc_code})"
        fn = wgmma_intrinsics.name(f.n, dt.short, "ss")
        inner = [f"{fn}<{adesc.trans}, {bdesc.trans}>({acc}, {a_desc}, {b_desc}, 1);"]
    body += ["#pragma unroll", f"for (int ks = 0; ks < {kt}; ++ks) {{"] + ["  " + x for x in inner] + ["}"]
    return ["mg_wgmma_fence();", "#pragma unroll", f"for (int bi = 0; bi < {f.batch}; ++bi) {{"] + \
        ["  " + x for x in body] + ["}", "mg_wgmma_commit();", "mg_wgmma_wait<0>();"]


def _wg_rows(lw: Lowering, tile: H.SwizzledTile) -> str:
    """This warpgroup's 64 rows of A (elements): the warpgroups of a block split M."""
    if lw.W == 4:
        return ""
    return f" + (warp >> 2) * {H.WGMMA_M * tile.mode.width // 2}"


def _a_step(tile: H.SwizzledTile) -> str:
    """Element offset of k-step ``ks`` in A's tile (hopper_layouts.a_start, rendered): its column block, then its
    16 columns within the block's rows."""
    per_block = tile.atom_cols // H.WGMMA_K
    if per_block == 1 or tile.blocks == 1:
        return f"ks * {H.a_start(tile, 1)}" if tile.blocks == 1 else f"ks * {tile.block_bytes // 2}"
    shift = per_block.bit_length() - 1
    return f"(ks >> {shift}) * {tile.block_bytes // 2} + (ks & {per_block - 1}) * {H.WGMMA_K}"


def _a_registers(src: str, dt) -> list[str]:
    """A's registers of k-step ks from a previous product's accumulators (PATH.a_from_c pairs them; wgmma's A
    fragment is mma.sync's, per warp)."""
    cvt = R.DTYPE_C[dt].store
    per_k = H.WGMMA_K // 8
    lines = ["unsigned a_[4];"]
    for reg, halves in enumerate(PATH.a_from_c()):
        vals = [cvt.format(f"{src}[bi][0][{per_k} * ks{f' + {t}' if t else ''}][{q}]") for t, q in halves]
        lines.append(f"a_[{reg}] = mg_pack2({', '.join(vals)});")
    return lines

