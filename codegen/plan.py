"""The launch plan of a kernel graph (which kernels run, on which buffers) and the shared-memory planner of one
block graph (where each shared buffer lives, reusing space between buffers whose lifetimes do not overlap).

Kernel level: every custom op (distinct block graph and sources) is one generated ``__global__`` function; every
other op is a library launch (CuPy on a GPU, NumPy in ``run_on_cpu``). A custom op reading a transpose, reshape,
slice or broadcast of a tensor reads the tensor itself through an offset and strides (no copy); such layout ops
become library launches only when a library op or a graph output needs them materialised, or when the chain is
no strided view (``ir.layout``: a merge of dims a transpose separated).
"""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.codegen.arch import ArchSpec, get_arch
from mugraph.codegen.lower import InputView, KernelIR, Lowering, OutputView, SmemBuffer
from mugraph.codegen.render import DTYPE_C
from mugraph.codegen.splits import COUNTERS, SCRATCH
from mugraph.ir.block import BlockGraph
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph, ResourceError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.layout import StridedView, materialised, output_views, row_major, strided_view
from mugraph.ir.node import KNode
from mugraph.ir.ops import KERNEL_LAYOUT, KOp

# ---- the interface the runtimes read -----------------------------------------------------------------------------


WORKSPACE_ROLES = frozenset({"scratch", "counters"})


@dataclass(frozen=True)
class Buffer:
    """A device tensor: a graph input, a graph output, an intermediate between launches, or workspace.

    Workspace (roles in WORKSPACE_ROLES) is memory a launcher owns for one launch: never a value the caller
    sees, never shared between launches that may run at once (one per call, or per stream). ``zero_init``: the
    launcher zeroes it before the first launch that uses it (a split loop's counters; the last CTA resets them,
    so a buffer kept for a stream needs zeroing once, a buffer allocated per call every call). Other workspace
    starts with whatever the allocator gives (a split's partials: every CTA writes its own before any is read).
    """

    name: str
    shape: tuple
    dtype: DType
    role: str  # "input" | "output" | "intermediate" | "scratch" | "counters"
    zero_init: bool = False

    @property
    def workspace(self) -> bool:
        return self.role in WORKSPACE_ROLES

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def split_buffers(kernel: str, blocks: int, splits: int, state_floats: int) -> tuple[Buffer, Buffer]:
    """The workspace of a kernel whose loop is split over ``splits`` CTAs per block: the partial states (fp32,
    written by each CTA before it counts in) and one finished-CTA counter per block (32-bit, zeroed; the kernel
    takes it as ``unsigned*``: zero is zero in either type)."""
    return (Buffer(f"{kernel}_partials", (blocks * splits * state_floats,), DType.FLOAT32, "scratch"),
            Buffer(f"{kernel}_counters", (blocks,), DType.FLOAT32, "counters", zero_init=True))


@dataclass(frozen=True)
class KernelLaunch:
    """One launch. Custom: ``name`` is the ``__global__`` function, ``args`` its pointer parameters in order.
    Library: ``name`` is "", ``args`` are the operands then the result, ``library_op`` the KNode to evaluate;
    grid and block are (0, 0, 0) (the library chooses)."""

    name: str
    kind: str  # "custom" | "library"
    grid: tuple
    block: tuple
    smem_bytes: int  # dynamic shared memory; above 48 KiB the launcher must raise the kernel's attribute
    args: tuple
    library_op: object = None
    # sm_90a: the TMA tensor maps the kernel takes after ``args``, by value (codegen.tma.TensorMapSpec, each over a
    # buffer of the plan: a launcher encodes it for that buffer's address at each launch)
    tensor_maps: tuple = ()
    cluster: tuple = (1, 1, 1)  # thread-block cluster dims (the kernel's __cluster_dims__; the CPU harness's)


@dataclass(frozen=True)
class LaunchPlan:
    kernels: tuple
    buffers: tuple
    inputs: tuple   # buffer names in the graph's input order
    outputs: tuple  # buffer names in the graph's output order (a name may repeat, or be an input's)

    @property
    def workspace(self) -> tuple:
        """The buffers every launcher allocates itself (see Buffer): scratch and counters, by plan order."""
        return tuple(b for b in self.buffers if b.workspace)

    def launch_workspace(self, launch: KernelLaunch) -> tuple:
        """The workspace buffers ``launch`` takes, in its argument order."""
        mine = {b.name: b for b in self.workspace}
        return tuple(mine[a] for a in dict.fromkeys(launch.args) if a in mine)


