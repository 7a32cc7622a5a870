"""Canonicalising rewrites applied to a spec before search: one pattern + one small function each.

They lift idioms the front end spells out op by op into the IR's composite ops, so the search
treats e.g. an RMSNorm as one step (as Mirage's spec language does) while its abstract
expression still lets the search split it across accumulators.
"""
from __future__ import annotations

from collections import Counter

from mugraph.ir import KernelGraph, KNode
from mugraph.ir.ops import KOp, TOp


def _const(node: KNode):
    return node.arg[0] if node.op is KOp.CONSTANT and all(d == 1 for d in node.shape) else None


def _other(node: KNode, known: KNode):
    a, b = node.srcs
    return b if a is known else a if b is known else None


def lift_rms_norm(node: KNode, uses: Counter):
    """x * rsqrt(sum(x*x, d) / n + eps) with n = x.shape[d]  ->  rms_norm(x, d, eps)."""
    if node.op is not TOp.MUL:
        return None
    for r in node.srcs:
        x = _other(node, r)
        if x is None or r.op is not TOp.RSQRT or uses[r] != 1:
            continue
        t = r.srcs[0]
        if t.op is not TOp.ADD or uses[t] != 1:
            continue
        eps_node = next((s for s in t.srcs if _const(s) is not None), None)
        ms = _other(t, eps_node) if eps_node is not None else None
        if ms is None or ms.op is not TOp.DIV or uses[ms] != 1 or _const(ms.srcs[1]) is None:
            continue
        s = ms.srcs[0]
        if s.op is not KOp.REDUCE_SUM or uses[s] != 1:
            continue
        sq = s.srcs[0]
        dim = s.arg
        ok = sq.op is TOp.MUL and sq.srcs == (x, x) or sq.op is TOp.SQUARE and sq.srcs == (x,)
        if ok and uses[sq] == 1 and _const(ms.srcs[1]) == float(x.shape[dim]) and \
                _const(eps_node) >= 0:
            return x.rms_norm(dim, _const(eps_node)).replace() if node.dtype is x.dtype else None
    return None


RULES = [("lift-rms-norm", lift_rms_norm)]


def canonicalize(graph: KernelGraph, rules=RULES) -> tuple[KernelGraph, list[str]]:
    """Apply every rule bottom-up until none fires; return the graph and the rules that fired."""
    fired: list[str] = []
    changed = True
    while changed:
        changed = False
        uses = Counter(s for n in graph.nodes for s in n.srcs) + Counter(graph.outputs)
        mapping: dict[KNode, KNode] = {}
        for node in graph.nodes:
            new = _rebuild(node, mapping)
            for name, rule in rules:
                hit = rule(node, uses) if new is node else None
                if hit is not None:
                    new = hit
                    fired.append(name)
                    changed = True
                    break
            mapping[node] = new
        graph = KernelGraph([mapping[o] for o in graph.outputs], graph.inputs, graph.output_names)
    return graph, fired


def _rebuild(node: KNode, mapping: dict) -> KNode:
    srcs = tuple(mapping.get(s, s) for s in node.srcs)
    return node if srcs == node.srcs else node.replace(srcs=srcs)
