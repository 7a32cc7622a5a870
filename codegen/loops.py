"""How threads walk the elements they hold: unrolled loops over a register layout's slots (Frag, Rows, Spread) or
a plain strided loop over a shape, each giving its body a ``Ctx``; plus the small C-text helpers they share."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mugraph.codegen import offsets
from mugraph.codegen.layouts import MMA, Frag, Rows, Spread, c_index, ceil_div, prod, unravel
from mugraph.codegen.placement import Ctx, Reg

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

ROW_HALF = ((1, "h"),)  # C registers 2h and 2h + 1 hold row half h (g or g + 8) of the lane's quad


def frag_loop(lw: Lowering, f: Frag, body, *, guard: bool, coords_shape) -> list[str]:
    """Nested unrolled loops over a Frag's registers; ``body(ctx)`` gives the lines for one element."""
    v = lw.frag_var(f)
    lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
             f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll",
             f"for (int ni = 0; ni < {f.tn}; ++ni)", "#pragma unroll", f"for (int q = 0; q < {MMA.c.regs}; ++q) {{"]
    ctx = Ctx(f, tuple(coords_shape), tuple(frag_coords(coords_shape)), "[bi][mi][ni][q]", "[bi][mi][q >> 1]")
    inner = guarded(frag_valid(f) if guard else "", body(ctx), "  ")
    row, col = c_index("q")
    return lines + consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * {MMA.m} + {row}"),
                           ("c_", f"{v}n + ni * {MMA.n} + {col}")], inner, "  ") + inner + ["}"]


def rows_loop(lw: Lowering, f: Frag, body, *, guard: bool, coords_shape) -> list[str]:
    """Unrolled loops over the row registers of a Frag (a Rows layout)."""
    v = lw.frag_var(f)
    lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
             f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", "for (int h = 0; h < 2; ++h) {"]
    ctx = Ctx(Rows(f), tuple(coords_shape), tuple(frag_coords(coords_shape)), "[bi][mi][h]")
    inner = guarded(rows_valid(f) if guard else "", body(ctx), "  ")
    row = c_index(ROW_HALF)[0]
    return lines + consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * {MMA.m} + {row}"), ("c_", "0")],
                          inner, "  ") + inner + ["}"]


def frag_coords(shape) -> list[str]:
    batch = shape[:-2]
    return unravel("b_", batch) + ["r_" if shape[-2] > 1 else "0", "c_" if shape[-1] > 1 else "0"]


def frag_valid(f: Frag) -> str:
    parts = []
    if f.batch_guard:
        parts.append(f"b_ < {f.batch}")
    if f.row_guard:
        parts.append(f"r_ < {f.m}")
    if f.col_guard:
        parts.append(f"c_ < {f.n}")
    return " && ".join(parts)


def rows_valid(f: Frag) -> str:
    parts = []
    if f.batch_guard:
        parts.append(f"b_ < {f.batch}")
    if f.row_guard:
        parts.append(f"r_ < {f.m}")
    return " && ".join(parts)


def spread_loop(lw: Lowering, s: Spread, shape, body, *, guard: bool) -> list[str]:
    gid, _ = lw.group_var(s.group)
    lines = ["#pragma unroll", f"for (int s = 0; s < {s.slots}; ++s) {{"]
    ctx = Ctx(s, tuple(shape), tuple(unravel("o_", shape)), "[s]")
    inner = guarded(f"o_ < {s.size}" if guard and s.guard else "", body(ctx), "  ")
    return lines + consts([("o_", f"s * {s.groups} + {gid}")], inner, "  ") + inner + ["}"]


def plain_loop(lw: Lowering, shape, body, *, index: str = "e_") -> list[str]:
    """Every thread strides over the elements of ``shape``."""
    n = prod(shape)
    trips = ceil_div(n, lw.T)
    ctx = Ctx(None, tuple(shape), tuple(unravel(index, shape)))
    cond = f"{index} < {n}" if n % lw.T else ""
    inner = offsets.hoist_strided(body(ctx), lw.thread_bases, lw.T, trips, n, index)
    used = re.search(rf"\b{index}\b", "\n".join(inner + [cond]))
    lines = ["#pragma unroll 4" if trips > 4 else "#pragma unroll", f"for (int i_ = 0; i_ < {trips}; ++i_) {{"]
    lines += [f"  const int {index} = tid + i_ * {lw.T};"] if used else []
    return lines + guarded(cond, inner, "  ") + ["}"]


def layout_loop(lw: Lowering, layout, shape, body, *, guard: bool = True) -> list[str]:
    if isinstance(layout, Frag):
        return frag_loop(lw, layout, body, guard=guard, coords_shape=shape)
    if isinstance(layout, Rows):
        return rows_loop(lw, layout.frag, body, guard=guard, coords_shape=shape)
    return spread_loop(lw, layout, shape, body, guard=guard)


