"""A block's loop split over several CTAs (split-K, split-KV): after its share of the loop each CTA publishes its
accumulators' partial state to a scratch buffer and counts itself in; the CTA that counts last combines every
partial, in split order (so the result does not depend on which CTA finishes last), then runs the epilogue.

Each thread publishes the registers it holds (its accumulators' register image; one image per quad for row
values, which the 4 lanes of a quad share), so the combining CTA reads exactly the elements each of its threads
needs; a rescaling accumulator (online softmax) combines with each partial's running max, so partials relative
to different maxima combine exactly: acc = sum_s acc_s * exp(m_s - max_s m_s). The max is read from the running
max accumulator's own image when that holds the same rows in the same threads (one float per row), else
published beside the accumulator at each of its elements.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import loops, values
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import Step
from mugraph.codegen.layouts import Frag, Rows, prod, same_rows
from mugraph.codegen.placement import describe
from mugraph.ir.ops import RESCALE_ACCUMULATORS

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

SCRATCH, COUNTERS = "mg_ws", "mg_ctr"  # the kernel parameters a split kernel gets after its outputs


def combine_partials(lw: Lowering, accs: list) -> None:
    """The split kernel's hand-over between the loop and the epilogue (nothing when the loop is not split)."""
    if lw.splits == 1 or not accs:
        return
    entries, floats = _layout(lw, accs)
    lw.state_floats = floats
    _declare_tile(lw, floats)
    saved = dict(lw.mats)
    _publish(lw, entries)
    lw.mats = saved  # partial values materialised for publishing are not the combined values
    flag = lw.buffer("scratch", 16, "whether this CTA finishes the block", ctype="int")
    lw.emit(Step("", ["mg_threadfence();  // this CTA's partials are visible to the others before it counts in",
                      "mg_syncthreads();",
                      f"if (tid == 0) {flag}[0] = mg_atomic_inc(&{COUNTERS}[tile_]) == {lw.splits - 1};"],
                 writes={flag}, note=f"count this CTA in; the last of the {lw.splits} finishes the block"))
    lw.emit(Step("", [f"if ({flag}[0] == 0) return;", "mg_threadfence();"], reads={flag},
                 note="only the last CTA goes on"))
    _combine(lw, entries)


def state_floats(lw: Lowering, accs: list) -> int:
    """Floats of the partial state one CTA publishes when the loop is split, whatever the split (so the schedule
    can weigh splits from the lowering of an unsplit loop)."""
    return _layout(lw, accs)[1] if accs else 0


def _layout(lw: Lowering, accs: list) -> tuple[list, int]:
    """(acc, offset, floats per image, where its running max is) of each accumulator in one CTA's partial state,
    and the state's size. A rescaling accumulator's running max is the image of the running-max accumulator
    when that one holds the same rows in the same threads (online softmax: one max per row, not per element);
    else its own image after the accumulator's (None)."""
    entries, offset, at = [], 0, {}
    for acc in accs:
        layout, _ = lw.acc_state[acc]
        n = prod(acc.shape) if layout == "smem" else prod(layout.dims) * _holders(lw, layout)[0]
        at[acc] = (offset, layout)
        shared = at.get(acc.srcs[1]) if acc.op in RESCALE_ACCUMULATORS else None
        shared = shared if shared and _same_rows(shared[1], layout) else None
        entries.append((acc, offset, n, shared))
        offset += n * (2 if acc.op in RESCALE_ACCUMULATORS and shared is None else 1)
    return entries, offset


def _same_rows(max_layout, layout) -> bool:
    """A Rows value whose threads hold, in the same row slots, the rows ``layout``'s threads hold."""
    return isinstance(max_layout, Rows) and isinstance(layout, (Frag, Rows)) and \
        same_rows(max_layout.frag, layout.frag if isinstance(layout, Rows) else layout)


def _row_slot(layout) -> str:
    """Inside ``layout_loop`` over a Frag or Rows value: the flat index of the current element's row slot in a
    Rows image of the same rows."""
    if isinstance(layout, Rows):
        return loops.slot_index(layout)
    return f"(bi * {layout.tm} + mi) * 2 + (q >> 1)"


def _declare_tile(lw: Lowering, floats: int) -> None:
    gx, gy, _ = lw.g.grid
    bx, by, bz = (lw.bid(a) for a in "xyz")
    tile = bx if (gy, bz) == (1, "0") else f"{bx} + {gx} * ({by} + {gy} * {bz})"
    lw.kernel_decls.append(f"const int tile_ = {tile};  // the block this CTA computes a share of")
    lw.kernel_decls.append(f"const long long ws_ = (long long)tile_ * {lw.splits * floats};  // its partials")