# ---- shared-memory planning --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmemAlloc:
    """One placed shared buffer: ``[offset, offset + nbytes)``, live from step ``first`` to step ``last``."""

    name: str
    offset: int
    nbytes: int
    role: str
    what: str
    first: int
    last: int
    layout: object = None     # layouts.TileLayout (its .matrix is the ldmatrix SmemLayout, if any)
    stages: int = 1
    ldmatrix: bool = False

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class SmemPlan:
    """Every shared buffer of one kernel with its place; ``total_bytes`` is the dynamic shared memory to launch
    with (0 when the kernel needs none)."""

    arch: str
    total_bytes: int
    limit: int
    allocations: tuple

    def by_name(self, name: str) -> SmemAlloc:
        return next(a for a in self.allocations if a.name == name)

    def ldmatrix_layouts(self) -> list:
        """The per-matrix SmemLayout of every buffer ldmatrix reads."""
        return [a.layout.matrix for a in self.allocations if a.ldmatrix and a.layout is not None]


def lifetimes(ir: KernelIR) -> dict[str, tuple[int, int]]:
    """(first, last) step of every buffer; a buffer used inside the loop and before it lives through the whole
    loop (each iteration reads it again), and one live across the loop's back edge through all of it."""
    loop = [i for i, s in enumerate(ir.steps) if s.region == "loop"]
    lo, hi = (loop[0], loop[-1]) if loop else (None, None)
    spans: dict[str, list[int]] = {}
    for i, step in enumerate(ir.steps):
        for name in step.reads | step.writes:
            spans.setdefault(name.split("#")[0], []).append(i)
    for name in ir.staged_inputs:  # written by each iteration's prefetch, read by the next
        spans.setdefault(name, []).extend([lo, hi] if lo is not None else [])
        if ir.pipeline:  # a TMA producer fills the stages from the kernel's start, beside the prologue
            spans[name].append(0)
    for name, buf in ir.buffers.items():  # mbarriers: in use from the kernel's start to its end
        if buf.role == "barrier":
            spans[name] = [0, max(0, len(ir.steps) - 1)]
    out = {}
    for name in ir.buffers:
        steps = spans.get(name) or [0]
        first, last = min(steps), max(steps)
        if lo is not None and first < lo <= last:
            last = max(last, hi)
        if lo is not None and lo <= first <= hi < last:
            first = lo
        out[name] = (first, last)
    return out


def place_buffers(buffers: dict[str, SmemBuffer], spans: dict, align: int) -> dict[str, int]:
    """First fit, largest buffers first: each buffer goes to the lowest aligned offset that no buffer with an
    overlapping lifetime occupies."""
    placed: dict[str, int] = {}
    order = sorted(buffers.values(), key=lambda b: (-b.nbytes, spans[b.name], b.name))
    for buf in order:
        first, last = spans[buf.name]
        busy = sorted((placed[o], placed[o] + buffers[o].nbytes) for o in placed
                      if spans[o][0] <= last and first <= spans[o][1])
        offset, step = 0, max(align, buf.align)
        for start, end in busy:
            if offset + buf.nbytes <= start:
                break
            offset = max(offset, _align(end, step))
        placed[buf.name] = offset
    return placed


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def plan_ir_smem(ir: KernelIR, arch: ArchSpec) -> SmemPlan:
    return plan_buffers(ir.graph, ir.buffers, lifetimes(ir), arch)


def plan_buffers(graph: BlockGraph, buffers: dict[str, SmemBuffer], spans: dict, arch: ArchSpec) -> SmemPlan:
    """``buffers`` placed by their lifetimes ``spans``; ResourceError naming ``graph`` if they do not fit."""
    offsets = place_buffers(buffers, spans, arch.smem_align)
    allocs = tuple(SmemAlloc(b.name, offsets[b.name], b.nbytes, b.role, b.what, *spans[b.name], b.layout,
                             b.stages, b.ldmatrix) for b in sorted(buffers.values(), key=lambda b: offsets[b.name]))
    total = max((a.end for a in allocs), default=0)
    total = _align(total, 16) if total else 0
    if total > arch.smem_limit:
        listing = "; ".join(f"{a.name} {a.what}: {a.nbytes} B" for a in sorted(allocs, key=lambda a: -a.nbytes))
        raise ResourceError(f"block graph {graph!r} needs {total} bytes of shared memory; {arch.name} allows "
                            f"{arch.smem_limit} per block ({listing})",
                            hint="use smaller tiles: a larger grid or forloop splits each tile")
    return SmemPlan(arch.name, total, arch.smem_limit, allocs)


