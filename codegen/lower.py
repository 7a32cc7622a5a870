"""Lowering: one block graph becomes the steps of one CUDA kernel, each step a piece of C with the shared buffers
it reads and writes.

Where each value lives decides everything:

* input tiles: shared memory, copied by 16-byte cp.async (scalar loads where rows are not 16-byte multiples or
  the tensor is a strided view); loop-walked tiles double-buffered, ldmatrix-fed tiles swizzled;
* a block matmul: mma.sync fragments in registers (``Frag``), operands read by ldmatrix from input tiles or from
  16-bit staging buffers (computed values, rounded to the mma dtype), or straight from the registers of a
  previous product (its C fragments are the next product's A fragments);
* elementwise ops on a register value: the same registers, computed per element (``Reg``); on values every
  thread can address (tiles, constants, shared buffers): ``Inline``, recomputed inside whatever reads them;
* reductions: per row of a Frag with quad shuffles (``Rows``), else groups of lanes with warp shuffles
  (``Spread``); accumulators: registers in their operand's layout;
* a register value that another layout must read is materialised once as fp32 in shared memory (``Smem``).

The steps go to the shared-memory planner and the renderer (generate.py), which places barriers.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from mugraph.codegen import render as R
from mugraph.codegen.arch import ArchSpec
from mugraph.codegen.layouts import (WARP, Frag, Rows, Spread, TileLayout, broadcast, ceil_div, choose_frag,
                                     linear, mma_tile, plain_tile, prod, reduce_group, round_up, strided,
                                     unravel)
from mugraph.ir.block import AXES, BlockGraph, Phase
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.node import BNode
from mugraph.ir.ops import ACCUMULATORS, BLOCK_REDUCE, BOp, RESCALE_ACCUMULATORS, TOp
from mugraph.ir.shapes import mma_dtype

F32 = DType.FLOAT32
CHUNK = 16  # bytes per cp.async / ldmatrix row
REG_SLOTS = 32  # an elementwise accumulator holding more values per thread keeps its state in shared memory


# ---- what the lowering produces -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputView:
    """A kernel parameter as one block input sees it: element strides into the parameter's buffer."""

    param: str
    dtype: DType
    strides: tuple


@dataclass(frozen=True)
class OutputView:
    param: str


@dataclass
class SmemBuffer:
    """One shared-memory buffer before placement."""

    name: str
    nbytes: int             # all stages together
    role: str               # tile | fp32 | operand | scratch
    what: str
    layout: TileLayout | None = None
    stages: int = 1
    ldmatrix: bool = False  # read by ldmatrix (its layout must be conflict-free)


@dataclass
class Step:
    """A piece of kernel code: ``decls`` at the region's scope, ``lines`` in a block of their own."""

    region: str                       # pro | loop | epi
    lines: list
    decls: list = field(default_factory=list)
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)
    group: int | None = None          # cp.async group its writes belong to
    note: str = ""


@dataclass
class KernelIR:
    name: str
    graph: BlockGraph
    params: list                      # (C name, dtype, const)
    buffers: dict
    steps: list
    kernel_decls: list                # index variables, pointers to globals' bases
    acc_decls: list                   # accumulator state, declared before the loop
    loop_head: list                   # stage pointers of this iteration
    stages: int
    has_stage_buffers: bool
    staged_inputs: list               # buffers written by the loop's cp.async issue (excluded from hazards)


# ---- where values live -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    text: str


@dataclass(frozen=True)
class Tile:
    buf: str
    ptr: str
    layout: TileLayout
    dtype: DType
    shape: tuple


@dataclass(frozen=True)
class Smem:
    buf: str
    shape: tuple


@dataclass(frozen=True)
class Inline:
    pass


@dataclass(frozen=True)
class Reg:
    layout: object
    var: str


class Factor:
    """exp(m_prev - m_cur) of a running max: what rescaling accumulators multiply their state by."""

    op = None
    srcs = ()

    def __init__(self, m: BNode):
        self.m = m
        self.shape = m.shape


@dataclass(frozen=True)
class Ctx:
    """Where a loop body stands: its layout (or None for plain strided loops), shape and coordinates, and the
    register index of its own element (``slot``) and of its row (``row_slot``, in a Frag)."""

    layout: object
    shape: tuple
    coords: tuple
    slot: str = ""
    row_slot: str = ""


# ---- the lowering ------------------------------------------------------------------------------------------------


