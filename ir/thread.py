"""The thread level: small DAGs of elementwise ops that one block op applies in registers.

A `TNode` is an interned, shape-free elementwise expression over the operands (`param(i)`) and
scalar constants; a block node `BNode(BOp.THREAD, operands, root)` applies it per element, so an
activation polynomial or a norm's arithmetic is one block op. Its meaning is the plain block
graph it stands for (`expand`): every table (interpreter, finite field, abstract expressions,
degrees) reads a thread graph through `evaluate`. `fuse_threads` turns a block graph's maximal
elementwise regions into thread graphs; `thread_chains` marks register chains for the printer.
"""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.node import BNode, _Interned, toposort
from mugraph.ir.ops import ARITY, BOp, TOp


class Leaf(Enum):
    """The leaves of a thread graph: an operand of the block op, or a scalar constant."""

    PARAM = "param"   # arg: operand index
    CONST = "const"   # arg: the value (fp32, like every block constant)


class TNode(_Interned):
    """One node of a thread graph: an elementwise op (`TOp`) or a leaf (`Leaf`)."""

    __slots__ = ("op", "srcs", "arg")

    def __new__(cls, op, srcs: tuple = (), arg=None):
        srcs = tuple(srcs)
        _check(op, srcs, arg)

        def build(obj):
            for name, value in (("op", op), ("srcs", srcs), ("arg", arg)):
                object.__setattr__(obj, name, value)

        return cls._intern((op, srcs, arg), build)

    def __repr__(self) -> str:
        return f"TNode({text(self)})"

    def __str__(self) -> str:
        return text(self)


def _check(op, srcs, arg) -> None:
    if op is Leaf.PARAM:
        ok = not srcs and isinstance(arg, int) and not isinstance(arg, bool) and arg >= 0
    elif op is Leaf.CONST:
        ok = not srcs and isinstance(arg, float)
    elif op in ARITY:
        ok = len(srcs) == ARITY[op] and all(type(s) is TNode for s in srcs) and \
            (op is not TOp.CAST or isinstance(arg, DType))
    else:
        ok = False
    if not ok:
        raise InvalidGraph(f"not a thread-graph node: {getattr(op, 'value', op)!r} over "
                           f"{len(srcs)} operand(s) with argument {arg!r}",
                           hint="thread graphs hold elementwise ops over param(i) and const(v)")


def param(i: int) -> TNode:
    return TNode(Leaf.PARAM, (), int(i))


def const(value: float) -> TNode:
    return TNode(Leaf.CONST, (), float(value))


def apply(root: TNode, *operands: BNode) -> BNode:
    """The block node that applies thread graph `root` to `operands` (param(i) is operands[i])."""
    return BNode(BOp.THREAD, operands, root)


def tnodes(root: TNode) -> list[TNode]:
    """The nodes of a thread graph, every node after its sources."""
    return toposort([root])


def ops_of(root: TNode) -> list[TNode]:
    """The elementwise ops of a thread graph (its leaves excluded), in order."""
    return [t for t in tnodes(root) if isinstance(t.op, TOp)]


def arity(root: TNode) -> int:
    return 1 + max((t.arg for t in tnodes(root) if t.op is Leaf.PARAM), default=-1)


def text(root: TNode) -> str:
    """`t0 = exp(p0); add(t0, mul(t0, 0.5))`: an op read twice is named once."""
    uses = Counter(s for t in tnodes(root) for s in t.srcs)
    names: dict = {}
    lets = []
    for t in tnodes(root):
        if uses[t] > 1 and isinstance(t.op, TOp):
            lets.append(f"t{len(lets)} = {_body(t, names)}")
            names[t] = f"t{len(lets) - 1}"
    return "; ".join(lets + [names.get(root) or _body(root, names)])


def _body(t: TNode, names: dict) -> str:
    if t.op is Leaf.PARAM:
        return f"p{t.arg}"
    if t.op is Leaf.CONST:
        return f"{t.arg:g}"
    parts = [names.get(s) or _body(s, names) for s in t.srcs]
    parts += [t.arg.short] if isinstance(t.arg, DType) else \
        [f"{v:g}" for v in t.arg] if t.arg is not None else []
    return f"{t.op.value}({', '.join(parts)})"


# ---- JSON: a list of entries, each after its sources ------------------------------------------------
def to_entries(root: TNode) -> list[dict]:
    order = tnodes(root)
    index = {t: i for i, t in enumerate(order)}
    out = []
    for t in order:
        entry = {"op": t.op.value}
        if t.srcs:
            entry["srcs"] = [index[s] for s in t.srcs]
        if t.arg is not None:
            entry["arg"] = list(t.arg) if isinstance(t.arg, tuple) else \
                t.arg.value if isinstance(t.arg, DType) else t.arg
        out.append(entry)
    return out


