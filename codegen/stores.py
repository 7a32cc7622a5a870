"""Block outputs to global memory: each block writes its tile at the origin its omap gives, from registers (pairs
of 16-bit values as one 32-bit store where a Frag allows) or from shared memory."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import loops, values
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import MMA, Frag, c_index, strided
from mugraph.codegen.placement import Reg
from mugraph.ir.block import AXES
from mugraph.ir.dtypes import DType

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering


def store_output(lw: Lowering, i: int, out) -> None:
    node = out.node
    param = lw.outputs[i].param
    shape = tuple(node.shape)
    gstrides = lw.outputs[i].strides or loops.row_major(out.shape)   # an output view writes through its strides
    terms = []
    for axis, dim in enumerate(out.omap):
        bid = lw.bid(AXES[axis])
        if dim is not None and shape[dim] * gstrides[dim] and bid != "0":
            terms.append(f"(long long){bid} * {shape[dim] * gstrides[dim]}")
    base = f"{param}o"
    lw.kernel_decls.append(f"const long long {base} = {' + '.join(terms) or '0'};  // output {i} tile origin")
    cvt = R.DTYPE_C[out.dtype].store

    def write(ctx, v):
        return f"{param}[{base} + {strided(ctx.coords, gstrides)}] = {cvt.format(v)};"
    p = lw.place[node]
    if isinstance(p, Reg) and _pairs_ok(p, out, shape, gstrides):
        lines = _pair_store(lw, p, shape, param, base, gstrides, out.dtype)
        reads = set()
    elif isinstance(p, Reg):
        lines = loops.store_lines(lw, p, shape, write)
        reads = set()
    else:
        values.addressable(lw, node)
        reads = values.reads_plain(lw, node, shape)
        lines = loops.plain_loop(lw, shape, lambda ctx: [write(ctx, values.read(lw, node, ctx))])
    lw.emit(Step("", lines, reads=reads, note=f"store output {i} ({out.dtype.short}{list(out.shape)})"))


def _pairs_ok(p: Reg, out, shape, gstrides) -> bool:
    """A Frag's two adjacent columns per lane can go out as one 32-bit store of a 16-bit output: every
    pair starts on an even element (even width, even strides, even tile origins)."""
    even = gstrides[-1] == 1 and all(s % 2 == 0 for s in gstrides[:-1]) and shape[-1] % 2 == 0
    return isinstance(p.layout, Frag) and out.dtype.is_16bit and len(shape) >= 2 and shape[-1] > 1 and even


def _pair_store(lw: Lowering, p: Reg, shape, param: str, base: str, gstrides, dtype: DType) -> list[str]:
    f: Frag = p.layout
    cvt = R.DTYPE_C[dtype].store
    v = lw.frag_var(f)
    coords = loops.frag_coords(shape)
    index = f"{base} + {strided(coords, gstrides)}"
    pair = f"mg_pack2({cvt.format(p.var + '[bi][mi][ni][2 * h]')}, {cvt.format(p.var + '[bi][mi][ni][2 * h + 1]')})"
    inner = loops.guarded(loops.frag_valid(f), [f"mg_st32(&{param}[{index}], {pair});"], "  ")
    row, col = c_index(loops.ROW_HALF)  # the pair's first register: 2h
    return ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
            f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", f"for (int ni = 0; ni < {f.tn}; ++ni)",
            "#pragma unroll", "for (int h = 0; h < 2; ++h) {"] + \
        loops.consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * {MMA.m} + {row}"),
                      ("c_", f"{v}n + ni * {MMA.n} + {col}")], inner, "  ") + inner + ["}"]
