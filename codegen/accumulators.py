"""Accumulators: state in registers in its operand's layout (or in shared memory when too large), joined each
iteration by the accumulator's rule (rescaled by a running max's factor for online softmax), finalised after the
loop."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import loops, reductions, values
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import Spread, ceil_div, prod
from mugraph.codegen.placement import Reg, Smem, Temp, describe

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

REG_SLOTS = 32  # an elementwise accumulator holding more values per thread keeps its state in shared memory


def state_var(lw: Lowering, acc, layout) -> str:
    """The register array holding ``acc``'s state (declared before the loop, set to the rule's identity)."""
    if acc in lw.acc_state:
        return lw.acc_state[acc][1]
    var = lw.fresh("acc")
    rule = R.ACC_C[acc.op]
    lw.acc_state[acc] = (layout, var)
    dims = loops.dims(layout)
    if rule.combine is R.SUM:
        lw.acc_decls.append(f"float {var}{dims} = {{}};  // {describe(acc)}")
    else:
        lw.acc_decls.append(f"float {var}{dims};  // {describe(acc)}")
        lw.acc_decls += loops.fill(var, layout, rule.combine.identity)
    if acc in lw.rescaled:
        lw.acc_decls.append(f"float {var}p{dims}, {var}f{dims};  // previous value, rescale factor")
        lw.prev[acc] = (f"{var}p", f"{var}f")
    return var


def accumulate(lw: Lowering, acc) -> None:
    rule = R.ACC_C[acc.op]
    x = acc.srcs[0]
    if acc in lw.in_place:
        layout, var = lw.acc_state[acc]
        lw.place[acc] = Reg(layout, var)
        return
    if _state_in_smem(lw, acc, rule):
        _accumulate_in_smem(lw, acc, rule)
        return
    if rule.last:
        src = Temp(acc.shape)
        src_layout = reductions.reduction(lw, src, x, len(x.shape) - 1, rule.combine, square=rule.square).layout
    else:
        p = lw.place[x]
        if isinstance(p, Reg):
            src_layout = p.layout
        else:
            values.addressable(lw, x)
            src_layout = Spread(prod(acc.shape), lw.T)
        src = x
    var = state_var(lw, acc, src_layout)
    shape = tuple(acc.shape)
    probe = loops.probe_ctx(src_layout, shape)
    values.ensure(lw, src, probe)
    reads = values.reads_of(lw, src, probe)
    lines = []
    if acc in lw.prev:
        prev, _ = lw.prev[acc]
        lines += loops.copy_regs(prev, var, src_layout)
    if rule.rescale:
        lines += rescale_lines(lw, acc, Reg(src_layout, var), shape)
        reads |= factor_reads(lw, acc, src_layout, shape)
    lines += loops.layout_loop(lw, src_layout, shape, lambda ctx: [
        f"{var}{ctx.slot} = {rule.combine(var + ctx.slot, values.read(lw, src, ctx))};"], guard=bool(reads))
    if acc in lw.prev:
        prev, fac = lw.prev[acc]
        lines += loops.layout_loop(lw, src_layout, shape, lambda ctx: [
            f"{fac}{ctx.slot} = mg_exp({prev}{ctx.slot} - {var}{ctx.slot});"], guard=False)
    lw.place[acc] = Reg(src_layout, var)
    if acc in lw.prev:
        lw.place[lw.factor(acc)] = Reg(src_layout, lw.prev[acc][1])
    lw.emit(Step("", lines, reads=reads, note=f"{describe(acc)} update"))


def _state_in_smem(lw: Lowering, acc, rule) -> bool:
    """Too many values per thread for registers (the cost model counts them as shared memory)."""
    p = lw.place[acc.srcs[0]]
    spread = not isinstance(p, Reg) or isinstance(p.layout, Spread)
    return (not rule.last and acc not in lw.rescaled and spread
            and ceil_div(prod(acc.shape), lw.T) > REG_SLOTS)


def _accumulate_in_smem(lw: Lowering, acc, rule) -> None:
    """The state as an fp32 shared buffer; each thread updates the same elements every iteration."""
    shape = tuple(acc.shape)
    x = acc.srcs[0]
    if acc not in lw.acc_state:
        buf = lw.buffer("fp32", 4 * prod(shape), f"{describe(acc)} state")
        lw.acc_state[acc] = ("smem", buf)
        init = loops.plain_loop(lw, shape, lambda ctx: [f"{buf}[e_] = {rule.combine.identity};"])
        lw.emit(Step("", init, writes={buf}, note=f"initial {describe(acc)}"), "pro")
    buf = lw.acc_state[acc][1]
    values.addressable(lw, x)
    reads = {buf} | values.reads_plain(lw, x, shape)
    scale = ""
    if rule.rescale:
        fac = lw.factor(acc.srcs[1])
        values.addressable(lw, fac)
        reads |= values.reads_plain(lw, fac, shape)
        scale = " * {}"

    def body(ctx):
        state = f"{buf}[e_]" + (scale.format(values.read(lw, lw.factor(acc.srcs[1]), ctx)) if scale else "")
        return [f"{buf}[e_] = {rule.combine(state, values.read(lw, x, ctx))};"]
    lw.emit(Step("", loops.plain_loop(lw, shape, body), reads=reads, writes={buf},
                 note=f"{describe(acc)} update (state in shared memory)"))
    lw.place[acc] = Smem(buf, shape)


def rescale_lines(lw: Lowering, acc, state: Reg, shape) -> list[str]:
    """state *= exp(m_prev - m_cur) for a rescaling accumulator, the factor read in the state's layout."""
    fac = lw.factor(acc.srcs[1])
    probe = loops.probe_ctx(state.layout, shape)
    values.ensure(lw, fac, probe)
    return loops.layout_loop(lw, state.layout, shape, lambda ctx: [
        f"{state.var}{ctx.slot} *= {values.read(lw, fac, ctx)};"], guard=bool(values.reads_of(lw, fac, probe)))


def factor_reads(lw: Lowering, acc, layout, shape) -> set:
    return values.reads_of(lw, lw.factor(acc.srcs[1]), loops.probe_ctx(layout, shape))


def finalise(lw: Lowering, acc) -> None:
    """After the loop: the accumulator's value (its rule's final transform, e.g. the root of a mean square)."""
    layout, var = lw.acc_state[acc]
    if layout == "smem":
        lw.place[acc] = Smem(var, tuple(acc.shape))
        return
    rule = R.ACC_C[acc.op]
    lw.place[acc] = Reg(layout, var)
    if rule.final:
        n = R.literal(lw.F_total * acc.srcs[0].shape[-1])
        lines = loops.layout_loop(lw, layout, acc.shape, lambda ctx: [
            f"{var}{ctx.slot} = {rule.final.format(var + ctx.slot, n=n)};"], guard=False)
        lw.emit(Step("", lines, note=f"final value of {describe(acc)}"))
