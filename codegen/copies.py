"""Global -> shared copies and the cp.async pipeline: each input tile's buffer and layout (swizzled when ldmatrix
reads it), the prologue's copies of invariant tiles and the first stages, and the loop's prefetch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mugraph.codegen import hopper_pipeline, loops, offsets
from mugraph.codegen import render as R
from mugraph.codegen.kernel_ir import InputView, Step
from mugraph.codegen.layouts import TileLayout, mma_tile, plain_tile, prod, round_up, strided, unravel
from mugraph.codegen.placement import Tile
from mugraph.codegen.values import tile_bcr
from mugraph.ir.block import AXES
from mugraph.ir.ops import BOp
from mugraph.ir.shapes import mma_dtype

if TYPE_CHECKING:
    from mugraph.codegen.lower import Lowering

CHUNK = 16  # bytes per cp.async / ldmatrix row


def mma_uses(order) -> dict:
    """For each input node used directly as an mma operand: the roles (A, B) its tile layout serves."""
    uses: dict = {}
    for n in order:
        if n.op is not BOp.MATMUL:
            continue
        dt = mma_dtype(n.srcs[0].dtype, n.srcs[1].dtype)
        for role, src in zip("AB", n.srcs):
            if src.op is BOp.INPUT and src.dtype is dt and dt.is_16bit and src.shape[-1] % 8 == 0 \
                    and src.rank >= 2:
                uses.setdefault(src, set()).add(role)
    return uses


def lower_inputs(lw: Lowering) -> None:
    """Places every input tile and emits the prologue's copies; the loop's copies are left in ``lw.loop_copy``
    (or, on sm_90a's path, to the TMA pipeline's producer: ``hopper_pipeline``)."""
    inv_lines, stage_lines, loop_lines, loop_scalar, pad_lines = [], {}, [], [], []
    inv_writes, stage_writes, pad_writes = set(), set(), set()
    lw.stage_bufs = []
    by_tma = hopper_pipeline.tma_inputs(lw)
    for node, view in zip(lw.g.inputs, lw.inputs):
        spec = node.arg
        tile = tuple(spec.tile_shape)
        looped = spec.fmap is not None
        stages = lw.stages if looped else 1
        roles = lw.mma_use.get(node, set())
        batch, rows, cols = prod(tile[:-2]), (tile[-2] if len(tile) > 1 else 1), tile[-1]
        rows_p = round_up(rows, 16) if "B" in roles else rows
        cols_p = round_up(cols, 16) if "A" in roles else cols
        size = spec.dtype.itemsize
        swizzled = hopper_pipeline.swizzled_layout(tile, size, roles) if (node in by_tma or (roles and lw.hopper)) \
            else None  # the layout TMA lands and wgmma / ldmatrix read
        layout = swizzled or (mma_tile(batch, rows_p, cols_p, size) if roles else plain_tile(batch, rows, cols, size))
        if swizzled:
            rows_p, cols_p = rows, cols
        ctype = R.DTYPE_C[spec.dtype].storage
        buf = lw.buffer("tile", layout.nbytes * stages, f"input {spec.index} tile {list(tile)}"
                        + (f" x {stages} stages" if stages > 1 else "") + (" (TMA)" if node in by_tma else ""),
                        ctype=ctype, layout=layout, stages=stages, ldmatrix=bool(roles),
                        align=layout.matrix.mode.period if swizzled else 0)
        base = input_base(lw, spec, view, buf)
        ptr = buf
        if looped and stages > 1:
            ptr = f"{buf}c"
            lw.loop_head.append(f"MG_SPTR({ctype}) const {buf}c = {buf} + it % {stages} * {layout.elems};")
        lw.place[node] = Tile(buf, ptr, layout, spec.dtype, tile)
        if rows_p != rows or cols_p != cols:
            pad_lines += pad_tile(lw, buf, layout, rows, cols, stages)
            pad_writes.add(buf)
        if node in by_tma:
            lw.tma_tiles.append(hopper_pipeline.tma_tile(lw, node, view, buf, layout))
            lw.stage_bufs.append(buf)
        elif looped:
            for k in range(max(1, stages - 1)):
                dst = f"({buf} + {k * layout.elems})" if k else buf
                stage_lines.setdefault(k, []).extend(copy_lines(lw, spec, view, dst, layout, base, str(k))[0])
            stage_writes.add(buf)
            lw.stage_bufs.append(buf)
            nxt = f"({buf} + (it + {stages - 1}) % {stages} * {layout.elems})"
            lines, vector = copy_lines(lw, spec, view, nxt, layout, base, "itn", "nbytes")
            (loop_lines if vector else loop_scalar).extend(lines)
        else:
            inv_lines += copy_lines(lw, spec, view, buf, layout, base, None)[0]
            inv_writes.add(buf)
    if pad_lines:
        lw.emit(Step("", pad_lines, writes=pad_writes, note="zero the padding of mma tiles"), "pro")
    group = 0
    if inv_lines:
        lw.emit(Step("", inv_lines + ["mg_cp_async_commit();"], writes=inv_writes, group=group,
                     note="loop-invariant input tiles"), "pro")
        group += 1
    for k, lines in sorted(stage_lines.items()):
        # each stage is its own byte range ("buf#k"): copies of later stages need not wait for earlier ones
        lw.emit(Step("", lines + ["mg_cp_async_commit();"], writes={f"{b}#{k}" for b in stage_writes},
                     group=group, note=f"stage {k} of the loop's input tiles"), "pro")
        group += 1
    lw.loop_copy = (loop_lines, loop_scalar)
    if by_tma:
        hopper_pipeline.start(lw)


def emit_prefetch(lw: Lowering) -> None:
    """The loop's first step: issue the copies of iteration it + stages - 1."""
    vector, scalar = lw.loop_copy
    if not (vector or scalar) or lw.stages <= 1:
        return
    # No branch around the copies: a guarded prefetch makes NVVM unroll the whole loop. The last
    # prefetches read nothing (zero-filling copies of 0 bytes from a clamped, valid address).
    a, f = lw.stages - 1, lw.F
    lines = [f"const int itn = it + {a} < {f} ? it + {a} : {f - 1}, nbytes = it + {a} < {f} ? 16 : 0;"]
    lines += vector
    if scalar:
        lines += [f"if (it + {a} < {f}) {{"] + ["  " + x for x in scalar] + ["}"]
    lines.append("mg_cp_async_commit();")
    lw.emit(Step("", lines, note=f"prefetch the input tiles of iteration it + {a}"))


