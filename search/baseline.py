"""An XLA-like baseline: the kernels `jax.jit` would launch for a spec on a GPU, costed by the cost model.

The rules modelled (XLA GPU's classic fusion passes: instruction fusion, multi-output fusion):
1. Loop fusion. Elementwise ops, concatenation and layout ops (broadcast, reshape, transpose)
   are fusible: an elementwise value is computed inside every kernel that consumes it (XLA fuses
   producers into consumers, duplicating cheap ones), and is written to memory only where it
   must be: a graph output, or an operand of a matmul or a custom kernel. A chain of 30
   elementwise ops is one launch.
2. Input fusion. A reduction (reduce_sum, reduce_max) is the root of its kernel: the elementwise
   chain that feeds it runs inside it. Its result is written to memory and its consumers read
   it (XLA's classic emitters do not fuse a reduction into the elementwise consumers of its
   result): a row softmax is two reduction kernels (max; sum of exp(x - max)) and one loop
   fusion (exp(x - max) / sum).
3. rms_norm is what XLA makes of its JAX form: a reduction of x² (an input fusion writing one
   fp32 value per row) and the elementwise x · rsqrt(mean + eps), fusible as in rule 1.
4. A matmul is one library call (cuBLAS, or a Triton GEMM) reading its operands from memory.
   XLA's GEMM rewriting folds into it a multiply by a scalar constant (alpha) and then the add of
   a tensor of the product's shape (the C operand, beta = 1), where each is the product's only
   user; any other elementwise epilogue is a loop fusion of its own: matmul + bias vector +
   gelu is 2 launches, x @ w * 0.5 + r is 1.
5. Sibling multi-output fusion. Reductions over the same input shape and dim, or loop fusions of
   the same output shape, that read a common tensor and do not depend on each other are one
   kernel (the sum and the sum of squares of one tensor).
6. One launch per kernel. A kernel reads each distinct tensor it needs once (a layout view costs
   its root; constants are free) and writes its outputs once; its time is the cost model's
   library-kernel formula (`cost.fused_kernel`: library GEMMs at the datasheet tensor-core peak).
7. Launches as jax.jit pays them (`cost.launch_charges`, the same charge mugraph's own kernels get
   on the same path): XLA launches each kernel from C++ (`jit_launch_s`), and records a run of at
   least `command_buffer_min_kernels` fusions / GEMMs into a command buffer (CUDA graph) replayed at
   `graph_launch_s` per kernel (XLA's defaults, cited in codegen/calibration.json). The eager
   figure (`Launch.EAGER`, 4 us per kernel from Python) is reported only as a second number.
Not modelled, each of which can make the real jax.jit faster than this estimate (so a speedup
against it is an upper bound where they apply): XLA's Triton softmax/normalisation fusion (one
kernel for a row softmax or a norm, on GPUs and XLA versions that enable it), cuBLASLt epilogue
fusion (bias, relu, gelu inside the GEMM), Triton GEMM fusion of operand prologues. `bench/gpu.py`
measures the real jax.jit.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import KNode
from mugraph.ir.ops import KERNEL_LAYOUT, KERNEL_LEAF, KERNEL_REDUCE, KOp, TOp
from mugraph.search.cost import Estimate, Launch, fused_kernel, kernel_node_flops, launch_charges, launch_path
from mugraph.search.targets import get_target


@dataclass(frozen=True)
class Stat:
    """The per-row statistic an rms_norm's reduction writes (one fp32 value per row)."""

    norm: KNode

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.norm.shape) // self.norm.shape[self.norm.arg[0]]


@dataclass(frozen=True)
class Fusion:
    """One kernel jax.jit would launch: what it computes, writes and reads."""

    kind: str                  # "loop" | "reduction" | "gemm" | "custom" | "library"
    roots: tuple               # what it writes: nodes (and Stats)
    members: tuple             # every node it computes, roots included, in program order
    reads: tuple               # tensors it reads from memory: graph inputs, other kernels' roots

    @property
    def name(self) -> str:
        ops = [m.op.value if isinstance(m, KNode) else "rms_norm stat" for m in self.members
               if not (isinstance(m, KNode) and m.op in KERNEL_LEAF)]
        shown = ", ".join(ops[:4]) + (f", ... ({len(ops)} ops)" if len(ops) > 4 else "")
        return f"{self.kind}: {shown}"

    @property
    def write_bytes(self) -> int:
        return sum(r.nbytes if isinstance(r, Stat) else _nbytes(r) for r in self.roots)


def _nbytes(node: KNode) -> int:
    return math.prod(node.shape) * node.dtype.itemsize


def _fusible(node: KNode) -> bool:
    """Ops XLA fuses into loop fusions (rule 1, and rule 3's elementwise half)."""
    return isinstance(node.op, TOp) or node.op in KERNEL_LAYOUT or node.op in (KOp.CONCAT,
                                                                               KOp.RMS_NORM)


def _root(node: KNode) -> KNode:
    while node.op in KERNEL_LAYOUT:
        node = node.srcs[0]
    return node


