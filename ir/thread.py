"""The thread level: chains of elementwise ops that run in registers after the op that feeds them.

A chain starts at a *leader* (a matmul, a reduction, an accumulator, an input tile or any value
with several consumers) and continues through elementwise ops whose only operand that is not a
scalar constant is the previous link, and which no other op reads. Codegen emits each chain as
one register epilogue; the printer marks chain links.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mugraph.ir.node import BNode, toposort
from mugraph.ir.ops import BOp, TOp


@dataclass(frozen=True)
class ThreadChain:
    leader: BNode
    ops: tuple[BNode, ...]   # elementwise links applied in registers, in order

    @property
    def tail(self) -> BNode:
        return self.ops[-1] if self.ops else self.leader


def _scalar_constant(n: BNode) -> bool:
    return n.op is BOp.CONSTANT and all(d == 1 for d in n.shape)


def _link_operand(n: BNode):
    """The single non-constant operand of an elementwise op, or None if it has several."""
    if not isinstance(n.op, TOp):
        return None
    operands = [s for s in n.srcs if not _scalar_constant(s)]
    return operands[0] if len(operands) == 1 else None


def thread_chains(outputs) -> list[ThreadChain]:
    """Partition the non-constant nodes reachable from `outputs` into chains, in program order."""
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