def slot_index(layout) -> str:
    """Inside ``layout_loop``: the flat index of the current register among the thread's ``prod(dims)``."""
    names = {Frag: ("bi", "mi", "ni", "q"), Rows: ("bi", "mi", "h")}.get(type(layout), ("s",))
    index = names[0]
    for name, extent in zip(names[1:], layout.dims[1:]):
        index = f"({index}) * {extent} + {name}" if "+" in index else f"{index} * {extent} + {name}"
    return index


def probe_ctx(layout, shape) -> Ctx:
    """A context with the layout's slot names, for deciding what needs materialising."""
    if isinstance(layout, Frag):
        return Ctx(layout, tuple(shape), tuple(frag_coords(shape)), "[bi][mi][ni][q]", "[bi][mi][q >> 1]")
    if isinstance(layout, Rows):
        return Ctx(layout, tuple(shape), tuple(frag_coords(shape)), "[bi][mi][h]")
    return Ctx(layout, tuple(shape), tuple(unravel("o_", shape)), "[s]")


def store_lines(lw: Lowering, p: Reg, shape, write) -> list[str]:
    """Each element of a register value written once (one replica of rows and groups writes)."""
    lay = p.layout
    if isinstance(lay, Frag):
        return frag_loop(lw, lay, lambda ctx: [write(ctx, p.var + ctx.slot)], guard=True, coords_shape=shape)
    if isinstance(lay, Rows):
        f = lay.frag
        cond = ["t4_ == 0"] + ([f"warp % {f.wn} == 0"] if f.wn > 1 else [])
        valid = rows_valid(f)
        if valid:
            cond.append(valid)
        return rows_loop(lw, f, lambda ctx: guarded(" && ".join(cond), [write(ctx, p.var + ctx.slot)], ""),
                         guard=False, coords_shape=shape)
    _, gl = lw.group_var(lay.group)

    def body(ctx):
        line = [write(ctx, p.var + ctx.slot)]
        return guarded(f"{gl} == 0", line, "") if lay.group > 1 else line
    return spread_loop(lw, lay, shape, body, guard=True)


def thread_stride(lw: Lowering, n: int, body, note: str) -> list[str]:
    """``body(e)`` for e = tid, tid + T, ... below ``n`` (copies: at most 8 trips unrolled)."""
    trips = ceil_div(n, lw.T)
    e = "e_"
    inner = body(e)
    cond = f"{e} < {n}" if n % lw.T else ""
    used = re.search(rf"\b{e}\b", "\n".join(inner + [cond]))   # a hoisted body indexes by the trip alone
    lines = [f"// {note}", "#pragma unroll" if trips <= 8 else "#pragma unroll 8",
             f"for (int i_ = 0; i_ < {trips}; ++i_) {{"] + ([f"  const int {e} = tid + i_ * {lw.T};"] if used else [])
    return lines + guarded(cond, inner, "  ") + ["}"]


# ---- small C-text helpers ------------------------------------------------------------------------------------------


def consts(defs, using: list[str], indent: str) -> list[str]:
    """``const int`` definitions of the names (in order) that ``using`` mentions."""
    text = "\n".join(using)
    used = [f"{name} = {expr}" for name, expr in defs if re.search(rf"\b{name}\b", text)]
    return [f"{indent}const int {', '.join(used)};"] if used else []


def guarded(cond: str, lines: list[str], indent: str) -> list[str]:
    if not cond:
        return [indent + line for line in lines]
    if len(lines) == 1:
        return [f"{indent}if ({cond}) {lines[0]}"]
    return [f"{indent}if ({cond}) {{"] + [indent + "  " + line for line in lines] + [f"{indent}}}"]


def dims(layout) -> str:
    return "".join(f"[{d}]" for d in layout.dims)


def fill(var: str, layout, value: str) -> list[str]:
    """Every register of ``var`` set to ``value``."""
    idx = "".join(f"[i{k}]" for k in range(len(layout.dims)))
    return _nest(layout.dims) + ["  " * len(layout.dims) + f"{var}{idx} = {value};"]


def copy_regs(dst: str, src: str, layout) -> list[str]:
    """``dst = src`` register by register."""
    idx = "".join(f"[i{k}]" for k in range(len(layout.dims)))
    return _nest(layout.dims) + ["  " * len(layout.dims) + f"{dst}{idx} = {src}{idx};"]


def _nest(extents) -> list[str]:
    lines = []
    for k, d in enumerate(extents):
        lines += ["  " * k + "#pragma unroll", "  " * k + f"for (int i{k} = 0; i{k} < {d}; ++i{k})"]
    return lines


def row_major(shape) -> tuple:
    strides, s = [], 1
    for d in reversed(tuple(shape)):
        strides.append(s)
        s *= d
    return tuple(reversed(strides))