def input_base(lw: Lowering, spec, view: InputView, buf: str) -> str:
    """A kernel-scope variable: the element offset of this block's tile in the input's buffer."""
    terms = []
    for axis, dim in enumerate(spec.imap):
        bid = lw.bid(AXES[axis])
        if dim is not None and bid != "0":
            terms += _origin(f"{bid}", spec.shape[dim] // spec.grid[axis], view, dim)
    if lw.splits > 1 and spec.fmap is not None:  # this CTA's share of the loop starts lw.F iterations in
        terms += _origin("sp_", lw.F * spec.tile_shape[spec.fmap], view, spec.fmap)
    if view.offset:  # a slice's window starts inside its buffer
        terms.append(f"{view.offset}LL")
    name = f"{buf}g"
    lw.kernel_decls.append(f"const long long {name} = {' + '.join(terms) or '0'};  // block's tile origin")
    return name


def _origin(index: str, extent: int, view: InputView, dim: int) -> list[str]:
    """The offset term of a tile origin ``index * extent`` along ``dim``; on a repeated dim (``view.repeats``)
    the source element is the origin divided by the repeat."""
    r, stride = view.repeats[dim], view.strides[dim]
    if not stride:
        return []
    if r == 1:
        return [f"(long long){index} * {extent * stride}"]
    return [f"(long long)({index} * {extent} / {r}) * {stride}"]


def source_coords(coords, tile, view: InputView) -> list:
    """Tile coordinates as source coordinates: a repeated dim's tile holds whole repeats (its coordinate divided
    by the repeat) or lies inside one (every element reads the origin's)."""
    return [c if r == 1 else f"({c}) / {r}" if t % r == 0 else "0"
            for c, t, r in zip(coords, tile, view.repeats)]


def copy_lines(lw: Lowering, spec, view: InputView, dst: str, layout: TileLayout, base: str, it: str | None,
               nbytes: str | None = None):
    """Global -> shared for one tile (one stage): 16-byte cp.async where rows allow, else scalar loads.
    ``nbytes``: a C expression, 16 or 0 (a zero-filling cp.async that reads nothing). Returns the lines and
    whether they are cp.async (asynchronous) copies."""
    tile = tuple(spec.tile_shape)
    size = spec.dtype.itemsize
    chunk = CHUNK // size
    src = view.param
    offset = base
    if spec.fmap is not None and it is not None and it != "0":
        step = _origin(it, tile[spec.fmap], view, spec.fmap)
        if step:
            offset = f"{base} + {step[0]}"
    rows_shape = tile[:-1]
    cols = tile[-1]
    if view.iota is not None:
        return iota_lines(lw, spec, view, dst, layout, offset), False
    vector = view.strides[-1] == 1 and view.repeats[-1] == 1 and (cols * size) % CHUNK == 0 and \
        all((s * size) % CHUNK == 0 for s in view.strides[:-1]) and (view.offset * size) % CHUNK == 0
    if vector:
        per_row = cols // chunk
        n = prod(rows_shape) * per_row

        def indices(e):
            coords = unravel(f"{e} / {per_row}" if per_row > 1 else e, rows_shape) + \
                [f"{e} % {per_row} * {chunk}" if per_row > 1 else "0"]
            b, r, c = tile_bcr(tile, coords)
            return layout.index(b, r, c), strided(source_coords(coords, tile, view), view.strides)

        hoisted = _hoisted_copy(lw, n, indices, (src, R.DTYPE_C[spec.dtype].storage), base, offset, dst, nbytes)
        if hoisted:
            return hoisted, True

        def body(e):
            s, g = indices(e)
            if nbytes:
                return [f"mg_cp_async16_zfill(&{dst}[{s}], {src} + ({offset} + {g}), {nbytes});"]
            return [f"mg_cp_async16(&{dst}[{s}], {src} + ({offset} + {g}));"]
        return loops.thread_stride(lw, n, body, f"cp.async {n} x 16 B"), True

    def scalar(e):
        coords = unravel(e, tile)
        b, r, c = tile_bcr(tile, coords)
        return [f"{dst}[{layout.index(b, r, c)}] = {src}[{offset} + "
                f"{strided(source_coords(coords, tile, view), view.strides)}];"]
    return loops.thread_stride(lw, prod(tile), scalar, "scalar loads (rows not 16-byte chunks or strided)"), False


def _hoisted_copy(lw: Lowering, n: int, indices, source: tuple, base: str, offset: str, dst: str,
                  nbytes: str | None):
    """The copy loop with each thread's shared and global offsets computed once, before the main loop
    (``offsets``), where both advance by a constant per unrolled trip; None where they do not. Inside the main
    loop a trip then computes one stage pointer and one source offset, and each copy adds constants."""
    trips = -(-n // lw.T)
    s, g = indices("e_")
    ds, dg = (offsets.trip_stride(x, "e_", lw.T, trips, n) for x in (s, g))
    if ds is None or dg is None or trips > 8:   # (more trips: a rolled loop, whose counter is not a constant)
        return None
    src = base[:-1]                               # "{buf}g": the tile's block origin
    for decl in (f"const int {src}t = {offsets.at_thread(s, 'e_')};  // this thread's first chunk",
                 f"const long long {src}e = {base} + {offsets.at_thread(g, 'e_')};"):
        if decl not in lw.kernel_decls:
            lw.kernel_decls.append(decl)
    step = offset[len(base):]                     # " + (long long)itn * ..." or ""
    param, ctype = source
    origin = f"{src}o" if step else f"{src}e"
    lines = [f"MG_SPTR({ctype}) const {src}d = {dst} + {src}t;"] + \
        ([f"const long long {src}o = {src}e{step};"] if step else [])

    def body(e):
        to = f"{src}d[i_ * {ds}]" if ds else f"{src}d[0]"
        at = f"{param} + ({origin} + i_ * {dg})" if dg else f"{param} + {origin}"
        if nbytes:
            return [f"mg_cp_async16_zfill(&{to}, {at}, {nbytes});"]
        return [f"mg_cp_async16(&{to}, {at});"]
    return ["{"] + ["  " + x for x in lines + loops.thread_stride(lw, n, body, f"cp.async {n} x 16 B")] + ["}"]


def iota_lines(lw: Lowering, spec, view: InputView, dst: str, layout: TileLayout, offset: str) -> list[str]:
    """An index tile computed from the element offsets its loads would use: no global memory is read."""
    tile = tuple(spec.tile_shape)
    stride, extent = view.iota
    store = R.DTYPE_C[spec.dtype].store

    def body(e):
        coords = unravel(e, tile)
        b, r, c = tile_bcr(tile, coords)
        index = f"({offset} + {strided(coords, view.strides)}) / {stride} % {extent}"
        return [f"{dst}[{layout.index(b, r, c)}] = {store.format(f'(float)({index})')};"]
    return loops.thread_stride(lw, prod(tile), body, "index values (an iota: computed, not loaded)")


def pad_tile(lw: Lowering, buf, layout: TileLayout, rows, cols, stages) -> list[str]:
    """Zeros in the padding an mma tile has beyond the input's rows and columns (every stage)."""
    shape = (stages * layout.batch, layout.rows, layout.cols)

    def body(ctx):
        b, r, c = ctx.coords  # b counts matrices over all stages
        index = layout.index("0", r, c) if b == "0" else f"{b} * {layout.matrix_elems} + {layout.index('0', r, c)}"
        return [f"if ({r} >= {rows} || {c} >= {cols}) {buf}[{index}] = 0;"]
    return loops.plain_loop(lw, shape, body)
