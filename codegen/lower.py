"""Lowering: one block graph becomes the steps of one CUDA kernel, each step a piece of C with the shared buffers
it reads and writes.

Where each value lives decides everything (``placement``); one module per concern places and emits:

* ``copies``: input tiles in shared memory by 16-byte cp.async, loop-walked tiles in a multi-stage pipeline,
  ldmatrix-fed tiles swizzled;
* ``mma``: block matmuls as mma.sync fragments in registers (``Frag``), operands by ldmatrix;
* ``elementwise``: the thread level, per element in registers (``Reg``) or inline where read (``Inline``);
* ``reductions``: per row of a Frag with quad shuffles (``Rows``), else groups of lanes (``Spread``);
* ``accumulators``: state in registers in its operand's layout, joined each iteration;
* ``stores``: outputs to global memory;
* on sm_90a's path (``path="hopper"``): ``hopper_pipeline`` lands the loop's tiles by TMA (a producer warpgroup,
  mbarriers) in the swizzled layout wgmma reads, and ``wgmma`` takes the products that fit it (mma calls it first);
* ``values``: reading any of these at a loop's element, materialising a register value to shared memory
  (``Smem``) when another layout must read it; ``loops``: how threads walk the elements they hold.

The steps go to the shared-memory planner and the renderer (generate.py), which places barriers.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Mapping

from mugraph.codegen import accumulators, copies, elementwise, mma, offsets, reductions, splits, stores
from mugraph.codegen import render as R
from mugraph.codegen.arch import ArchSpec
from mugraph.codegen.kernel_ir import InputView, KernelIR, OutputView, SmemBuffer, Step  # noqa: F401 (re-exported)
from mugraph.codegen.layouts import MMA, WARP, Frag
from mugraph.codegen.placement import Const, Factor
from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.node import BNode
from mugraph.ir.ops import ACCUMULATORS, BLOCK_REDUCE, BOp, RESCALE_ACCUMULATORS, TOp

# The module that lowers each kind of block op (elementwise TOps go to ``elementwise``).
RULES: Mapping[BOp, Callable] = {
    BOp.MATMUL: mma.lower_matmul,
    BOp.RMS_NORM: reductions.lower_rms_norm,
    **{op: reductions.lower_reduce for op in BLOCK_REDUCE},
    **{op: accumulators.accumulate for op in ACCUMULATORS},
}


class Lowering:
    """The state one kernel's lowering shares between the concern modules: where each value lives
    (``place``), the shared buffers, the steps emitted so far, and the kernel-scope declarations."""

    def __init__(self, graph: BlockGraph, name: str, arch: ArchSpec, inputs: list[InputView],
                 outputs: list[OutputView], params: list, stages: int = 2, splits: int = 1, path: str = "sync"):
        self.g, self.name, self.arch = graph, name, arch
        self.inputs, self.outputs, self.params = inputs, outputs, params
        self.T = graph.threads
        self.W = graph.threads // WARP
        self.splits = splits                  # CTAs sharing one block's loop (splits.py combines them)
        self.F_total = graph.forloop
        self.F = graph.forloop // splits      # loop trips of one CTA
        self.phase = graph.phases()
        self.order = graph.nodes
        self.uses = Counter(s for n in self.order for s in n.srcs) + Counter(o.node for o in graph.outputs)
        self.place: dict = {}
        self.buffers: dict[str, SmemBuffer] = {}
        self.steps: list[Step] = []
        self.pending_pro: list[Step] = []     # prologue steps created while lowering later regions
        self.kernel_decls: list[str] = []
        self.thread_bases = offsets.ThreadBases(graph.threads, self.kernel_decls)  # hoisted shared offsets
        self.acc_decls: list[str] = []
        self.loop_head: list[str] = []
        self.mats: dict = {}
        self.staged: dict = {}
        self.frags: dict[Frag, str] = {}
        self.hoisted: dict = {}               # (A operand, Frag, dtype) -> its fragments kept in registers (mma)
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
        self.mma_use = copies.mma_uses(self.order)
        self.stage_bufs: list[str] = []
        self.loop_copy: tuple = ([], [])
        self.state_floats = 0                 # partial state one CTA publishes when split (floats)
        self.hopper = path == "hopper" and (arch.tma or arch.wgmma)  # sm_90a's path: TMA pipeline, wgmma
        self.tma_tiles: list = []
        self.pipeline = None
        self.async_reads = False
        self.wgmma_flops = 0

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
        self.kernel_decls.append(f"MG_SPTR({ctype}) const {name} = ({ctype}*)(smem + {{off:{name}}});  // {what}")
        return name

    def emit(self, step: Step, region: str | None = None) -> None:
        step.region = region or self.region
        if step.region == "pro" and self.region != "pro":
            self.pending_pro.append(step)
        else:
            self.steps.append(step)

    def home(self, node) -> str:
        """The region a materialisation or staging of ``node`` belongs to: invariant values once, up front."""
        if isinstance(node, BNode) and self.phase.get(node) is Phase.INVARIANT:
            return "pro"
        return self.region

    def version(self, node) -> str:
        """Which copy of a value a read means: an accumulator's running state inside the loop, else its value."""
        if isinstance(node, Factor) or (isinstance(node, BNode) and node.op in ACCUMULATORS and self.region != "epi"):
            return "running"
        return "value"

    # -- kernel-scope declarations -------------------------------------------------------------------------------
    def frag_var(self, f: Frag) -> str:
        """The kernel-scope warp coordinates of Frag ``f`` (declared on first use)."""
        if f not in self.frags:
            v = f"f{len(self.frags)}"
            self.frags[f] = v
            self.kernel_decls.append(
                f"const int {v}b = warp / {f.wm * f.wn} * {f.tb}, {v}m = warp / {f.wn} % {f.wm} * {f.tm * MMA.m}, "
                f"{v}n = warp % {f.wn} * {f.tn * MMA.n};  // [{f.batch},{f.m},{f.n}] on {f.wb}x{f.wm}x{f.wn} warps")
        return self.frags[f]

    def group_var(self, group: int) -> tuple[str, str]:
        """(group index, lane in group) variables for groups of ``group`` consecutive threads."""
        if group == 1:
            return "tid", "0"
        if group not in self.group_vars:
            self.group_vars[group] = f"q{group}"
            self.kernel_decls.append(f"const int q{group}g = tid / {group}, q{group}l = tid % {group};  "
                                     f"// groups of {group} lanes")
        v = self.group_vars[group]
        return f"{v}g", f"{v}l"

    def bid(self, axis: str) -> str:
        """The block's index along grid ``axis`` of the block graph (a split loop folds its CTAs into z)."""
        if self.splits == 1 or axis != "z":
            return f"mg_bid_{axis}()"
        gz = self.g.grid[2]
        return "0" if gz == 1 else f"(mg_bid_z() % {gz})"

    # -- the walk ------------------------------------------------------------------------------------------------
    def run(self) -> KernelIR:
        self.kernel_decls += ["const int tid = mg_tid_x(), lane = mg_lane(), warp = mg_warp();",
                              "const int g_ = lane >> 2, t4_ = lane & 3;  // mma fragment row / column pair"]
        if self.splits > 1:
            gz = self.g.grid[2]
            split = "mg_bid_z()" if gz == 1 else f"mg_bid_z() / {gz}"
            self.kernel_decls.append(f"const int sp_ = {split};  // which of the {self.splits} CTAs of the loop")
        copies.lower_inputs(self)
        invariant = [n for n in self.order if self.phase[n] is Phase.INVARIANT]
        loop = [n for n in self.order if self.phase[n] in (Phase.LOOP, Phase.ACCUMULATOR)]
        epilogue = [n for n in self.order if self.phase[n] is Phase.EPILOGUE]
        for n in invariant:
            self.lower(n)
        self.region = "loop"
        copies.emit_prefetch(self)
        for n in loop:
            self.lower(n)
        self.region = "epi"
        self.mats = {k: v for k, v in self.mats.items() if k[1] != "running"}
        accs = [n for n in loop if n.op in ACCUMULATORS]
        split_state = splits.state_floats(self, accs)
        splits.combine_partials(self, accs)
        for n in loop:
            if n.op in ACCUMULATORS:
                accumulators.finalise(self, n)
        for n in epilogue:
            self.lower(n)
        for i, out in enumerate(self.g.outputs):
            stores.store_output(self, i, out)
        pro = [s for s in self.steps if s.region == "pro"] + self.pending_pro
        rest = [s for s in self.steps if s.region != "pro"]
        return KernelIR(self.name, self.g, self.params, self.buffers, pro + rest, self.kernel_decls,
                        self.acc_decls, self.loop_head, self.stages,
                        bool(self.stage_bufs), self.stage_bufs, self.splits, self.state_floats, split_state,
                        self.pipeline, self.async_reads, "hopper" if self.hopper else "sync", self.wgmma_flops)

    def lower(self, node) -> None:
        op = node.op
        if op is BOp.INPUT:
            return  # placed by copies.lower_inputs
        if op is BOp.CONSTANT:
            self.place[node] = Const(R.literal(node.arg[0]))
        elif isinstance(op, TOp) or op is BOp.THREAD:
            elementwise.lower_elementwise(self, node)
        elif op in RULES:
            RULES[op](self, node)
        else:
            raise InvalidGraph(f"the code generator has no rule for block op {op.value}")
        self.updated.add(node)