def _users(graph: KernelGraph) -> dict:
    users: dict = {}
    for node in graph.nodes:
        for s in dict.fromkeys(node.srcs):
            users.setdefault(s, []).append(node)
    return users


def _scalar_constant(node: KNode) -> bool:
    return node.op is KOp.CONSTANT and math.prod(node.shape) == 1


def _sole_user(node: KNode, users: dict, outputs: set):
    found = users.get(node, [])
    return found[0] if len(found) == 1 and node not in outputs else None


def gemm_epilogue(graph: KernelGraph, matmul: KNode) -> tuple:
    """What XLA's GEMM rewriting folds into the library call (rule 4): a multiply by a scalar
    constant (alpha) and then the add of a tensor of the output's own shape and dtype (the C
    operand, beta = 1), each only where it is the sole user of the product."""
    users, outputs, chain, node = _users(graph), set(graph.outputs), [], matmul
    user = _sole_user(node, users, outputs)
    if user is not None and user.op is TOp.MUL and any(_scalar_constant(s) for s in user.srcs):
        chain.append(user)
        node, user = user, _sole_user(user, users, outputs)
    if user is not None and user.op is TOp.ADD and user.srcs[0] is not user.srcs[1]:
        other = user.srcs[1] if user.srcs[0] is node else user.srcs[0]
        if other.shape == user.shape == node.shape and other.dtype is user.dtype:
            chain.append(user)
    return tuple(chain)


def _gemms(graph: KernelGraph) -> dict:
    """Each matmul's epilogue as XLA folds it: matmul -> absorbed nodes. When two products meet
    in one add, the later one (in program order) takes it, the earlier becomes its C operand."""
    out, taken = {}, set()
    for n in reversed(graph.nodes):
        if n.op is KOp.MATMUL:
            chain = gemm_epilogue(graph, n)
            if taken & set(chain):
                chain = tuple(c for c in chain if c.op is TOp.MUL and c not in taken)
            taken.update(chain)
            out[n] = chain
    return out


def _gemm_reads(matmul: KNode, chain) -> list:
    reads = list(matmul.srcs)
    for node, prev in zip(chain, (matmul,) + tuple(chain)):
        reads += [s for s in node.srcs if s is not prev and s.op is not KOp.CONSTANT]
    return reads


def _materialized(graph: KernelGraph, gemms: dict) -> set:
    """Values written to memory: graph outputs, reduction/matmul/custom results, and fusible
    values a matmul or custom kernel reads (through layout views)."""
    absorbed = {n for chain in gemms.values() for n in chain}
    out = {o for o in graph.outputs if o.op not in KERNEL_LEAF}
    for node in graph.nodes:
        if node.op in KERNEL_LEAF or node in absorbed:
            continue
        if node.op is KOp.MATMUL:
            chain = gemms[node]
            out.add(chain[-1] if chain else node)
            out.update(r for r in map(_root, _gemm_reads(node, chain)) if r.op not in KERNEL_LEAF)
        elif not _fusible(node):
            out.add(node)
            if node.op not in KERNEL_REDUCE:
                out.update(r for r in (_root(s) for s in node.srcs) if r.op not in KERNEL_LEAF)
    return out


def _closure(starts, materialized) -> tuple[list, list]:
    """The fusible, non-materialized producers of `starts` (computed in the kernel) and the
    tensors at its boundary (read from memory), each in first-seen order."""
    members, reads, seen, stack = [], [], set(), list(starts)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op is KOp.CONSTANT:
            members.append(node)
        elif node.op is KOp.INPUT or node in materialized:
            reads.append(node)
        else:
            members.append(node)
            stack.extend(node.srcs)
            if node.op is KOp.RMS_NORM:
                reads.append(Stat(node))
    return members, reads