class Lowering:
    """Walks a block graph's phases and emits steps; one instance per kernel."""

    def __init__(self, graph: BlockGraph, name: str, arch: ArchSpec, inputs: list[InputView],
                 outputs: list[OutputView], params: list, stages: int = 2):
        self.g, self.name, self.arch = graph, name, arch
        self.inputs, self.outputs, self.params = inputs, outputs, params
        self.T = graph.threads
        self.W = graph.threads // WARP
        self.F = graph.forloop
        self.phase = graph.phases()
        self.order = graph.nodes
        self.uses = Counter(s for n in self.order for s in n.srcs) + Counter(o.node for o in graph.outputs)
        self.place: dict = {}
        self.buffers: dict[str, SmemBuffer] = {}
        self.steps: list[Step] = []
        self.pending_pro: list[Step] = []     # prologue steps created while lowering later regions
        self.kernel_decls: list[str] = []
        self.acc_decls: list[str] = []
        self.loop_head: list[str] = []
        self.mats: dict = {}
        self.staged: dict = {}
        self.frags: dict[Frag, str] = {}
        self.group_vars: dict[int, str] = {}
        self.acc_state: dict = {}
        self.in_place: set = set()
        self.updated: set = set()
        self.prev: dict = {}
        self.factors: dict = {}
        self.rescaled = {n.srcs[1] for n in self.order if n.op in RESCALE_ACCUMULATORS}
        self.region = "pro"
        self.counter = Counter()
        self.stages = max(1, min(stages, self.F))  # buffers per loop-walked tile; one without a loop
        self.mma_use = self._mma_uses()

    # -- names ---------------------------------------------------------------------------------------------------
    def factor(self, m) -> Factor:
        """The rescale factor of running max ``m`` (one object per max, so it can be placed and materialised)."""
        return self.factors.setdefault(m, Factor(m))

    def fresh(self, prefix: str) -> str:
        self.counter[prefix] += 1
        return f"{prefix}{self.counter[prefix] - 1}"

    def buffer(self, role: str, nbytes: int, what: str, ctype: str = "float", **kw) -> str:
        name = self.fresh("sm")
        self.buffers[name] = SmemBuffer(name, nbytes, role, what, **kw)
        self.kernel_decls.append(f"{ctype}* const {name} = ({ctype}*)(smem + {{off:{name}}});  // {what}")
        return name

    def emit(self, step: Step, region: str | None = None) -> None:
        step.region = region or self.region
        if step.region == "pro" and self.region != "pro":
            self.pending_pro.append(step)
        else:
            self.steps.append(step)

    # -- the walk ------------------------------------------------------------------------------------------------
    def run(self) -> KernelIR:
        self._index_decls()
        self._lower_inputs()
        invariant = [n for n in self.order if self.phase[n] is Phase.INVARIANT]
        loop = [n for n in self.order if self.phase[n] in (Phase.LOOP, Phase.ACCUMULATOR)]
        epilogue = [n for n in self.order if self.phase[n] is Phase.EPILOGUE]
        for n in invariant:
            self.lower(n)
        self.region = "loop"
        vector, scalar = self.loop_copy
        if (vector or scalar) and self.stages > 1:
            # No branch around the copies: a guarded prefetch makes NVVM unroll the whole loop. The last
            # prefetches read nothing (zero-filling copies of 0 bytes from a clamped, valid address).
            a, f = self.stages - 1, self.F
            lines = [f"const int itn = it + {a} < {f} ? it + {a} : {f - 1}, nbytes = it + {a} < {f} ? 16 : 0;"]
            lines += vector
            if scalar:
                lines += [f"if (it + {a} < {f}) {{"] + ["  " + x for x in scalar] + ["}"]
            lines.append("mg_cp_async_commit();")
            self.emit(Step("", lines, note=f"prefetch the input tiles of iteration it + {a}"))
        for n in loop:
            self.lower(n)
        self.region = "epi"
        self.mats = {k: v for k, v in self.mats.items() if k[1] != "running"}
        for n in loop:
            if n.op in ACCUMULATORS:
                self._finalise(n)
        for n in epilogue:
            self.lower(n)
        for i, out in enumerate(self.g.outputs):
            self._store_output(i, out)
        pro = [s for s in self.steps if s.region == "pro"] + self.pending_pro
        rest = [s for s in self.steps if s.region != "pro"]
        return KernelIR(self.name, self.g, self.params, self.buffers, pro + rest, self.kernel_decls,
                        self.acc_decls, self.loop_head, self.stages,
                        bool(self.stage_bufs), self.stage_bufs)

    def lower(self, node) -> None:
        op = node.op
        if op is BOp.INPUT:
            return  # placed by _lower_inputs
        if op is BOp.CONSTANT:
            self.place[node] = Const(R.literal(node.arg[0]))
        elif isinstance(op, TOp):
            self._elementwise(node)
        elif op is BOp.MATMUL:
            self._matmul(node)
        elif op in BLOCK_REDUCE:
            self._reduce(node)
        elif op is BOp.RMS_NORM:
            self._rms_norm(node)
        elif op in ACCUMULATORS:
            self._accumulate(node)
        else:
            raise InvalidGraph(f"the code generator has no rule for block op {op.value}")
        self.updated.add(node)

    def _home(self, node) -> str:
        """The region a materialisation or staging of ``node`` belongs to: invariant values once, up front."""
        if isinstance(node, BNode) and self.phase.get(node) is Phase.INVARIANT:
            return "pro"
        return self.region

    def _version(self, node) -> str:
        if isinstance(node, Factor) or (isinstance(node, BNode) and node.op in ACCUMULATORS and self.region != "epi"):
            return "running"
        return "value"

    # -- kernel-scope declarations -------------------------------------------------------------------------------
    def _index_decls(self) -> None:
        self.kernel_decls += ["const int tid = mg_tid_x(), lane = mg_lane(), warp = mg_warp();",
                              "const int g_ = lane >> 2, t4_ = lane & 3;  // mma fragment row / column pair"]

    def frag_var(self, f: Frag) -> str:
        if f not in self.frags:
            v = f"f{len(self.frags)}"
            self.frags[f] = v
            self.kernel_decls.append(
                f"const int {v}b = warp / {f.wm * f.wn} * {f.tb}, {v}m = warp / {f.wn} % {f.wm} * {f.tm * 16}, "
                f"{v}n = warp % {f.wn} * {f.tn * 8};  // [{f.batch},{f.m},{f.n}] on {f.wb}x{f.wm}x{f.wn} warps")
        return self.frags[f]

    def group_var(self, group: int) -> tuple[str, str]:
        if group == 1:
            return "tid", "0"
        if group not in self.group_vars:
            self.group_vars[group] = f"q{group}"
            self.kernel_decls.append(f"const int q{group}g = tid / {group}, q{group}l = tid % {group};  "
                                     f"// groups of {group} lanes")
        v = self.group_vars[group]
        return f"{v}g", f"{v}l"

    # -- contexts: loops over the elements a thread holds ----------------------------------------------------------
    def frag_loop(self, f: Frag, body, *, guard: bool, coords_shape) -> list[str]:
        """Nested unrolled loops over a Frag's registers; ``body(ctx)`` gives the lines for one element."""
        v = self.frag_var(f)
        lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
                 f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll",
                 f"for (int ni = 0; ni < {f.tn}; ++ni)", "#pragma unroll", "for (int q = 0; q < 4; ++q) {"]
        ctx = Ctx(f, tuple(coords_shape), tuple(self._frag_coords(coords_shape)), "[bi][mi][ni][q]",
                  "[bi][mi][q >> 1]")
        inner = _guarded(self._frag_valid(f) if guard else "", body(ctx), "  ")
        return lines + _consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * 16 + g_ + (q >> 1) * 8"),
                                ("c_", f"{v}n + ni * 8 + t4_ * 2 + (q & 1)")], inner, "  ") + inner + ["}"]

    def rows_loop(self, f: Frag, body, *, guard: bool, coords_shape) -> list[str]:
        v = self.frag_var(f)
        lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
                 f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", "for (int h = 0; h < 2; ++h) {"]
        ctx = Ctx(Rows(f), tuple(coords_shape), tuple(self._frag_coords(coords_shape)), "[bi][mi][h]")
        inner = _guarded(self._rows_valid(f) if guard else "", body(ctx), "  ")
        return lines + _consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * 16 + g_ + h * 8"), ("c_", "0")],
                               inner, "  ") + inner + ["}"]

    def _frag_coords(self, shape) -> list[str]:
        batch = shape[:-2]
        return unravel("b_", batch) + ["r_" if shape[-2] > 1 else "0", "c_" if shape[-1] > 1 else "0"]

    def _frag_valid(self, f: Frag) -> str:
        parts = []
        if f.batch_guard:
            parts.append(f"b_ < {f.batch}")
        if f.row_guard:
            parts.append(f"r_ < {f.m}")
        if f.col_guard:
            parts.append(f"c_ < {f.n}")
        return " && ".join(parts)

    def _rows_valid(self, f: Frag) -> str:
        parts = []
        if f.batch_guard:
            parts.append(f"b_ < {f.batch}")
        if f.row_guard:
            parts.append(f"r_ < {f.m}")
        return " && ".join(parts)

    def spread_loop(self, s: Spread, shape, body, *, guard: bool) -> list[str]:
        gid, _ = self.group_var(s.group)
        lines = ["#pragma unroll", f"for (int s = 0; s < {s.slots}; ++s) {{"]
        ctx = Ctx(s, tuple(shape), tuple(unravel("o_", shape)), "[s]")
        inner = _guarded(f"o_ < {s.size}" if guard and s.guard else "", body(ctx), "  ")
        return lines + _consts([("o_", f"s * {s.groups} + {gid}")], inner, "  ") + inner + ["}"]

    def plain_loop(self, shape, body, *, index: str = "e_") -> list[str]:
        """Every thread strides over the elements of ``shape``."""
        n = prod(shape)
        trips = ceil_div(n, self.T)
        lines = ["#pragma unroll 4" if trips > 4 else "#pragma unroll",
                 f"for (int i_ = 0; i_ < {trips}; ++i_) {{", f"  const int {index} = tid + i_ * {self.T};"]
        ctx = Ctx(None, tuple(shape), tuple(unravel(index, shape)))
        cond = f"{index} < {n}" if n % self.T else ""
        return lines + _guarded(cond, body(ctx), "  ") + ["}"]

    def layout_loop(self, layout, shape, body, *, guard: bool = True) -> list[str]:
        if isinstance(layout, Frag):
            return self.frag_loop(layout, body, guard=guard, coords_shape=shape)
        if isinstance(layout, Rows):
            return self.rows_loop(layout.frag, body, guard=guard, coords_shape=shape)
        return self.spread_loop(layout, shape, body, guard=guard)

    # -- reading values ------------------------------------------------------------------------------------------
    def _child_mode(self, child, ctx: Ctx, mode):
        if mode == "own" and tuple(child.shape) == ctx.shape:
            return "own"
        if mode in ("own", "row") and isinstance(ctx.layout, Frag) and \
                tuple(child.shape) == ctx.shape[:-1] + (1,):
            return "row"
        return None

    def _reg_expr(self, p: Reg, ctx: Ctx, mode) -> str | None:
        if mode == "own" and p.layout == ctx.layout:
            return p.var + ctx.slot
        if mode == "row" and isinstance(p.layout, Rows) and p.layout.frag == ctx.layout:
            return p.var + ctx.row_slot
        return None

    def read(self, node, ctx: Ctx) -> str:
        """The fp32 value of ``node`` at the context's element (broadcast)."""
        coords = broadcast(node.shape, ctx.shape, ctx.coords)
        return self._read(node, coords, self._child_mode(node, ctx, "own"), ctx)

    def _read(self, node, coords, mode, ctx: Ctx) -> str:
        p = self.place[node]
        if isinstance(p, Const):
            return p.text
        if isinstance(p, Reg):
            expr = self._reg_expr(p, ctx, mode)
            if expr is not None:
                return expr
            return self._smem_read(self.mats[(node, self._version(node))], coords)
        if isinstance(p, Tile):
            return self._tile_read(p, coords)
        if isinstance(p, Smem):
            return self._smem_read(p, coords)
        return self._inline(node, coords, mode, ctx)

    def _inline(self, node, coords, mode, ctx) -> str:
        if node.op is BOp.RMS_NORM:
            x = node.srcs[0]
            rcoords = list(coords)
            rcoords[node.arg[0]] = "0"
            r = self._smem_read(self.mats[(node, "rms")], rcoords)
            return f"({self._read(x, coords, self._child_mode(x, ctx, mode), ctx)} * {r})"
        args = []
        for s in node.srcs:
            c = broadcast(s.shape, node.shape, coords)
            args.append(self._read(s, c, self._child_mode(s, ctx, mode), ctx))
        return R.elementwise(node.op, args, node.arg)

    def _tile_read(self, t: Tile, coords) -> str:
        b, r, c = self._tile_bcr(t.shape, coords)
        return R.DTYPE_C[t.dtype].load.format(f"{t.ptr}[{t.layout.index(b, r, c)}]")

    @staticmethod
    def _tile_bcr(shape, coords):
        batch = linear(coords[:-2], shape[:-2]) if len(shape) > 2 else "0"
        row = coords[-2] if len(shape) > 1 else "0"
        return batch, row, coords[-1]

    def _smem_read(self, m: Smem, coords) -> str:
        return f"{m.buf}[{linear(coords, m.shape)}]"

    def reads_of(self, node, ctx: Ctx) -> set[str]:
        """The shared buffers reading ``node`` in ``ctx`` touches."""
        return self._reads(node, self._child_mode(node, ctx, "own"), ctx)

    def _reads(self, node, mode, ctx) -> set[str]:
        p = self.place[node]
        if isinstance(p, Const):
            return set()
        if isinstance(p, Reg):
            if self._reg_expr(p, ctx, mode) is not None:
                return set()
            return {self.mats[(node, self._version(node))].buf}
        if isinstance(p, (Tile, Smem)):
            return {p.buf}
        out = set()
        if node.op is BOp.RMS_NORM:
            out.add(self.mats[(node, "rms")].buf)
        for s in node.srcs:
            out |= self._reads(s, self._child_mode(s, ctx, mode), ctx)
        return out

    def ensure(self, node, ctx: Ctx) -> None:
        """Materialise whatever ``node`` needs that the context cannot read from registers."""
        self._ensure(node, self._child_mode(node, ctx, "own"), ctx)

    def _ensure(self, node, mode, ctx) -> None:
        p = self.place[node]
        if isinstance(p, Reg):
            if self._reg_expr(p, ctx, mode) is None:
                self.materialise(node)
        elif isinstance(p, Inline):
            for s in node.srcs:
                self._ensure(s, self._child_mode(s, ctx, mode), ctx)

    def addressable(self, node) -> None:
        """Make ``node`` readable by any thread at any coordinate."""
        self.ensure(node, Ctx(None, tuple(node.shape), tuple(["0"] * len(node.shape))))

    def reads_plain(self, node, shape) -> set[str]:
        return self.reads_of(node, Ctx(None, tuple(shape), tuple(["0"] * len(shape))))

    def materialise(self, node) -> None:
        """Write a register value to an fp32 shared buffer (once per version and region)."""
        key = (node, self._version(node))
        if key in self.mats:
            return
        p: Reg = self.place[node]
        shape = tuple(node.shape)
        buf = self.buffer("fp32", 4 * prod(shape), f"{_describe(node)} (fp32)")
        smem = Smem(buf, shape)
        lines = self.store_lines(p, shape, lambda ctx, v: f"{buf}[{linear(ctx.coords, shape)}] = {v};")
        self.emit(Step("", lines, writes={buf}, note=f"{_describe(node)} -> shared"), self._home(node))
        self.mats[key] = smem

    def store_lines(self, p: Reg, shape, write) -> list[str]:
        """Each element of a register value written once (one replica of rows and groups writes)."""
        lay = p.layout
        if isinstance(lay, Frag):
            return self.frag_loop(lay, lambda ctx: [write(ctx, p.var + ctx.slot)], guard=True, coords_shape=shape)
        if isinstance(lay, Rows):
            f = lay.frag
            cond = ["t4_ == 0"] + ([f"warp % {f.wn} == 0"] if f.wn > 1 else [])
            valid = self._rows_valid(f)
            if valid:
                cond.append(valid)
            return self.rows_loop(f, lambda ctx: _guarded(" && ".join(cond), [write(ctx, p.var + ctx.slot)], ""),
                                  guard=False, coords_shape=shape)
        _, gl = self.group_var(lay.group)

        def body(ctx):
            line = [write(ctx, p.var + ctx.slot)]
            return _guarded(f"{gl} == 0", line, "") if lay.group > 1 else line
        return self.spread_loop(lay, shape, body, guard=True)

    # -- input tiles ---------------------------------------------------------------------------------------------
    def _mma_uses(self) -> dict:
        """For each input node used directly as an mma operand: the padding its tile layout needs."""
        uses: dict = {}
        for n in self.order:
            if n.op is not BOp.MATMUL:
                continue
            dt = mma_dtype(n.srcs[0].dtype, n.srcs[1].dtype)
            for role, src in zip("AB", n.srcs):
                if src.op is BOp.INPUT and src.dtype is dt and dt.is_16bit and src.shape[-1] % 8 == 0 \
                        and src.rank >= 2:
                    uses.setdefault(src, set()).add(role)
        return uses

    def _lower_inputs(self) -> None:
        inv_lines, stage_lines, loop_lines, loop_scalar, pad_lines = [], {}, [], [], []
        inv_writes, stage_writes, pad_writes = set(), set(), set()
        self.stage_bufs: list[str] = []
        for node, view in zip(self.g.inputs, self.inputs):
            spec = node.arg
            tile = tuple(spec.tile_shape)
            looped = spec.fmap is not None
            stages = self.stages if looped else 1
            roles = self.mma_use.get(node, set())
            batch, rows, cols = prod(tile[:-2]), (tile[-2] if len(tile) > 1 else 1), tile[-1]
            rows_p = round_up(rows, 16) if "B" in roles else rows
            cols_p = round_up(cols, 16) if "A" in roles else cols
            size = spec.dtype.itemsize
            layout = mma_tile(batch, rows_p, cols_p, size) if roles else plain_tile(batch, rows, cols, size)
            ctype = R.DTYPE_C[spec.dtype].storage
            buf = self.buffer("tile", layout.nbytes * stages, f"input {spec.index} tile {list(tile)}"
                              + (f" x {stages} stages" if stages > 1 else ""), ctype=ctype, layout=layout,
                              stages=stages, ldmatrix=bool(roles))
            base = self._input_base(spec, view, buf)
            ptr = buf
            if looped and stages > 1:
                ptr = f"{buf}c"
                self.loop_head.append(f"{ctype}* const {buf}c = {buf} + it % {stages} * {layout.elems};")
            self.place[node] = Tile(buf, ptr, layout, spec.dtype, tile)
            if rows_p != rows or cols_p != cols:
                pad_lines += self._pad_lines(buf, layout, rows, cols, stages)
                pad_writes.add(buf)
            if looped:
                for k in range(max(1, stages - 1)):
                    dst = f"({buf} + {k * layout.elems})" if k else buf
                    stage_lines.setdefault(k, []).extend(self._copy_lines(spec, view, dst, layout, base, str(k))[0])
                stage_writes.add(buf)
                self.stage_bufs.append(buf)
                nxt = f"({buf} + (it + {stages - 1}) % {stages} * {layout.elems})"
                lines, vector = self._copy_lines(spec, view, nxt, layout, base, "itn", "nbytes")
                (loop_lines if vector else loop_scalar).extend(lines)
            else:
                inv_lines += self._copy_lines(spec, view, buf, layout, base, None)[0]
                inv_writes.add(buf)
        if pad_lines:
            self.emit(Step("", pad_lines, writes=pad_writes, note="zero the padding of mma tiles"), "pro")
        group = 0
        if inv_lines:
            self.emit(Step("", inv_lines + ["mg_cp_async_commit();"], writes=inv_writes, group=group,
                           note="loop-invariant input tiles"), "pro")
            group += 1
        for k, lines in sorted(stage_lines.items()):
            # each stage is its own byte range ("buf#k"): copies of later stages need not wait for earlier ones
            self.emit(Step("", lines + ["mg_cp_async_commit();"], writes={f"{b}#{k}" for b in stage_writes},
                           group=group,
                           note=f"stage {k} of the loop's input tiles"), "pro")
            group += 1
        self.loop_copy = (loop_lines, loop_scalar)

    def _input_base(self, spec, view: InputView, buf: str) -> str:
        terms = []
        for axis, dim in enumerate(spec.imap):
            if dim is not None:
                step = spec.shape[dim] // spec.grid[axis] * view.strides[dim]
                if step:
                    terms.append(f"(long long)mg_bid_{AXES[axis]}() * {step}")
        name = f"{buf}g"
        self.kernel_decls.append(f"const long long {name} = {' + '.join(terms) or '0'};  // block's tile origin")
        return name

    def _copy_lines(self, spec, view: InputView, dst: str, layout: TileLayout, base: str, it: str | None,
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
            step = tile[spec.fmap] * view.strides[spec.fmap]
            if step:
                offset = f"{base} + (long long){it} * {step}"
        rows_shape = tile[:-1]
        cols = tile[-1]
        vector = view.strides[-1] == 1 and (cols * size) % CHUNK == 0 and \
            all((s * size) % CHUNK == 0 for s in view.strides[:-1])
        if vector:
            per_row = cols // chunk
            n = prod(rows_shape) * per_row

            def body(e):
                coords = unravel(f"{e} / {per_row}" if per_row > 1 else e, rows_shape) + \
                    [f"{e} % {per_row} * {chunk}" if per_row > 1 else "0"]
                b, r, c = self._tile_bcr(tile, coords)
                g = strided(coords, view.strides)
                if nbytes:
                    return [f"mg_cp_async16_zfill(&{dst}[{layout.index(b, r, c)}], {src} + ({offset} + {g}), "
                            f"{nbytes});"]
                return [f"mg_cp_async16(&{dst}[{layout.index(b, r, c)}], {src} + ({offset} + {g}));"]
            return self._thread_stride(n, body, f"cp.async {n} x 16 B"), True

        def scalar(e):
            coords = unravel(e, tile)
            b, r, c = self._tile_bcr(tile, coords)
            return [f"{dst}[{layout.index(b, r, c)}] = {src}[{offset} + {strided(coords, view.strides)}];"]
        return self._thread_stride(prod(tile), scalar, "scalar loads (rows not 16-byte chunks or strided)"), False

    def _thread_stride(self, n: int, body, note: str) -> list[str]:
        trips = ceil_div(n, self.T)
        e = "e_"
        lines = [f"// {note}", "#pragma unroll" if trips <= 8 else "#pragma unroll 8",
                 f"for (int i_ = 0; i_ < {trips}; ++i_) {{", f"  const int {e} = tid + i_ * {self.T};"]
        inner = body(e)
        cond = f"{e} < {n}" if n % self.T else ""
        return lines + _guarded(cond, inner, "  ") + ["}"]

    def _pad_lines(self, buf, layout: TileLayout, rows, cols, stages) -> list[str]:
        shape = (stages * layout.batch, layout.rows, layout.cols)
        zero = "0"

        def body(ctx):
            b, r, c = ctx.coords  # b counts matrices over all stages
            index = layout.index("0", r, c) if b == "0" else f"{b} * {layout.matrix_elems} + {layout.index('0', r, c)}"
            return [f"if ({r} >= {rows} || {c} >= {cols}) {buf}[{index}] = {zero};"]
        return self.plain_loop(shape, body)

    # -- elementwise ---------------------------------------------------------------------------------------------
    def _elementwise(self, node) -> None:
        full = [s for s in node.srcs if isinstance(self.place[s], Reg) and tuple(s.shape) == tuple(node.shape)]
        if not full:
            for s in node.srcs:
                self.addressable(s)
            self.place[node] = Inline()
            return
        layout = self.place[full[0]].layout
        var = self.fresh("v")
        probe = self._probe_ctx(layout, node.shape)
        for s in node.srcs:
            self.ensure(s, probe)
        reads = set().union(*(self.reads_of(s, probe) for s in node.srcs))
        self.place[node] = Inline()  # so that read() renders the op itself
        lines = self.layout_loop(layout, node.shape, lambda ctx: [f"{var}{ctx.slot} = {self.read(node, ctx)};"],
                                 guard=bool(reads))
        self.place[node] = Reg(layout, var)
        self.emit(Step("", lines, decls=[f"float {var}{_dims(layout)};"], reads=reads,
                       note=f"{_describe(node)} in registers"))

    def _probe_ctx(self, layout, shape) -> Ctx:
        """A context with the layout's slot names, for deciding what needs materialising."""
        if isinstance(layout, Frag):
            return Ctx(layout, tuple(shape), tuple(self._frag_coords(shape)), "[bi][mi][ni][q]", "[bi][mi][q >> 1]")
        if isinstance(layout, Rows):
            return Ctx(layout, tuple(shape), tuple(self._frag_coords(shape)), "[bi][mi][h]")
        return Ctx(layout, tuple(shape), tuple(unravel("o_", shape)), "[s]")

    # -- matmul --------------------------------------------------------------------------------------------------
    def _matmul(self, node) -> None:
        a, b = node.srcs
        dt = mma_dtype(a.dtype, b.dtype)
        if not dt.is_16bit and self.arch.fp32_matmul == "simt":
            self._simt_matmul(node)
            return
        # fp32 x fp32: three bf16 products of the operands' high and low halves (lo*hi + hi*lo + hi*hi), fp32
        # accumulation: about 2^-16 relative error and fp32's range, on tensor cores.
        parts = [("", "")] if dt.is_16bit else [("lo", "hi"), ("hi", "lo"), ("hi", "hi")]
        dt = dt if dt.is_16bit else DType.BFLOAT16
        shape = tuple(node.shape)
        f = choose_frag(prod(shape[:-2]), shape[-2], shape[-1], self.W)
        acc_node = self._in_place_target(node, f)
        if acc_node is not None:
            var = self._acc_state_var(acc_node, f)
            self.in_place.add(acc_node)
            decls = []
        else:
            var = self.fresh("v")
            decls = [f"float {var}{_dims(f)} = {{}};"]
        lines, reads = [], set()
        if acc_node is not None and acc_node.op in RESCALE_ACCUMULATORS:
            lines += self._rescale_lines(acc_node, Reg(f, var), shape)
            reads |= self._factor_reads(acc_node, f, shape)
        for part_a, part_b in parts:
            a_src = self._operand(a, "A", dt, f, node, part_a)
            b_src = self._operand(b, "B", dt, f, node, part_b)
            reads |= {s[1] for s in (a_src, b_src) if s[0] == "smem"}
            lines += self._mma_lines(node, f, var, a_src, b_src, dt)
        self.place[node] = Reg(f, var)
        how = "tensor cores" if parts == [("", "")] else "tensor cores (fp32 as 3 bf16 products)"
        self.emit(Step("", lines, decls=decls, reads=reads, note=f"{_describe(node)} on {how}"))

    def _in_place_target(self, node, f: Frag):
        """The acc_sum(_rescale) that this loop product feeds alone: the mma accumulates into its registers."""
        if self.phase[node] is not Phase.LOOP or self.uses[node] != 1:
            return None
        users = [n for n in self.order if node in n.srcs]
        if len(users) != 1:
            return None
        acc = users[0]
        if acc.op not in (BOp.ACC_SUM, BOp.ACC_SUM_RESCALE) or acc.srcs[0] is not node:
            return None
        if acc.op is BOp.ACC_SUM_RESCALE and acc.srcs[1] not in self.updated:
            return None
        return acc

    def _operand(self, src, role: str, dt: DType, f: Frag, node, part: str = ""):
        """Where ldmatrix (or the register path) finds operand ``role`` of ``node``; ``part``: the bf16 high
        or low half of an fp32 operand."""
        if part:
            return self._stage(src, role, dt, part)
        p = self.place[src]
        k = node.srcs[0].shape[-1]
        if role == "A" and isinstance(p, Reg) and isinstance(p.layout, Frag) and \
                self._register_a_ok(p.layout, f, src, node, k):
            return ("reg", p.var, p.layout)
        if isinstance(p, Tile) and p.dtype is dt and p.layout.matrix is not None and role in self.mma_use.get(src, ()):
            return ("smem", p.buf, p.ptr, p.layout, src.shape)
        return self._stage(src, role, dt)

    @staticmethod
    def _register_a_ok(fa: Frag, f: Frag, src, node, k: int) -> bool:
        return (fa.wn == 1 and f.wn == 1 and k % 16 == 0 and fa.m == f.m and fa.wb == f.wb and fa.wm == f.wm
                and fa.tb == f.tb and fa.tm == f.tm and tuple(src.shape[:-2]) == tuple(node.shape[:-2])
                and fa.used == f.used)

    def _stage(self, src, role: str, dt: DType, part: str = ""):
        """A 16-bit, ldmatrix-ready copy of ``src`` (rounded to the mma dtype, K padded with zeros)."""
        key = (src, role, dt, part, self._version(src))
        if key in self.staged:
            return self.staged[key]
        shape = tuple(src.shape)
        rows, cols = (shape[-2] if len(shape) > 1 else 1), shape[-1]
        batch = prod(shape[:-2])
        rows_p, cols_p = (rows, round_up(cols, 16)) if role == "A" else (round_up(rows, 16), round_up(cols, 8))
        layout = mma_tile(batch, rows_p, cols_p, 2)
        ctype = R.DTYPE_C[dt]
        convert = R.SPLIT_C[part] if part else ctype.store.format
        buf = self.buffer("operand", layout.nbytes, f"{_describe(src)} as {dt.short}{' ' + part if part else ''} "
                          f"operand {role}", ctype=ctype.storage, layout=layout, ldmatrix=True)
        p = self.place[src]
        if isinstance(p, Reg) and isinstance(p.layout, Frag):
            lines, reads = self._stage_from_frag(src, p, buf, layout, rows, cols, convert)
        else:
            self.addressable(src)
            lines, reads = self._stage_from_smem(src, buf, layout, rows, cols, convert)
        self.emit(Step("", lines, reads=reads, writes={buf}, note=f"stage {_describe(src)} for ldmatrix"),
                  self._home(src))
        result = ("smem", buf, buf, layout, shape)
        self.staged[key] = result
        return result

    def _stage_from_smem(self, src, buf, layout: TileLayout, rows, cols, convert):
        """16 bytes per thread and step: 8 values of one row, rounded, packed, stored at once."""
        shape = tuple(src.shape)
        per_row = layout.cols // 8
        full = (layout.batch, layout.rows, per_row)
        reads = self.reads_plain(src, shape)

        def body(ctx):
            b, r, cc = ctx.coords
            vals = []
            for j in range(8):
                col = f"{cc} * 8 + {j}" if per_row > 1 else str(j)
                coords = unravel(b, shape[:-2]) + ([r] if len(shape) > 1 else []) + [col]
                v = self._read(src, coords, None, Ctx(None, shape, tuple(coords)))
                conds = []
                if layout.cols > cols:
                    conds.append(f"{col} < {cols}")
                if layout.rows > rows:
                    conds.append(f"{r} < {rows}")
                vals.append(f"({' && '.join(conds)} ? {convert(v)} : (unsigned short)0)" if conds
                            else convert(v))
            words = ", ".join(f"mg_pack2({vals[2 * w]}, {vals[2 * w + 1]})" for w in range(4))
            col0 = f"{cc} * 8" if per_row > 1 else "0"
            return [f"*(mg_u32x4*)&{buf}[{layout.index(b, r, col0)}] = mg_u32x4{{{words}}};"]
        return self.plain_loop(full, body), reads

    def _stage_from_frag(self, src, p: Reg, buf, layout: TileLayout, rows, cols, convert):
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
            return _guarded(" && ".join(cond), [f"{buf}[{layout.index('b_', 'r_', 'c_')}] = {v};"], "")
        lines = self.frag_loop(f, body, guard=False, coords_shape=shape)
        cover_r, cover_c = f.wm * f.tm * 16, f.wn * f.tn * 8
        if cover_r < layout.rows or cover_c < layout.cols:  # padding no warp tile reaches: zeros
            def zero(ctx):
                b, r, c = ctx.coords
                return [f"if ({r} >= {cover_r} || {c} >= {cover_c}) {buf}[{layout.index(b, r, c)}] = 0;"]
            lines += self.plain_loop((layout.batch, layout.rows, layout.cols), zero)
        return lines, set()

    def _batch_map(self, operand_shape, out_shape, b: str) -> str:
        ob, ab = tuple(out_shape[:-2]), tuple(operand_shape[:-2])
        if prod(ab) == 1:
            return "0"
        if ab == ob:
            return b
        return linear(broadcast(ab, ob, unravel(b, ob)), ab)

    def _mma_lines(self, node, f: Frag, var: str, a_src, b_src, dt: DType) -> list[str]:
        fv = self.frag_var(f)
        k = node.srcs[0].shape[-1]
        kt = ceil_div(k, 16)
        out_shape = tuple(node.shape)
        mma = R.MMA_C[dt]
        cvt = R.DTYPE_C[dt].store
        body = []
        b_expr = f"{fv}b + bi"
        if f.wb * f.tb > f.batch:
            b_expr = f"({fv}b + bi < {f.batch} ? {fv}b + bi : {f.batch - 1})"
        if a_src[0] == "smem":
            _, _, aptr, alay, ashape = a_src
            body.append(f"const {R.DTYPE_C[dt].storage}* const a_ = {aptr}"
                        + _offset(self._batch_map(ashape, out_shape, "b_"), alay.matrix_elems) + ";")
        _, _, bptr, blay, bshape = b_src
        body.append(f"const {R.DTYPE_C[dt].storage}* const bb_ = {bptr}"
                    + _offset(self._batch_map(bshape, out_shape, "b_"), blay.matrix_elems) + ";")
        body += ["#pragma unroll", f"for (int ks = 0; ks < {kt}; ++ks) {{"]
        inner = [f"unsigned a[{f.tm}][4], b[{f.tn}][2];"]
        if a_src[0] == "reg":
            src = a_src[1]
            inner += ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi) {{",
                      f"  a[mi][0] = mg_pack2({cvt.format(src + '[bi][mi][2 * ks][0]')}, "
                      f"{cvt.format(src + '[bi][mi][2 * ks][1]')});",
                      f"  a[mi][1] = mg_pack2({cvt.format(src + '[bi][mi][2 * ks][2]')}, "
                      f"{cvt.format(src + '[bi][mi][2 * ks][3]')});",
                      f"  a[mi][2] = mg_pack2({cvt.format(src + '[bi][mi][2 * ks + 1][0]')}, "
                      f"{cvt.format(src + '[bi][mi][2 * ks + 1][1]')});",
                      f"  a[mi][3] = mg_pack2({cvt.format(src + '[bi][mi][2 * ks + 1][2]')}, "
                      f"{cvt.format(src + '[bi][mi][2 * ks + 1][3]')});", "}"]
        else:
            row = f"{fv}m + mi * 16 + (lane & 15)"
            if f.wm * f.tm * 16 > alay.rows:
                row = f"({row} < {alay.rows} ? {row} : {alay.rows - 1})"
            inner += ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi)",
                      f"  mg_ldmatrix_x4(a[mi], &a_[{alay.index('0', row, 'ks * 16 + (lane >> 4) * 8')}]);"]
        brow = "ks * 16 + (lane & 15)"
        pairs = f.tn // 2
        if pairs:
            col = f"{fv}n + (2 * nj + (lane >> 4)) * 8"
            if f.wn * f.tn * 8 > blay.cols:
                col = f"({col} < {blay.cols} ? {col} : {blay.cols - 8})"
            inner += ["#pragma unroll", f"for (int nj = 0; nj < {pairs}; ++nj) {{", "  unsigned t[4];",
                      f"  mg_ldmatrix_x4_trans(t, &bb_[{blay.index('0', brow, col)}]);",
                      "  b[2 * nj][0] = t[0], b[2 * nj][1] = t[1], b[2 * nj + 1][0] = t[2], b[2 * nj + 1][1] = t[3];",
                      "}"]
        if f.tn % 2:
            col = f"{fv}n + {f.tn - 1} * 8"
            if f.wn * f.tn * 8 > blay.cols:
                col = f"({col} < {blay.cols} ? {col} : {blay.cols - 8})"
            inner.append(f"mg_ldmatrix_x2_trans(b[{f.tn - 1}], &bb_[{blay.index('0', brow, col)}]);")
        inner += ["#pragma unroll", f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll",
                  f"  for (int ni = 0; ni < {f.tn}; ++ni) {mma}({var}[bi][mi][ni], a[mi], b[ni]);"]
        body += ["  " + line for line in inner] + ["}"]
        body = _consts([("b_", b_expr)], body, "") + body
        loop = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi) {{"] + ["  " + x for x in body] + ["}"]
        if f.used < f.warps:
            return [f"if (warp < {f.used}) {{  // warps {f.used}..{f.warps - 1} hold no tile"] + \
                ["  " + x for x in loop] + ["}"]
        return loop

    def _simt_matmul(self, node) -> None:
        """fp32 x fp32: no tensor-core type keeps fp32 exact, so each thread sums its elements' products."""
        a, b = node.srcs
        self.addressable(a)
        self.addressable(b)
        shape = tuple(node.shape)
        k = a.shape[-1]
        lay = Spread(prod(shape), self.T)
        var = self.fresh("v")

        def body(ctx):
            batch = ctx.coords[:-2]
            ac = broadcast(a.shape[:-2], shape[:-2], batch) + [ctx.coords[-2], "k_"]
            bc = broadcast(b.shape[:-2], shape[:-2], batch) + ["k_", ctx.coords[-1]]
            ra = self._read(a, ac, None, ctx)
            rb = self._read(b, bc, None, ctx)
            return ["float p_ = 0.0f;", f"for (int k_ = 0; k_ < {k}; ++k_) p_ += {ra} * {rb};",
                    f"{var}{ctx.slot} = p_;"]
        lines = self.spread_loop(lay, shape, body, guard=True)
        reads = self.reads_plain(a, a.shape) | self.reads_plain(b, b.shape)
        self.place[node] = Reg(lay, var)
        self.emit(Step("", lines, decls=[f"float {var}{_dims(lay)};"], reads=reads,
                       note=f"{_describe(node)} in fp32 (SIMT)"))

    # -- reductions ----------------------------------------------------------------------------------------------
    def _reduce(self, node) -> None:
        x = node.srcs[0]
        comb = R.REDUCE_C[node.op]
        self._reduction(node, x, node.arg, comb, square=False)

    def _reduction(self, node, x, dim: int, comb, *, square: bool) -> Reg:
        """``node`` = comb-reduction of ``x`` (squared first if ``square``) over ``dim``, into registers."""
        p = self.place[x]
        if isinstance(p, Reg) and isinstance(p.layout, Frag) and dim == x.rank - 1:
            reg = self._row_reduce(x, p.layout, comb, square)
        else:
            self.addressable(x)
            reg = self._spread_reduce(x, dim, comb, square)
        self.place[node] = reg
        return reg

    def _row_reduce(self, x, f: Frag, comb, square: bool) -> Reg:
        var = self.fresh("v")
        shape = tuple(x.shape)
        probe = self._probe_ctx(f, shape)
        self.ensure(x, probe)
        reads = self.reads_of(x, probe)
        fv = self.frag_var(f)

        def value(ctx):
            v = self.read(x, ctx)
            return f"mg_square({v})" if square else v
        ctx = Ctx(f, shape, tuple(self._frag_coords(shape)), "[bi][mi][ni][q]", "[bi][mi][q >> 1]")
        cond = f"c_ < {f.n}" if f.col_guard else ""
        add = [f"p_ = {comb('p_', value(ctx))};"]
        lines = ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
                 f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", "for (int h = 0; h < 2; ++h) {",
                 f"  float p_ = {comb.identity};", "  #pragma unroll", f"  for (int ni = 0; ni < {f.tn}; ++ni)",
                 "  #pragma unroll", "  for (int q = 2 * h; q < 2 * h + 2; ++q) {"]
        guard_read = reads and self._frag_valid(f)
        inner = _guarded(self._frag_valid(f) if guard_read else cond, add, "    ")
        lines += _consts([("b_", f"{fv}b + bi"), ("r_", f"{fv}m + mi * 16 + g_ + h * 8"),
                          ("c_", f"{fv}n + ni * 8 + t4_ * 2 + (q & 1)")], inner, "    ") + inner
        lines += ["  }", f"  p_ = {comb('p_', 'mg_shfl_xor(p_, 1)')};", f"  p_ = {comb('p_', 'mg_shfl_xor(p_, 2)')};",
                  f"  {var}[bi][mi][h] = p_;", "}"]
        decls = [f"float {var}[{f.tb}][{f.tm}][2];"]
        self.emit(Step("", lines, decls=decls, reads=reads, note=f"row {'max' if comb is R.MAX else 'sum'} of "
                                                                    f"{_describe(x)} (quad shuffles)"))
        if f.wn > 1:
            self._rows_across_warps(f, var, comb)
        return Reg(Rows(f), var)

    def _rows_across_warps(self, f: Frag, var: str, comb) -> None:
        rows = f.batch * f.m
        buf = self.buffer("scratch", 4 * f.wn * rows, f"row partials of {f.wn} warps")
        self.frag_var(f)  # declares the fragment's warp coordinates the loops below use
        valid = " && ".join(["t4_ == 0"] + ([x for x in [self._rows_valid(f)] if x]))
        write = self.rows_loop(f, lambda ctx: _guarded(
            valid, [f"{buf}[warp % {f.wn} * {rows} + b_ * {f.m} + r_] = {var}[bi][mi][h];"], ""),
            guard=False, coords_shape=(f.batch, f.m, 1))
        self.emit(Step("", write, writes={buf}, note="row partials to shared"))
        read = [f"float p_ = {comb.identity};", "#pragma unroll",
                f"for (int w = 0; w < {f.wn}; ++w) p_ = {comb('p_', f'{buf}[w * {rows} + b_ * {f.m} + r_]')};",
                f"{var}[bi][mi][h] = p_;"]
        self.emit(Step("", self.rows_loop(f, lambda ctx: read, guard=True, coords_shape=(f.batch, f.m, 1)),
                       reads={buf}, note="combine the warps' row partials"))

    def _spread_reduce(self, x, dim: int, comb, square: bool) -> Reg:
        shape = tuple(x.shape)
        out_shape = shape[:dim] + (1,) + shape[dim + 1:]
        n, length = prod(out_shape), shape[dim]
        group = reduce_group(n, length, self.T)
        lay = Spread(n, self.T, group)
        gid, gl = self.group_var(group)
        var = self.fresh("v")
        reads = self.reads_plain(x, shape)
        coords = unravel("o_", out_shape)
        coords[dim] = "j_"
        v = self._read(x, coords, None, Ctx(None, shape, tuple(coords)))
        v = f"mg_square({v})" if square else v
        inner = [f"for (int j_ = {gl}; j_ < {length}; j_ += {group}) p_ = {comb('p_', v)};"]
        inner = _guarded(f"o_ < {n}" if lay.guard else "", inner, "  ")
        lines = ["#pragma unroll", f"for (int s = 0; s < {lay.slots}; ++s) {{"]
        lines += _consts([("o_", f"s * {lay.groups} + {gid}")], inner, "  ") + [f"  float p_ = {comb.identity};"]
        lines += inner
        off = min(group, WARP) // 2
        while off >= 1:
            lines.append(f"  p_ = {comb('p_', f'mg_shfl_xor(p_, {off})')};")
            off //= 2
        decls = [f"float {var}[{lay.slots}];"]
        if group <= WARP:
            lines += [f"  {var}[s] = p_;", "}"]
            self.emit(Step("", lines, decls=decls, reads=reads, note=f"reduce {_describe(x)} over dim {dim} "
                                                                         f"({group} lanes per element)"))
            return Reg(lay, var)
        per = group // WARP
        buf = self.buffer("scratch", 4 * lay.slots * self.W, f"warp partials ({lay.slots} x {self.W})")
        lines += [f"  if (lane == 0) {buf}[s * {self.W} + warp] = p_;", "}"]
        self.emit(Step("", lines, decls=decls, reads=reads, writes={buf},
                       note=f"reduce {_describe(x)} over dim {dim} ({group} lanes per element)"))
        comb_lines = ["#pragma unroll", f"for (int s = 0; s < {lay.slots}; ++s) {{", f"  float p_ = {comb.identity};",
                      "  #pragma unroll",
                      f"  for (int w = 0; w < {per}; ++w) p_ = "
                      f"{comb('p_', f'{buf}[s * {self.W} + {gid} * {per} + w]')};",
                      f"  {var}[s] = p_;", "}"]
        self.emit(Step("", comb_lines, reads={buf}, note="combine the warps' partials"))
        return Reg(lay, var)

    def _rms_norm(self, node) -> None:
        """x * rsqrt(mean(x^2) + eps): the reciprocal root per row goes to shared memory; the product is read
        inline wherever the value is needed."""
        x = node.srcs[0]
        dim, eps = node.arg
        reg = self._reduction(node, x, dim, R.SUM, square=True)
        n = x.shape[dim]
        shape = tuple(node.shape[:dim]) + (1,) + tuple(node.shape[dim + 1:])
        buf = self.buffer("fp32", 4 * prod(shape), f"rsqrt(mean(x^2)) of {_describe(node)}")
        expr = f"mg_rsqrt({{v}} / {R.literal(n)} + {R.literal(eps)})"
        lines = self.store_lines(reg, shape, lambda ctx, v: f"{buf}[{linear(ctx.coords, shape)}] = "
                                                            f"{expr.format(v=v)};")
        self.emit(Step("", lines, writes={buf}, note="the norm's row factors"), self._home(node))
        self.mats[(node, "rms")] = Smem(buf, shape)
        self.addressable(x)
        self.place[node] = Inline()

    # -- accumulators --------------------------------------------------------------------------------------------
    def _acc_state_var(self, acc, layout) -> str:
        if acc in self.acc_state:
            return self.acc_state[acc][1]
        var = self.fresh("acc")
        rule = R.ACC_C[acc.op]
        self.acc_state[acc] = (layout, var)
        dims = _dims(layout)
        if rule.combine is R.SUM:
            self.acc_decls.append(f"float {var}{dims} = {{}};  // {_describe(acc)}")
        else:
            self.acc_decls.append(f"float {var}{dims};  // {_describe(acc)}")
            self.acc_decls += _fill(var, layout, rule.combine.identity)
        if acc in self.rescaled:
            self.acc_decls.append(f"float {var}p{dims}, {var}f{dims};  // previous value, rescale factor")
            self.prev[acc] = (f"{var}p", f"{var}f")
        return var

    def _accumulate(self, acc) -> None:
        rule = R.ACC_C[acc.op]
        x = acc.srcs[0]
        if acc in self.in_place:
            layout, var = self.acc_state[acc]
            self.place[acc] = Reg(layout, var)
            return
        if self._state_in_smem(acc, rule):
            self._accumulate_in_smem(acc, rule)
            return
        if rule.last:
            src = _Temp(acc.shape)
            src_layout = self._reduction(src, x, len(x.shape) - 1, rule.combine, square=rule.square).layout
        else:
            p = self.place[x]
            if isinstance(p, Reg):
                src_layout = p.layout
            else:
                self.addressable(x)
                src_layout = Spread(prod(acc.shape), self.T)
            src = x
        var = self._acc_state_var(acc, src_layout)
        shape = tuple(acc.shape)
        probe = self._probe_ctx(src_layout, shape)
        self.ensure(src, probe)
        reads = self.reads_of(src, probe)
        lines = []
        if acc in self.prev:
            prev, _ = self.prev[acc]
            lines += _copy(prev, var, src_layout)
        if rule.rescale:
            lines += self._rescale_lines(acc, Reg(src_layout, var), shape)
            reads |= self._factor_reads(acc, src_layout, shape)
        lines += self.layout_loop(src_layout, shape, lambda ctx: [
            f"{var}{ctx.slot} = {rule.combine(var + ctx.slot, self.read(src, ctx))};"], guard=bool(reads))
        if acc in self.prev:
            prev, fac = self.prev[acc]
            lines += self.layout_loop(src_layout, shape, lambda ctx: [
                f"{fac}{ctx.slot} = mg_exp({prev}{ctx.slot} - {var}{ctx.slot});"], guard=False)
        self.place[acc] = Reg(src_layout, var)
        if acc in self.prev:
            self.place[self.factor(acc)] = Reg(src_layout, self.prev[acc][1])
        self.emit(Step("", lines, reads=reads, note=f"{_describe(acc)} update"))

    def _state_in_smem(self, acc, rule) -> bool:
        """Too many values per thread for registers (the cost model counts them as shared memory)."""
        p = self.place[acc.srcs[0]]
        spread = not isinstance(p, Reg) or isinstance(p.layout, Spread)
        return (not rule.last and acc not in self.rescaled and spread
                and ceil_div(prod(acc.shape), self.T) > REG_SLOTS)

    def _accumulate_in_smem(self, acc, rule) -> None:
        """The state as an fp32 shared buffer; each thread updates the same elements every iteration."""
        shape = tuple(acc.shape)
        x = acc.srcs[0]
        if acc not in self.acc_state:
            buf = self.buffer("fp32", 4 * prod(shape), f"{_describe(acc)} state")
            self.acc_state[acc] = ("smem", buf)
            init = self.plain_loop(shape, lambda ctx: [f"{buf}[e_] = {rule.combine.identity};"])
            self.emit(Step("", init, writes={buf}, note=f"initial {_describe(acc)}"), "pro")
        buf = self.acc_state[acc][1]
        self.addressable(x)
        reads = {buf} | self.reads_plain(x, shape)
        scale = ""
        if rule.rescale:
            fac = self.factor(acc.srcs[1])
            self.addressable(fac)
            reads |= self.reads_plain(fac, shape)
            scale = " * {}"

        def body(ctx):
            state = f"{buf}[e_]" + (scale.format(self.read(self.factor(acc.srcs[1]), ctx)) if scale else "")
            return [f"{buf}[e_] = {rule.combine(state, self.read(x, ctx))};"]
        self.emit(Step("", self.plain_loop(shape, body), reads=reads, writes={buf},
                       note=f"{_describe(acc)} update (state in shared memory)"))
        self.place[acc] = Smem(buf, shape)

    def _rescale_lines(self, acc, state: Reg, shape) -> list[str]:
        """state *= exp(m_prev - m_cur) for a rescaling accumulator, the factor read in the state's layout."""
        fac = self.factor(acc.srcs[1])
        probe = self._probe_ctx(state.layout, shape)
        self.ensure(fac, probe)
        return self.layout_loop(state.layout, shape, lambda ctx: [
            f"{state.var}{ctx.slot} *= {self.read(fac, ctx)};"], guard=bool(self.reads_of(fac, probe)))

    def _factor_reads(self, acc, layout, shape) -> set:
        return self.reads_of(self.factor(acc.srcs[1]), self._probe_ctx(layout, shape))

    def _finalise(self, acc) -> None:
        layout, var = self.acc_state[acc]
        if layout == "smem":
            self.place[acc] = Smem(var, tuple(acc.shape))
            return
        rule = R.ACC_C[acc.op]
        self.place[acc] = Reg(layout, var)
        if rule.final:
            n = R.literal(self.F * acc.srcs[0].shape[-1])
            lines = self.layout_loop(layout, acc.shape, lambda ctx: [
                f"{var}{ctx.slot} = {rule.final.format(var + ctx.slot, n=n)};"], guard=False)
            self.emit(Step("", lines, note=f"final value of {_describe(acc)}"))

    # -- outputs -------------------------------------------------------------------------------------------------
    def _store_output(self, i: int, out) -> None:
        node = out.node
        param = self.outputs[i].param
        shape = tuple(node.shape)
        gstrides = _row_major(out.shape)
        terms = []
        for axis, dim in enumerate(out.omap):
            if dim is not None and shape[dim] * gstrides[dim]:
                terms.append(f"(long long)mg_bid_{AXES[axis]}() * {shape[dim] * gstrides[dim]}")
        base = f"{param}o"
        self.kernel_decls.append(f"const long long {base} = {' + '.join(terms) or '0'};  // output {i} tile origin")
        cvt = R.DTYPE_C[out.dtype].store

        def write(ctx, v):
            return f"{param}[{base} + {strided(ctx.coords, gstrides)}] = {cvt.format(v)};"
        p = self.place[node]
        if isinstance(p, Reg) and self._pairs_ok(p, out, shape, gstrides):
            lines = self._pair_store(p, shape, param, base, gstrides, out.dtype)
            reads = set()
        elif isinstance(p, Reg):
            lines = self.store_lines(p, shape, write)
            reads = set()
        else:
            self.addressable(node)
            reads = self.reads_plain(node, shape)
            lines = self.plain_loop(shape, lambda ctx: [write(ctx, self.read(node, ctx))])
        self.emit(Step("", lines, reads=reads, note=f"store output {i} ({out.dtype.short}{list(out.shape)})"))


    @staticmethod
    def _pairs_ok(p: Reg, out, shape, gstrides) -> bool:
        """A Frag's two adjacent columns per lane can go out as one 32-bit store of a 16-bit output: every
        pair starts on an even element (even width, even strides, even tile origins)."""
        even = all(s % 2 == 0 for s in gstrides[:-1]) and shape[-1] % 2 == 0
        return isinstance(p.layout, Frag) and out.dtype.is_16bit and len(shape) >= 2 and shape[-1] > 1 and even

    def _pair_store(self, p: Reg, shape, param: str, base: str, gstrides, dtype: DType) -> list[str]:
        f: Frag = p.layout
        cvt = R.DTYPE_C[dtype].store
        v = self.frag_var(f)
        coords = self._frag_coords(shape)
        index = f"{base} + {strided(coords, gstrides)}"
        pair = f"mg_pack2({cvt.format(p.var + '[bi][mi][ni][2 * h]')}, {cvt.format(p.var + '[bi][mi][ni][2 * h + 1]')})"
        inner = _guarded(self._frag_valid(f), [f"*(unsigned*)&{param}[{index}] = {pair};"], "  ")
        return ["#pragma unroll", f"for (int bi = 0; bi < {f.tb}; ++bi)", "#pragma unroll",
                f"for (int mi = 0; mi < {f.tm}; ++mi)", "#pragma unroll", f"for (int ni = 0; ni < {f.tn}; ++ni)",
                "#pragma unroll", "for (int h = 0; h < 2; ++h) {"] + \
            _consts([("b_", f"{v}b + bi"), ("r_", f"{v}m + mi * 16 + g_ + h * 8"),
                     ("c_", f"{v}n + ni * 8 + t4_ * 2")], inner, "  ") + inner + ["}"]


class _Temp:
    """A value with no node of its own (an accumulator's per-iteration partial)."""

    op = None
    srcs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)




