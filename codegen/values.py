"""Reading a value wherever it lives: the C expression of a node at a loop context's element, the shared buffers
that read touches, and materialising a register value to shared memory when another layout must read it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import loops
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import Frag, Rows, broadcast, linear, prod, same_rows
from mugraph.codegen.placement import Const, Ctx, Inline, Reg, Smem, Tile, describe
from mugraph.codegen.thread import render_thread
from mugraph.ir.ops import BOp, TOp

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering


def child_mode(child, ctx: Ctx, mode):
    """How ``child`` of a value read in ``mode`` can come from registers: "own" (same layout and shape), "row"
    (a Rows value broadcast over a Frag's columns) or None (through shared memory)."""
    if mode == "own" and tuple(child.shape) == ctx.shape:
        return "own"
    if mode in ("own", "row") and isinstance(ctx.layout, Frag) and tuple(child.shape) == ctx.shape[:-1] + (1,):
        return "row"
    return None


def reg_expr(p: Reg, ctx: Ctx, mode) -> str | None:
    """A register value read where the context's thread holds it: the same layout, or the row values of a Frag
    whose threads hold the same rows (two products of one query tile, e.g. Q K and P V of different widths)."""
    own = p.layout == ctx.layout or (isinstance(p.layout, Rows) and isinstance(ctx.layout, Rows)
                                     and same_rows(p.layout.frag, ctx.layout.frag))
    if mode == "own" and own:
        return p.var + ctx.slot
    if mode == "row" and isinstance(p.layout, Rows) and isinstance(ctx.layout, Frag) and \
            same_rows(p.layout.frag, ctx.layout):
        return p.var + ctx.row_slot
    return None


def read(lw: Lowering, node, ctx: Ctx) -> str:
    """The fp32 value of ``node`` at the context's element (broadcast)."""
    coords = broadcast(node.shape, ctx.shape, ctx.coords)
    return read_at(lw, node, coords, child_mode(node, ctx, "own"), ctx)


def read_at(lw: Lowering, node, coords, mode, ctx: Ctx) -> str:
    p = lw.place[node]
    if isinstance(p, Const):
        return p.text
    if isinstance(p, Reg):
        expr = reg_expr(p, ctx, mode)
        if expr is not None:
            return expr
        return smem_read(lw.mats[(node, lw.version(node))], coords)
    if isinstance(p, Tile):
        return tile_read(p, coords)
    if isinstance(p, Smem):
        return smem_read(p, coords)
    return _inline(lw, node, coords, mode, ctx)


def _inline(lw: Lowering, node, coords, mode, ctx) -> str:
    if node.op is BOp.RMS_NORM:
        x = node.srcs[0]
        rcoords = list(coords)
        rcoords[node.arg[0]] = "0"
        r = smem_read(lw.mats[(node, "rms")], rcoords)
        return f"({read_at(lw, x, coords, child_mode(x, ctx, mode), ctx)} * {r})"
    scaled = scaled_exp(lw, node)
    if scaled:   # exp(x * c) = 2^(x * c log2(e)): one multiply and MUFU.EX2 (__expf would multiply twice)
        x, c = scaled
        value = read_at(lw, x, broadcast(x.shape, node.shape, coords), child_mode(x, ctx, mode), ctx)
        return f"mg_exp2({value} * {R.literal(c * LOG2E)})"
    args = []
    for s in node.srcs:
        c = broadcast(s.shape, node.shape, coords)
        args.append(read_at(lw, s, c, child_mode(s, ctx, mode), ctx))
    if node.op is BOp.THREAD:
        return render_thread(node.arg, args)
    return R.elementwise(node.op, args, node.arg)


LOG2E = 1.4426950408889634  # log2(e): exp(x) = 2^(x log2 e)


def scale_of(node) -> tuple | None:
    """(x, c) where ``node`` is x times the scalar constant c (either order); else None."""
    if node.op is not TOp.MUL:
        return None
    for x, k in (node.srcs, node.srcs[::-1]):
        if k.op is BOp.CONSTANT and prod(k.shape) == 1 and prod(x.shape) == prod(node.shape):
            return x, float(k.arg[0])
    return None


def scaled_exp(lw: Lowering, node) -> tuple | None:
    """(x, c) where ``node`` is exp of x * c and that product is read by the exp alone and left inline (the
    exp folds the scale: ``fold_into_exp``); else None."""
    if node.op is not TOp.EXP or not isinstance(lw.place.get(node.srcs[0]), Inline):
        return None
    return scale_of(node.srcs[0]) if fold_into_exp(lw, node.srcs[0]) else None


def fold_into_exp(lw: Lowering, node) -> bool:
    """Whether ``node`` (x * c) is read only by an exp, which computes 2^(x * c log2 e) itself: the product is
    then not materialised."""
    if scale_of(node) is None or lw.uses[node] != 1:
        return False
    return any(n.op is TOp.EXP and n.srcs[0] is node for n in lw.order)


def tile_read(t: Tile, coords) -> str:
    b, r, c = tile_bcr(t.shape, coords)
    return R.DTYPE_C[t.dtype].load.format(f"{t.ptr}[{t.layout.index(b, r, c)}]")


def tile_bcr(shape, coords):
    """(batch, row, col) of a tile coordinate: leading dims fold into one batch index."""
    batch = linear(coords[:-2], shape[:-2]) if len(shape) > 2 else "0"
    row = coords[-2] if len(shape) > 1 else "0"
    return batch, row, coords[-1]


def smem_read(m: Smem, coords) -> str:
    return f"{m.buf}[{linear(coords, m.shape)}]"


def reads_of(lw: Lowering, node, ctx: Ctx) -> set[str]:
    """The shared buffers reading ``node`` in ``ctx`` touches."""
    return _reads(lw, node, child_mode(node, ctx, "own"), ctx)


def _reads(lw: Lowering, node, mode, ctx) -> set[str]:
    p = lw.place[node]
    if isinstance(p, Const):
        return set()
    if isinstance(p, Reg):
        if reg_expr(p, ctx, mode) is not None:
            return set()
        return {lw.mats[(node, lw.version(node))].buf}
    if isinstance(p, (Tile, Smem)):
        return {p.buf}
    out = set()
    if node.op is BOp.RMS_NORM:
        out.add(lw.mats[(node, "rms")].buf)
    for s in node.srcs:
        out |= _reads(lw, s, child_mode(s, ctx, mode), ctx)
    return out


def ensure(lw: Lowering, node, ctx: Ctx) -> None:
    """Materialise whatever ``node`` needs that the context cannot read from registers."""
    _ensure(lw, node, child_mode(node, ctx, "own"), ctx)


def _ensure(lw: Lowering, node, mode, ctx) -> None:
    p = lw.place[node]
    if isinstance(p, Reg):
        if reg_expr(p, ctx, mode) is None:
            materialise(lw, node)
    elif isinstance(p, Inline):
        for s in node.srcs:
            _ensure(lw, s, child_mode(s, ctx, mode), ctx)


def addressable(lw: Lowering, node) -> None:
    """Make ``node`` readable by any thread at any coordinate."""
    ensure(lw, node, Ctx(None, tuple(node.shape), tuple(["0"] * len(node.shape))))


def reads_plain(lw: Lowering, node, shape) -> set[str]:
    return reads_of(lw, node, Ctx(None, tuple(shape), tuple(["0"] * len(shape))))


def materialise(lw: Lowering, node) -> None:
    """Write a register value to an fp32 shared buffer (once per version and region)."""
    key = (node, lw.version(node))
    if key in lw.mats:
        return
    p: Reg = lw.place[node]
    shape = tuple(node.shape)
    buf = lw.buffer("fp32", 4 * prod(shape), f"{describe(node)} (fp32)")
    smem = Smem(buf, shape)
    lines = loops.store_lines(lw, p, shape, lambda ctx, v: f"{buf}[{linear(ctx.coords, shape)}] = {v};")
    lw.emit(Step("", lines, writes={buf}, note=f"{describe(node)} -> shared"), lw.home(node))
    lw.mats[key] = smem