def _order(graph: KernelGraph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return lambda m: index[m.norm] - 0.5 if isinstance(m, Stat) else index[m]


def _kernel_fusions(graph: KernelGraph) -> list[Fusion]:
    """Rules 1-4: one fusion per reduction, norm statistic, matmul/custom op and materialized
    fusible value."""
    gemms = _gemms(graph)
    absorbed = {n for chain in gemms.values() for n in chain}
    mat, key, out = _materialized(graph, gemms), _order(graph), []
    for node in graph.nodes:
        if node.op in KERNEL_LEAF or node in absorbed:
            continue
        if node.op is KOp.MATMUL:
            chain = gemms[node]
            out.append(_fusion("gemm", [chain[-1] if chain else node], [node, *chain],
                               _gemm_reads(node, chain), key))
            continue
        if node.op is KOp.RMS_NORM:
            members, reads = _closure(node.srcs, mat)
            out.append(_fusion("reduction", [Stat(node)], members, reads, key))
        if node.op in KERNEL_REDUCE:
            members, reads = _closure(node.srcs, mat)
            out.append(_fusion("reduction", [node], [node] + members, reads, key))
        elif not _fusible(node):
            kind = {KOp.MATMUL: "gemm", KOp.CUSTOM: "custom"}.get(node.op, "library")
            out.append(_fusion(kind, [node], [node], list(node.srcs), key))
        elif node in mat and not _bitcast(node, mat):
            members, reads = _closure([node], mat - {node})
            out.append(_fusion("loop", [node], members, reads, key))
    return out


def _bitcast(node: KNode, materialized: set) -> bool:
    """A reshape of an input, a constant or a value already written to memory (a reduction's
    keepdim result reshaped to drop the dim, as `jnp.max(x, axis=0)` lifts): XLA's bitcast, no
    kernel."""
    if node.op is not KOp.RESHAPE:
        return False
    while node.op is KOp.RESHAPE:
        node = node.srcs[0]
    return node.op in KERNEL_LEAF or node in materialized


def _fusion(kind, roots, members, reads, key) -> Fusion:
    def unique(items):
        return tuple(sorted(dict.fromkeys(items), key=key))
    return Fusion(kind, unique(roots), unique(members), unique(r for r in reads if not (
        isinstance(r, KNode) and r.op is KOp.CONSTANT)))


def _hero(f: Fusion):
    """What two fusions must share to be siblings (rule 5): the reduction's input shape and dim,
    or the loop fusion's output shape."""
    root = f.roots[0]
    if f.kind == "reduction":
        if isinstance(root, Stat):
            return ("reduction", root.norm.srcs[0].shape, root.norm.arg[0])
        return ("reduction", root.srcs[0].shape, root.arg)
    return (f.kind, root.shape) if f.kind == "loop" else None


def _depends(a: Fusion, b: Fusion, by_root: dict) -> bool:
    """Whether `a` reads, directly or not, what `b` writes."""
    stack, seen = list(a.reads), set()
    while stack:
        r = stack.pop()
        if r in b.roots:
            return True
        producer = by_root.get(r)
        if producer is not None and id(producer) not in seen:
            seen.add(id(producer))
            stack.extend(producer.reads)
    return False


def _merge_siblings(fusions: list[Fusion], key) -> list[Fusion]:
    """Rule 5, greedily in program order."""
    out: list[Fusion] = []
    for f in fusions:
        by_root = {r: g for g in out + [f] for r in g.roots}
        partner = next((g for g in out if _hero(g) is not None and _hero(g) == _hero(f)
                        and set(g.reads) & set(f.reads)
                        and not _depends(f, g, by_root) and not _depends(g, f, by_root)), None)
        if partner is None:
            out.append(f)
            continue
        merged = _fusion(f.kind, partner.roots + f.roots, partner.members + f.members,
                         partner.reads + f.reads, key)
        out[out.index(partner)] = merged
    return out


def xla_fusions(graph: KernelGraph) -> list[Fusion]:
    """The kernels jax.jit would launch for `graph`, under the rules of the module docstring."""
    if not isinstance(graph, KernelGraph):
        from mugraph.ir.errors import InvalidInput
        raise InvalidInput(f"xla_fusions takes a KernelGraph, got {type(graph).__name__}")
    return _merge_siblings(_kernel_fusions(graph), _order(graph))


def _flops(f: Fusion) -> tuple[int, int]:
    tc = simt = 0
    for m in f.members:
        if isinstance(m, Stat):
            continue
        if m.op is KOp.RMS_NORM and Stat(m) not in f.roots:
            a, b = 0, math.prod(m.shape)          # the elementwise half: x * r
        else:
            a, b = kernel_node_flops(m, pad=False)
        tc, simt = tc + a, simt + b
    for r in f.roots:
        if isinstance(r, Stat):
            tc, simt = tc + 0, simt + kernel_node_flops(r.norm, pad=False)[1]
    return tc, simt


_CACHE: "weakref.WeakKeyDictionary[KernelGraph, dict]" = weakref.WeakKeyDictionary()


def xla_estimate(graph: KernelGraph, target="h100", *, launch=Launch.JIT, cuda_graph: bool = False) -> Estimate:
    """The cost model's time for the kernels `xla_fusions` finds: the XLA-like baseline. Launches as jax.jit pays
    them by default (from C++, a run of ``command_buffer_min_kernels`` or more replayed as a command buffer: every
    fusion and library GEMM is capturable); ``launch=Launch.EAGER`` charges eager Python launches instead."""
    t, how = get_target(target), launch_path(launch, cuda_graph)
    per_graph = _CACHE.setdefault(graph, {})
    if (t, how) not in per_graph:
        fusions = xla_fusions(graph)
        kernels = []
        for f, charge in zip(fusions, launch_charges(t, [True] * len(fusions), how)):
            tensors = [r for r in f.reads if not isinstance(r, Stat)]
            stats = sum(r.nbytes for r in f.reads if isinstance(r, Stat))  # tiny, read once
            tc, simt = _flops(f)
            kernels.append(fused_kernel(f.name, tensors, f.write_bytes + stats, tc, simt, t, launch_s=charge))
        per_graph[(t, how)] = Estimate(
            t.name, sum(k.seconds for k in kernels), sum(k.hbm_bytes for k in kernels),
            sum(k.tc_flops for k in kernels), sum(k.simt_flops for k in kernels), len(kernels),
            tuple(kernels))
    return per_graph[(t, how)]