# ---- small helpers -----------------------------------------------------------------------------------------------


def _consts(defs, using: list[str], indent: str) -> list[str]:
    """``const int`` definitions of the names (in order) that ``using`` mentions."""
    text = "\n".join(using)
    used = [f"{name} = {expr}" for name, expr in defs if re.search(rf"\b{name}\b", text)]
    return [f"{indent}const int {', '.join(used)};"] if used else []


def _guarded(cond: str, lines: list[str], indent: str) -> list[str]:
    if not cond:
        return [indent + line for line in lines]
    if len(lines) == 1:
        return [f"{indent}if ({cond}) {lines[0]}"]
    return [f"{indent}if ({cond}) {{"] + [indent + "  " + line for line in lines] + [f"{indent}}}"]


def _dims(layout) -> str:
    return "".join(f"[{d}]" for d in layout.dims)


def _fill(var: str, layout, value: str) -> list[str]:
    dims = layout.dims
    idx = "".join(f"[i{k}]" for k in range(len(dims)))
    lines = []
    for k, d in enumerate(dims):
        lines += ["  " * k + "#pragma unroll", "  " * k + f"for (int i{k} = 0; i{k} < {d}; ++i{k})"]
    return lines + ["  " * len(dims) + f"{var}{idx} = {value};"]


def _copy(dst: str, src: str, layout) -> list[str]:
    dims = layout.dims
    idx = "".join(f"[i{k}]" for k in range(len(dims)))
    lines = []
    for k, d in enumerate(dims):
        lines += ["  " * k + "#pragma unroll", "  " * k + f"for (int i{k} = 0; i{k} < {d}; ++i{k})"]
    return lines + ["  " * len(dims) + f"{dst}{idx} = {src}{idx};"]


def _offset(batch: str, stride: int) -> str:
    if batch == "0":
        return ""
    return f" + {batch} * {stride}"


def _row_major(shape) -> tuple:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return tuple(reversed(strides))


def _describe(node) -> str:
    if isinstance(node, (Factor, _Temp)):
        return "rescale factor" if isinstance(node, Factor) else "partial"
    return f"{node.op.value}{list(node.shape)}"