def plan_shared_memory(block_graph: BlockGraph, arch: str = "sm_80") -> SmemPlan:
    """The shared-memory plan of ``block_graph`` (contiguous inputs); ResourceError if it does not fit ``arch``."""
    spec = get_arch(arch)
    return lower_and_plan(block_graph, spec, "kernel", default_views(block_graph))[1]


def lower_and_plan(bg: BlockGraph, arch: ArchSpec, name: str, views) -> tuple[KernelIR, SmemPlan]:
    """Lowered and placed by the block graph's schedule (``schedule.kernel_schedule``: splits and stages)."""
    from mugraph.codegen.schedule import kernel_schedule
    s = kernel_schedule(bg, arch)
    ir = lower_block_graph(bg, arch, name, views, s.stages, s.splits, s.path)
    return ir, plan_ir_smem(ir, arch)


def lowered(bg: BlockGraph, arch: ArchSpec, stages: int, splits: int,
            path: str = "sync") -> tuple[KernelIR, SmemPlan]:
    """``bg`` lowered with contiguous inputs and placed (what the schedule reads; it memoises its own result)."""
    ir = lower_block_graph(bg, arch, "kernel", default_views(bg), stages, splits, path)
    return ir, plan_ir_smem(ir, arch)


def default_views(bg: BlockGraph) -> tuple[list[InputView], list[OutputView]]:
    inputs = [InputView(f"in{i}", n.arg.dtype, row_major(n.arg.shape)) for i, n in enumerate(bg.inputs)]
    outputs = [OutputView(f"out{i}") for i in range(len(bg.outputs))]
    return inputs, outputs


def lower_block_graph(bg: BlockGraph, arch: ArchSpec, name: str, views, stages: int = 2,
                      splits: int = 1, path: str = "sync") -> KernelIR:
    inputs, outputs = views
    if bg.threads > arch.max_threads:
        raise ResourceError(f"block graph {bg!r} uses {bg.threads} threads; {arch.name} allows {arch.max_threads}")
    params, seen = [], set()
    for v in inputs:
        if v.param is not None and v.param not in seen:  # None: an index tile the kernel computes
            seen.add(v.param)
            params.append((v.param, v.dtype, True))
    for v, out in zip(outputs, bg.outputs):
        params.append((v.param, out.dtype, False))
    if bg.forloop % splits:
        raise InvalidGraph(f"a loop of {bg.forloop} trips does not split into {splits} equal shares")
    if splits > 1:  # the partial states and the finished-CTA counters (splits.py)
        params += [(SCRATCH, DType.FLOAT32, False), (COUNTERS, None, False)]
    return Lowering(bg, name, arch, inputs, outputs, params, stages, splits, path).run()




# ---- the kernel graph ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CustomKernel:
    """A custom op to generate: its block graph, the buffers it reads (through strides) and writes."""

    name: str
    graph: BlockGraph
    inputs: tuple   # InputView per block input (param = buffer name)
    outputs: tuple  # buffer name per block output
    output_strides: tuple = ()  # per block output: None (row-major) or the strides of an output view


def view_of(node: KNode, materialised=lambda n: False) -> StridedView:
    """The buffer a custom op reading ``node`` loads from (the root of its layout chain, or the
    nearest layout node that is ``materialised``), with the offset and element strides that read
    ``node`` from it. The chain must be a strided view where nothing in it is materialised."""
    found = strided_view(node, materialised)
    if found is None:
        raise InvalidGraph(f"internal: {node!r} is no strided view and was not materialised")
    return found


