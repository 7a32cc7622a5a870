"""Elementwise ops (the thread level): on a register value, computed per element into registers of the same
layout; on values every thread can address, recomputed inline wherever they are read (the C snippet of each op
is a row of ``snippets.ELEMENTWISE_C``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import loops, values
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.placement import Inline, Reg, describe

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering


def lower_elementwise(lw: Lowering, node) -> None:
    scaled = values.scaled_exp(lw, node)
    srcs = [scaled[0]] if scaled else node.srcs      # exp(x * c): x's registers (the scale is folded)
    full = [s for s in srcs if isinstance(lw.place[s], Reg) and tuple(s.shape) == tuple(node.shape)]
    if values.fold_into_exp(lw, node):   # a scale the exp folds: read inline by the exp, in its registers' loop
        lw.place[node] = Inline()
        return
    if not full:
        for s in node.srcs:
            values.addressable(lw, s)
        lw.place[node] = Inline()
        return
    layout = lw.place[full[0]].layout
    var = lw.fresh("v")
    probe = loops.probe_ctx(layout, node.shape)
    for s in srcs:
        values.ensure(lw, s, probe)
    reads = set().union(*(values.reads_of(lw, s, probe) for s in srcs))
    lw.place[node] = Inline()  # so that read() renders the op itself
    lines = loops.layout_loop(lw, layout, node.shape, lambda ctx: [f"{var}{ctx.slot} = {values.read(lw, node, ctx)};"],
                              guard=bool(reads))
    lw.place[node] = Reg(layout, var)
    lw.emit(Step("", lines, decls=[f"float {var}{loops.dims(layout)};"], reads=reads,
                 note=f"{describe(node)} in registers"))
