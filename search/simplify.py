"""Simplification beyond fusion: rewrites of a found μGraph judged by the verifier's normaliser.

Each rule is one small function in `BLOCK_RULES` / `KERNEL_RULES`, applied bottom-up while a
graph is rebuilt; dead ops and unused block inputs fall away with the rebuild. Values are
compared by the normal form of their abstract expressions (`verify.abstract.normalize`), so
common subexpressions are shared modulo algebra (x - (x - (x - m)) is x - m), identities
vanish (x * 1 is x), and constants are recognised whatever computes them. The normaliser
abstracts dims away and is deliberately incomplete, so a rewrite is a proposal: the caller
re-verifies every simplified graph and keeps the original when the check fails.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from mugraph.ir import BlockGraph, BlockInput, BlockOutput, BNode, DType, KernelGraph, KNode, Phase
from mugraph.ir.errors import MugraphError
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.verify.abstract import block_expressions, expressions
from mugraph.verify.abstract import normalize as N


@dataclass
class _Walk:
    """What a bottom-up rebuild knows: each value's normal form, phase and users, and the values
    kept so far by (normal form, shape)."""

    forms: dict
    phases: dict
    users: dict
    outputs: frozenset
    kept: dict = field(default_factory=lambda: defaultdict(list))
    uses: dict = field(default_factory=lambda: defaultdict(int))   # rebuilt node -> readers
    fired: list = field(default_factory=list)


# ---- block rules: (new node, original node, walk) -> replacement or None -------------------------
def _replaceable(old_phase: Phase, new_phase: Phase, is_output: bool) -> bool:
    """May a value of `old_phase` be read from an earlier value of `new_phase` instead?"""
    if is_output and new_phase not in (Phase.ACCUMULATOR, Phase.EPILOGUE):
        return False
    if old_phase is new_phase:
        return True
    return (old_phase is Phase.LOOP and new_phase is Phase.INVARIANT) or \
        (old_phase is Phase.EPILOGUE and new_phase in (Phase.ACCUMULATOR, Phase.INVARIANT))


def share_equal_values(new, old, walk: _Walk):
    """A value equal to an earlier one (same normal form and shape, rounded alike) reads the
    earlier one."""
    form = walk.forms.get(old)
    if form is None:
        return None
    for earlier, phase in walk.kept[(form, old.shape)]:
        if earlier is not new and _rounded_alike(earlier, old) and \
                _replaceable(walk.phases[old], phase, old in walk.outputs):
            return earlier
    return None


def _rounded_alike(earlier, old) -> bool:
    """Equal forms are equal in real arithmetic; in the kernel, a value cast to 16 bits is its
    rounding (the program's), so it stands only for a value of its dtype, and an fp32 value for
    an fp32 one or an input tile (exact in fp32)."""
    return earlier.dtype is old.dtype or (not old.dtype.is_16bit and earlier.op is BOp.INPUT)


def fold_constant(new, old, walk: _Walk):
    """A value whose normal form is a constant, read only by elementwise ops, is that constant."""
    form = walk.forms.get(old)
    if form is None or new.op is BOp.CONSTANT or old in walk.outputs:
        return None
    value = N.constant_value(form)
    if value is None or not walk.users[old] or \
            not all(isinstance(u.op, TOp) or u.op is BOp.THREAD for u in walk.users[old]):
        return None
    return BNode(BOp.CONSTANT, (), (float(value), (1,), DType.FLOAT32))


_SUMS = frozenset({BOp.ACC_SUM, BOp.ACC_SUM_LAST, BOp.REDUCE_SUM})


def factor_out_of_sum(new, old, walk: _Walk):
    """sum(a * b) = sum(a) * b when b is constant along what is summed (also a / b), and
    (a * r) @ w = (a @ w) * r for a row scale r: the product runs once on the smaller result."""
    if new.op is BOp.MATMUL:
        return _factor_matmul(new, walk)
    if new.op not in _SUMS:
        return None
    prod = new.srcs[0]
    if prod.op not in (TOp.MUL, TOp.DIV) or walk.uses.get(prod, 0) > 1:
        return None
    a, b = prod.srcs
    if prod.op is TOp.MUL and not _constant_along(new, a, b, walk):
        a, b = b, a
    if not _constant_along(new, a, b, walk):
        return None
    summed = BNode(new.op, (a,), new.arg)
    return BNode(prod.op, (summed, b))


def _constant_along(sum_node, a, b, walk) -> bool:
    """Is `b` constant along what `sum_node` sums, `a` carrying the product's whole shape?"""
    if a.shape != sum_node.srcs[0].shape:
        return False
    if sum_node.op is BOp.REDUCE_SUM:
        return _broadcast_along(b.shape, len(a.shape), sum_node.arg)
    across_loop = walk.phases.get(b) is Phase.INVARIANT and walk.phases.get(a) is Phase.LOOP
    if sum_node.op is BOp.ACC_SUM_LAST:
        return across_loop and _broadcast_along(b.shape, len(a.shape), len(a.shape) - 1)
    return across_loop


def _broadcast_along(shape, rank: int, dim: int) -> bool:
    """Does a tensor of `shape`, broadcast to `rank` dims, hold one value along `dim`?"""
    i = dim - (rank - len(shape))
    return i < 0 or shape[i] == 1


def _factor_matmul(new, walk: _Walk):
    left, right = new.srcs
    if left.op not in (TOp.MUL, TOp.DIV) or walk.uses.get(left, 0) > 1:
        return None
    a, r = left.srcs
    if left.op is TOp.MUL and a.shape != left.shape:
        a, r = r, a
    if a.shape != left.shape or not _broadcast_along(r.shape, len(a.shape), len(a.shape) - 1):
        return None
    product = BNode(BOp.MATMUL, (a, right))
    if _size(product.shape) > _size(left.shape):
        return None          # scaling the result would cost more than scaling the operand
    return BNode(left.op, (product, r))


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


BLOCK_RULES = [("share-equal-values", share_equal_values), ("fold-constant", fold_constant),
               ("factor-out-of-sum", factor_out_of_sum)]


# ---- block graphs ----------------------------------------------------------------------------------
def _users(nodes) -> dict:
    users = defaultdict(list)
    for n in nodes:
        for s in set(n.srcs):
            users[s].append(n)
    return users


def _forms(exprs: dict) -> dict:
    forms = {}
    for node, expr in exprs.items():
        try:
            forms[node] = N.normalize(expr)
        except N.Overflow:
            forms[node] = None
    return forms


def plain(bg: BlockGraph) -> BlockGraph:
    """The block graph with every thread graph (BOp.THREAD) expanded into its elementwise ops,
    so the rules see each op; `fuse_threads` regroups them afterwards."""
    from mugraph.ir.node import toposort
    from mugraph.ir.thread import expand
    mapping: dict = {}
    for n in toposort([o.node for o in bg.outputs]):
        new = n if n.op in (BOp.INPUT, BOp.CONSTANT) else _rebuild(n, mapping)
        mapping[n] = expand(new) if new.op is BOp.THREAD else new
    if all(mapping[n] is n for n in mapping):
        return bg
    return BlockGraph(bg.grid, bg.threads, bg.forloop, bg.inputs,
                      tuple(BlockOutput(mapping[o.node], o.omap, o.dtype, o.shape)
                            for o in bg.outputs))


def simplify_block(bg: BlockGraph, input_exprs) -> tuple[BlockGraph, list, list[str]]:
    """(simplified graph, indices of the inputs it still reads, rules fired); thread graphs are
    expanded for the rules and regrouped after them."""
    from mugraph.ir.thread import fuse_threads
    graph, kept, fired = _simplify_plain(plain(bg), input_exprs)
    return (fuse_threads(graph) if fired else bg), kept if fired else list(range(len(bg.inputs))), fired


def _simplify_plain(bg: BlockGraph, input_exprs) -> tuple[BlockGraph, list, list[str]]:
    nodes = bg.nodes
    walk = _Walk(_forms(block_expressions(bg, input_exprs)), bg.phases(), _users(nodes),
                 frozenset(o.node for o in bg.outputs))
    mapping: dict = {}
    for old in nodes:
        new = old if old.op in (BOp.INPUT, BOp.CONSTANT) else _rebuild(old, mapping)
        new = _apply(BLOCK_RULES, new, old, walk)
        mapping[old] = new
        walk.uses[new] += len(walk.users.get(old, ())) + (old in walk.outputs)
        walk.phases.setdefault(new, walk.phases[old])
        if walk.forms.get(old) is not None:
            walk.kept[(walk.forms[old], old.shape)].append((new, walk.phases[old]))
    outputs = [BlockOutput(mapping[o.node], o.omap, o.dtype, o.shape) for o in bg.outputs]
    return _reindexed(bg, outputs) + (walk.fired,)


def _apply(rules, new, old, walk):
    for name, rule in rules:
        hit = rule(new, old, walk)
        if hit is not None and hit is not new:
            walk.fired.append(name)
            return hit
    return new


def _rebuild(node, mapping):
    srcs = tuple(mapping.get(s, s) for s in node.srcs)
    return node if srcs == node.srcs else type(node)(node.op, srcs, node.arg)


def _reindexed(bg: BlockGraph, outputs) -> tuple[BlockGraph, list]:
    """The block graph over the inputs its outputs still read, renumbered in order."""
    from mugraph.ir.node import toposort
    used = [n for n in bg.inputs if n in set(toposort([o.node for o in outputs]))]
    mapping = {}
    for i, n in enumerate(used):
        a = n.arg
        mapping[n] = BNode(BOp.INPUT, (), BlockInput(i, a.shape, a.dtype, a.imap, a.fmap,
                                                     a.grid, a.forloop))
    for n in toposort([o.node for o in outputs]):
        if n not in mapping:
            mapping[n] = _rebuild(n, mapping)
    outs = tuple(BlockOutput(mapping[o.node], o.omap, o.dtype, o.shape) for o in outputs)
    graph = BlockGraph(bg.grid, bg.threads, bg.forloop, tuple(mapping[n] for n in used), outs)
    return graph, [n.arg.index for n in used]


# ---- kernel graphs ---------------------------------------------------------------------------------
def constant_output(new, old, walk: _Walk):
    """An output whose normal form is a constant is that constant, computed by no kernel."""
    form = walk.forms.get(old)
    if form is None or old not in walk.outputs or new.op is KOp.CONSTANT:
        return None
    value = N.constant_value(form)
    return None if value is None else KNode(KOp.CONSTANT, (), (float(value), old.shape, old.dtype))


def share_equal_tensors(new, old, walk: _Walk):
    """A tensor equal to an earlier one (normal form, shape, dtype) is that one."""
    form = walk.forms.get(old)
    if form is None or new.op in (KOp.INPUT, KOp.CONSTANT):
        return None
    for earlier, dtype in walk.kept[(form, old.shape)]:
        if earlier is not new and dtype is old.dtype:
            return earlier
    return None


KERNEL_RULES = [("constant-output", constant_output), ("share-equal-tensors", share_equal_tensors)]


def simplify(graph: KernelGraph) -> tuple[KernelGraph, list[str]]:
    """The graph rewritten by every rule (block graphs first), and the rules that fired.

    Returns the graph itself when nothing fired or a rewrite does not form a valid graph."""
    try:
        return _simplify(graph)
    except (MugraphError, N.Overflow):
        return graph, []


def _simplify(graph: KernelGraph):
    exprs = expressions(graph)
    walk = _Walk(_forms(exprs), {}, _users(graph.nodes), frozenset(graph.outputs))
    mapping: dict = {}
    blocks: dict = {}
    for old in graph.nodes:
        if old.op is KOp.CUSTOM:
            new = _custom(old, mapping, blocks, exprs, walk)
        else:
            new = old if old.op in (KOp.INPUT, KOp.CONSTANT) else _rebuild(old, mapping)
        new = _apply(KERNEL_RULES, new, old, walk)
        mapping[old] = new
        if walk.forms.get(old) is not None:
            walk.kept[(walk.forms[old], old.shape)].append((new, old.dtype))
    if not walk.fired:
        return graph, []
    out = KernelGraph([mapping[o] for o in graph.outputs], graph.inputs, graph.output_names)
    return out, walk.fired


def _custom(old, mapping, blocks, exprs, walk):
    bg, index = old.arg
    key = (bg, old.srcs)
    if key not in blocks:
        simpler, kept, fired = simplify_block(bg, [exprs[s] for s in old.srcs])
        walk.fired.extend(fired)
        blocks[key] = (simpler, tuple(mapping[old.srcs[i]] for i in kept))
    simpler, srcs = blocks[key]
    return KNode(KOp.CUSTOM, srcs, (simpler, index))


def op_count(graph: KernelGraph) -> int:
    """Kernel ops plus every block graph's ops (inputs and constants excluded), each op of a
    thread graph counted."""
    from mugraph.ir.thread import ops_of
    kernel = sum(1 for n in graph.nodes if n.op not in (KOp.INPUT, KOp.CONSTANT, KOp.IOTA))
    block = sum(len(ops_of(n.arg)) if n.op is BOp.THREAD else 1
                for bg, _ in graph.custom_ops() for n in bg.nodes
                if n.op not in (BOp.INPUT, BOp.CONSTANT))
    return kernel + block