def from_entries(entries) -> TNode:
    """The thread graph a `to_entries` list describes (InvalidGraph on anything malformed)."""
    if not isinstance(entries, list) or not entries:
        raise InvalidGraph(f"a thread graph is a non-empty list of entries, got {entries!r:.60}")
    built: list[TNode] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise InvalidGraph(f"thread entry {i} is not an object", field=f"arg[{i}]")
        op = _op(e.get("op"), i)
        refs = e.get("srcs", [])
        if not isinstance(refs, list) or not all(isinstance(r, int) and 0 <= r < i for r in refs):
            raise InvalidGraph(f"thread entry {i} names sources {refs!r} that are not earlier "
                               "entries", field=f"arg[{i}].srcs")
        arg = e.get("arg")
        arg = tuple(float(v) for v in arg) if isinstance(arg, list) else \
            float(arg) if op is Leaf.CONST and isinstance(arg, (int, float)) else \
            DType.parse(arg, field=f"arg[{i}].arg") if op is TOp.CAST and isinstance(arg, str) else arg
        built.append(TNode(op, tuple(built[r] for r in refs), arg))
    return built[-1]


def _op(name, i: int):
    for enum in (Leaf, TOp):
        try:
            return enum(name)
        except ValueError:
            continue
    raise InvalidGraph(f"thread entry {i}: unknown op {name!r}", field=f"arg[{i}].op")


# ---- meaning: the plain block graph a thread node stands for ---------------------------------------
_EXPANSIONS: "weakref.WeakKeyDictionary[BNode, BNode]" = weakref.WeakKeyDictionary()


def expand(node: BNode) -> BNode:
    """The plain elementwise block nodes that `node` (a THREAD node) computes, over its operands."""
    found = _EXPANSIONS.get(node)
    if found is None:
        made: dict = {}
        for t in tnodes(node.arg):
            made[t] = _expand_one(t, made, node.srcs)
        found = _EXPANSIONS[node] = made[node.arg]
    return found


def _expand_one(t: TNode, made, operands) -> BNode:
    if t.op is Leaf.PARAM:
        return operands[t.arg]
    if t.op is Leaf.CONST:
        return BNode(BOp.CONSTANT, (), (t.arg, (1,), DType.FLOAT32))
    return BNode(t.op, tuple(made[s] for s in t.srcs), t.arg)


def evaluate(node: BNode, values, apply):
    """Fold a THREAD node: `values` are its operands', `apply(plain_node, source_values)` gives
    each expanded node's (constants included, with no sources)."""
    known = dict(zip(node.srcs, values))
    for n in _inner(node):
        known[n] = apply(n, [known[s] for s in n.srcs])
    return known[expand(node)]


_INNER: "weakref.WeakKeyDictionary[BNode, tuple]" = weakref.WeakKeyDictionary()