def _holders(lw: Lowering, layout) -> tuple[int, str, str]:
    """(distinct holders, this thread's holder index, whether this thread publishes) of a register layout: the 4
    lanes of a quad hold the same rows of a Rows value, so one image per quad."""
    if isinstance(layout, Rows):
        return lw.T // 4, "(tid >> 2)", "t4_ == 0"
    return lw.T, "tid", ""


def _image(offset: int, slot: str, lw: Lowering, split: str, layout) -> str:
    """The scratch element of one register of this thread in split ``split``'s partial state."""
    count, holder, _ = _holders(lw, layout)
    return f"{SCRATCH}[ws_ + {split} * {lw.state_floats} + {offset} + ({slot}) * {count} + {holder}]"


def _publish(lw: Lowering, entries) -> None:
    lines, reads = [], set()
    for acc, offset, n, shared in entries:
        layout, var = lw.acc_state[acc]
        if layout == "smem":
            lines += loops.plain_loop(lw, acc.shape, lambda ctx: [
                f"{SCRATCH}[ws_ + sp_ * {lw.state_floats} + {offset} + e_] = {var}[e_];"])
            reads.add(var)
            continue
        slot = loops.slot_index(layout)
        rescaled = acc.op in RESCALE_ACCUMULATORS and shared is None
        if rescaled:  # its running max at each of its elements
            probe = loops.probe_ctx(layout, acc.shape)
            values.ensure(lw, acc.srcs[1], probe)
            reads |= values.reads_of(lw, acc.srcs[1], probe)

        def body(ctx, offset=offset, n=n, var=var, rescaled=rescaled, acc=acc, slot=slot, layout=layout):
            out = [f"{_image(offset, slot, lw, 'sp_', layout)} = {var}{ctx.slot};"]
            if rescaled:
                out.append(f"{_image(offset + n, slot, lw, 'sp_', layout)} = {values.read(lw, acc.srcs[1], ctx)};")
            return loops.guarded(_holders(lw, layout)[2], out, "")
        lines += loops.layout_loop(lw, layout, acc.shape, body, guard=True)
    lw.emit(Step("", lines, reads=reads, note=f"publish this CTA's partial state ({lw.state_floats} floats)"))


def _combine(lw: Lowering, entries) -> None:
    lines, writes = [], set()
    for acc, offset, n, shared in entries:
        layout, var = lw.acc_state[acc]
        comb = R.ACC_C[acc.op].combine
        if layout == "smem":
            lines += loops.plain_loop(lw, acc.shape, lambda ctx, offset=offset, var=var, comb=comb: [
                f"float p_ = {comb.identity};",
                f"for (int k_ = 0; k_ < {lw.splits}; ++k_) "
                f"p_ = {comb('p_', f'mg_ldcg(&{SCRATCH}[ws_ + k_ * {lw.state_floats} + {offset} + e_])')};",
                f"{var}[e_] = p_;"])
            writes.add(var)
            continue
        slot = loops.slot_index(layout)
        if acc.op in RESCALE_ACCUMULATORS:
            body = _rescaled_body(lw, var, offset, slot, layout, shared or (offset + n, layout))
        else:
            body = _plain_body(lw, var, offset, slot, comb, layout)
        lines += loops.layout_loop(lw, layout, acc.shape, body, guard=True)
    lines.append(f"if (tid == 0) {COUNTERS}[tile_] = 0;  // ready for the next launch")
    lw.emit(Step("", lines, writes=writes,
                 note=f"combine the {lw.splits} partial states in split order: {', '.join(describe(e[0]) for e in entries)}"))


def _plain_body(lw: Lowering, var: str, offset: int, slot: str, comb, layout):
    def body(ctx):
        part = f"mg_ldcg(&{_image(offset, slot, lw, 'k_', layout)})"
        return [f"float p_ = {comb.identity};",
                f"for (int k_ = 0; k_ < {lw.splits}; ++k_) p_ = {comb('p_', part)};", f"{var}{ctx.slot} = p_;"]
    return body


def _rescaled_body(lw: Lowering, var: str, offset: int, slot: str, layout, max_at):
    m_offset, m_layout = max_at
    m_slot = slot if m_layout is layout else _row_slot(layout)

    def body(ctx):
        part = f"mg_ldcg(&{_image(offset, slot, lw, 'k_', layout)})"
        m = f"mg_ldcg(&{_image(m_offset, m_slot, lw, 'k_', m_layout)})"
        return [f"float m_ = {R.MAX.identity}, p_ = 0.0f;",
                f"for (int k_ = 0; k_ < {lw.splits}; ++k_) m_ = mg_fmax(m_, {m});",
                f"for (int k_ = 0; k_ < {lw.splits}; ++k_) p_ += {part} * mg_exp({m} - m_);",
                f"{var}{ctx.slot} = p_;"]
    return body