class GraphPlanner:
    """Assigns buffers and launches to a kernel graph's nodes, in program order."""

    def __init__(self, graph: KernelGraph, prefix: str = "mg_kernel"):
        self.graph = graph
        self.prefix = prefix
        self.names: dict[KNode, str] = {}
        self.buffers: list[Buffer] = []
        self.launches: list[KernelLaunch] = []
        self.customs: list[CustomKernel] = []
        self.taken: set[str] = set()
        self.written = output_views(graph)   # custom outputs stored through an output's layout

    def run(self) -> tuple[list[CustomKernel], list, list[Buffer]]:
        g = self.graph
        for node, name in zip(g.inputs, g.input_names):
            self._new_buffer(node, name, "input", exact=True)
        needed = self.needed = self._materialised()
        done: dict = {}
        for node in g.nodes:
            if node in self.names:
                continue
            if node.op is KOp.CUSTOM:
                key = (node.arg[0], node.srcs)
                if key not in done:
                    done[key] = self._custom(node)
                self.names[node] = done[key][node.arg[1]]
            elif (node.op in KERNEL_LAYOUT or node.op is KOp.IOTA) and node not in needed:
                continue   # a view, or an index tensor its custom kernels compute
            elif node.op is KOp.INPUT:
                raise InvalidGraph(f"input {node.arg[0]!r} is used but not listed among the graph's inputs")
            else:
                self._library(node)
        return self.customs, self.launches, self.buffers

    def outputs(self) -> tuple:
        return tuple(self.names[o] for o in self.graph.outputs)

    def _materialised(self) -> set:
        """Nodes that get a buffer (``ir.layout.materialised``: custom ops read views through strides and write
        output views in place)."""
        return materialised(self.graph, self.written)

    def _role(self, node: KNode) -> str:
        return "output" if node in self.graph.outputs else "intermediate"

    def _out_name(self, node: KNode) -> str:
        g = self.graph
        for out, name in zip(g.outputs, g.output_names):
            if out is node:
                return name
        return f"t{len(self.buffers)}"

    def _new_buffer(self, node, name: str, role: str, *, exact: bool = False, shape=None, dtype=None) -> str:
        base, k = name, 1
        while name in self.taken:
            if exact:
                raise InvalidGraph(f"two inputs are named {name!r}")
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        self.buffers.append(Buffer(name, tuple(shape or node.shape), dtype or node.dtype, role))
        if node is not None:
            self.names[node] = name
        return name

    def _custom(self, node: KNode) -> list[str]:
        bg: BlockGraph = node.arg[0]
        views = []
        for src in node.srcs:
            v = view_of(src, lambda n: n in self.needed and n in self.names)
            root = v.root
            if root.op is KOp.IOTA and root not in self.names:  # computed in the kernel, never loaded
                shape, dim, _ = root.arg
                views.append(InputView(None, src.dtype, v.strides, (row_major(shape)[dim], shape[dim]),
                                       v.offset))
            else:
                views.append(InputView(self.names[root], src.dtype, v.strides, offset=v.offset,
                                       divisors=v.divisors))
        outs, strides = [], []
        for i, spec in enumerate(bg.outputs):
            twin = KNode(KOp.CUSTOM, node.srcs, (bg, i))
            view, through = self.written.get(twin, (None, None))
            if view is not None:   # stored straight into the output the layout chain makes
                outs.append(self._new_buffer(view, self._out_name(view), "output"))
                self.names[twin] = outs[-1]
            else:
                outs.append(self._new_buffer(twin, self._out_name(twin), self._role(twin),
                                             shape=spec.shape, dtype=spec.dtype))
            strides.append(through)
        name = f"{self.prefix}{len(self.customs)}"
        self.customs.append(CustomKernel(name, bg, tuple(views), tuple(outs), tuple(strides)))
        params = list(dict.fromkeys(v.param for v in views if v.param is not None)) + outs
        self.launches.append(KernelLaunch(name, "custom", bg.grid, (bg.threads, 1, 1), 0, tuple(params)))
        return outs

    def _library(self, node: KNode) -> None:
        args = tuple(self.names[s] for s in node.srcs)
        out = self._new_buffer(node, self._out_name(node), self._role(node))
        self.launches.append(KernelLaunch("", "library", (0, 0, 0), (0, 0, 0), 0, args + (out,), node))


def param_ctype(dtype: DType | None, const: bool) -> str:
    """A pointer parameter's C type; ``dtype`` None: the unsigned counters of a split loop."""
    storage = "unsigned" if dtype is None else DTYPE_C[dtype].storage
    return f"MG_PARAM({'const ' if const else ''}{storage})"