def _inner(node: BNode) -> tuple:
    """The expanded nodes of a THREAD node in order, its operands (and what they read) excluded."""
    found = _INNER.get(node)
    if found is None:
        stop, order, seen = set(node.srcs), [], set()
        stack = [(expand(node), False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
            elif n not in seen and n not in stop:
                seen.add(n)
                stack.append((n, True))
                stack.extend((s, False) for s in reversed(n.srcs))
        found = _INNER[node] = tuple(order)
    return found


def thread_shape(op, srcs, arg):
    """The shape rule of a THREAD node: its operands broadcast together, in fp32 (or in the
    dtype its root casts to: a block value's dtype is its last rounding)."""
    from mugraph.ir.shapes import broadcast
    if not isinstance(arg, TNode) or not isinstance(arg.op, TOp):
        raise InvalidGraph(f"a thread op needs a thread graph rooted at an elementwise op, got "
                           f"{arg!r}", hint="build one with ir.thread.param / const and TNode")
    if arity(arg) != len(srcs) or not srcs:
        raise InvalidGraph(f"the thread graph {text(arg)} reads {arity(arg)} operand(s), the "
                           f"op has {len(srcs)}")
    shape = srcs[0].shape
    for s in srcs[1:]:
        shape = broadcast(op, shape, s.shape)
    return shape, arg.arg if arg.op is TOp.CAST else DType.FLOAT32


# ---- turning a block graph's elementwise regions into thread graphs ----------------------------------
ELEMENTWISE = frozenset(TOp) | {BOp.THREAD}


def _scalar_constant(n: BNode) -> bool:
    return n.op is BOp.CONSTANT and all(d == 1 for d in n.shape)


def fusible_regions(outputs, phase) -> dict[BNode, BNode]:
    """{member: root}: each elementwise node read only by one elementwise op of the same phase
    joins its reader's region, so every region has one root and is computed where it is read."""
    order = toposort(outputs)
    readers: dict = {}
    for n in order:
        for s in set(n.srcs):
            readers.setdefault(s, []).append(n)
    for o in outputs:
        readers.setdefault(o, []).append(None)
    root_of: dict = {}
    for n in reversed(order):
        if n.op not in ELEMENTWISE:
            continue
        r = readers.get(n, [])
        joins = len(r) == 1 and r[0] is not None and r[0].op in ELEMENTWISE \
            and phase[r[0]] is phase[n]
        root_of[n] = root_of[r[0]] if joins else n
    return root_of


def region_graph(root: BNode, root_of: dict) -> tuple[TNode, tuple[BNode, ...]]:
    """The thread graph of one region and its operands (values from outside the region)."""
    operands: list[BNode] = []
    made: dict = {}

    def build(n: BNode) -> TNode:
        if n in made:
            return made[n]
        if root_of.get(n) is root and n.op is BOp.THREAD:
            sub = [build(s) for s in n.srcs]
            t = _substitute(n.arg, sub)
        elif root_of.get(n) is root:
            t = TNode(n.op, tuple(build(s) for s in n.srcs), n.arg)
        elif _scalar_constant(n):
            t = const(n.arg[0])
        else:
            if n not in operands:
                operands.append(n)
            t = param(operands.index(n))
        made[n] = t
        return t

    return build(root), tuple(operands)


def map_constants(root: TNode, fn) -> TNode:
    """The same thread graph with every constant v replaced by fn(v)."""
    made: dict = {}
    for t in tnodes(root):
        made[t] = const(fn(t.arg)) if t.op is Leaf.CONST else t if t.op is Leaf.PARAM else \
            TNode(t.op, tuple(made[s] for s in t.srcs), t.arg)
    return made[root]


def _substitute(root: TNode, args: list[TNode]) -> TNode:
    made: dict = {}
    for t in tnodes(root):
        made[t] = args[t.arg] if t.op is Leaf.PARAM else t if t.op is Leaf.CONST else \
            TNode(t.op, tuple(made[s] for s in t.srcs), t.arg)
    return made[root]


def fuse_threads(graph):
    """The same block graph with each elementwise region of two or more ops (or one that already
    holds a thread graph) as one THREAD node."""
    from mugraph.ir.block import BlockGraph, BlockOutput
    outs = [o.node for o in graph.outputs]
    root_of = fusible_regions(outs, graph.phases())
    sizes = Counter(root_of.values())
    mapping: dict = {}
    for n in toposort(outs):
        srcs = tuple(mapping[s] for s in n.srcs)
        if root_of.get(n) is n and (sizes[n] > 1 or n.op is BOp.THREAD):
            tg, operands = region_graph(n, root_of)
            mapping[n] = BNode(BOp.THREAD, tuple(mapping[o] for o in operands), tg)
        elif n.op is BOp.INPUT or not n.srcs:
            mapping[n] = n
        else:
            mapping[n] = n.replace(srcs=srcs)
    if all(mapping[n] is n for n in mapping):
        return graph
    return BlockGraph(graph.grid, graph.threads, graph.forloop, graph.inputs,
                      tuple(BlockOutput(mapping[o.node], o.omap, o.dtype, o.shape)
                            for o in graph.outputs))


# ---- chains: the printer's view of register epilogues ---------------------------------------------
@dataclass(frozen=True)
class ThreadChain:
    leader: BNode
    ops: tuple[BNode, ...]   # elementwise links applied in registers, in order

    @property
    def tail(self) -> BNode:
        return self.ops[-1] if self.ops else self.leader


def _link_operand(n: BNode):
    """The single non-constant operand of an elementwise op, or None if it has several."""
    if n.op not in ELEMENTWISE:
        return None
    operands = [s for s in n.srcs if not _scalar_constant(s)]
    return operands[0] if len(operands) == 1 else None


def thread_chains(outputs) -> list[ThreadChain]:
    """Partition the non-constant nodes reachable from `outputs` into chains, in program order.

    A chain starts at a *leader* (a matmul, a reduction, an accumulator, an input tile or any
    value with several consumers) and continues through elementwise ops whose only operand that
    is not a scalar constant is the previous link, and which no other op reads.
    """
    order = toposort(outputs)
    uses = Counter(s for n in order for s in set(n.srcs))
    for o in outputs:
        uses[o] += 1
    link_of = {}
    for n in order:
        prev = _link_operand(n)
        if prev is not None and uses[prev] == 1 and prev.op is not BOp.INPUT \
                and prev.op is not BOp.CONSTANT and n.shape == prev.shape:
            link_of[n] = prev
    chains, start = {}, {}
    for n in order:
        if _scalar_constant(n):
            continue
        if n in link_of:
            head = start[link_of[n]]
            start[n] = head
            chains[head].append(n)
        else:
            start[n] = n
            chains[n] = []
    return [ThreadChain(head, tuple(ops)) for head, ops in chains.items()]


def chain_links(outputs) -> set[BNode]:
    """The nodes that are fused into their producer's register epilogue."""
    return {op for c in thread_chains(outputs) for op in c.ops}
