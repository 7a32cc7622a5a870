"""Depth-first enumeration of kernel graphs, op by op: library ops and custom (block-graph) ops.

A state is the set of tensors available so far (the spec's inputs, then every tensor a kernel
op produced). Each step adds one kernel op in canonical order; a custom op opens a block graph
whose body `BlockEnumerator` builds. A state whose tensors include every spec output (same
shape, equal abstract expression) yields a candidate kernel graph.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from mugraph.ir import KernelGraph, KNode, custom
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.ops import BINARY, COMMUTATIVE, KOp, TERNARY, TOp, UNARY, is_mask
from mugraph.search.block_enum import BlockEnumerator, Goal
from mugraph.search.casts import cast_targets, spec_casts
from mugraph.search.context import Reject
from mugraph.search.labels import UNIT_DIM, checked_labels
from mugraph.search.leaves import is_index_leaf
from mugraph.search.schedules import reduced_sizes, skeletons
from mugraph.search.views import (as_shape, output_chain, over_inputs, rebuilt_chain,
                                  same_extents, view_tensors)
from mugraph.verify.abstract import normalize as N

_KIND_RANK = {op: i for i, op in enumerate(list(KOp) + list(TOp))}


@dataclass(frozen=True)
class Tensor:
    """A kernel tensor the search can use, with its abstract expression and dim labels."""

    node: KNode
    expr: object
    labels: tuple


@dataclass(frozen=True)
class Step:
    """One kernel op of a candidate: a library node, or a custom op's choice (for replay)."""

    key: tuple
    produced: tuple        # Tensors


def _no_dead_outputs(graph: KernelGraph) -> bool:
    """Every output of every custom kernel is used (else the kernel computes something wasted)."""
    used = {(n.arg[0], n.srcs, n.arg[1]) for n in graph.nodes if n.op is KOp.CUSTOM}
    return all((bg, srcs, i) in used for bg, srcs in graph.custom_ops()
               for i in range(len(bg.outputs)))


class KernelEnumerator:
    """Enumerates kernel graphs over `inputs` (Tensors of the reduced spec) up to a depth."""

    def __init__(self, ctx, inputs, spec_outputs):
        self.ctx = ctx
        self.graph_inputs = [t.node for t in inputs]
        self.inputs = view_tensors(ctx, inputs, Tensor)   # the inputs and their layout views
        self.spec_outputs = spec_outputs          # [(KNode, expr)]
        self.block_cache: dict = {}
        self.casts = spec_casts(ctx.spec)

    # ---- top level: coarse tasks for the executors ---------------------------------------------
    def root_tasks(self, depth: int) -> list[tuple]:
        """Independent subtrees at the root: all library first ops, then one per (inputs, skeleton)."""
        tasks = [("library",)]
        goal = self._goal(self.inputs, final=depth == 1)
        for subset in self._subsets(self.inputs, goal):
            srcs = [self.inputs[i] for i in subset]
            for si, _ in enumerate(self._skeletons(srcs, goal)):
                tasks.append(("custom", subset, si))
        return tasks

    def _subsets(self, tensors, goal):
        """Input sets for a custom op; the last kernel must read every input its targets need.
        Index leaves (iotas, which a kernel could compute from its position) come on top of
        `max_block_inputs`: a causal mask adds two to the Q, K, V of an attention."""
        cfg = self.ctx.config
        needed = set()
        for expr, *_ in goal.targets:
            needed |= self.ctx.pruner.variables(expr)
        index = [i for i, t in enumerate(tensors) if is_index_leaf(t.node)]
        plain = [i for i in range(len(tensors)) if i not in index]
        extras = [c for k in range(len(index) + 1) for c in itertools.combinations(index, k)]
        for k in range(1, cfg.max_block_inputs + 1):
            for chosen in itertools.combinations(plain, k):
                for extra in extras:
                    subset = tuple(sorted(chosen + extra))
                    have = set()
                    for i in subset:
                        have |= self.ctx.pruner.variables(tensors[i].expr)
                    if needed <= have:
                        yield subset

    def _skeletons(self, srcs, goal):
        return skeletons(srcs, self.ctx.is_reduction, final=goal.final)

    def run_task(self, task, depth: int):
        """Yield candidate KernelGraphs with at most `depth` kernel ops whose first op is in `task`."""
        pos = {t.node: i for i, t in enumerate(self.inputs)}
        if task[0] == "library":
            firsts = self._library_steps(self.inputs, pos)
        else:
            _, subset, si = task
            srcs = [self.inputs[i] for i in subset]
            goal = self._goal(self.inputs, final=depth == 1)
            sk = self._skeletons(srcs, goal)[si]
            firsts = (step for bi, closed in enumerate(self._blocks(srcs, sk, goal))
                      for step in [self._custom_step(srcs, closed, self.inputs, subset, si, bi)]
                      if step is not None)
        for step in firsts:
            yield from self._after(self.inputs, step, depth - 1, self._custom_left(step))

    def _custom_left(self, step, left=None) -> int:
        left = self.ctx.config.max_custom_ops if left is None else left
        return left - (1 if step.key[2] == _KIND_RANK[KOp.CUSTOM] else 0)

    def _after(self, tensors, step, depth, custom_left):
        tensors = tensors + list(step.produced)
        self.ctx.counters.states += 1
        self.ctx.budget.check(self.ctx.counters)
        found = self._complete(tensors)
        if found is not None:
            yield found
            return
        if depth <= 0:
            return
        for nxt in self._steps(tensors, step.key, custom_left, final=depth == 1):
            yield from self._after(tensors, nxt, depth - 1, self._custom_left(nxt, custom_left))

    # ---- completion ---------------------------------------------------------------------------
    def _complete(self, tensors) -> KernelGraph | None:
        outs = []
        for node, expr in self.spec_outputs:
            match = next((t for t in reversed(tensors) if same_extents(t.node.shape, node.shape)
                          and self.ctx.pruner.same(t.expr, expr)), None)
            if match is not None:
                outs.append(as_shape(match.node, node.shape))   # keepdims or not: a view
                continue
            core, chain = output_chain(node)    # a transposed or reshaped output: written through
            match = next((t for t in reversed(tensors) if chain and same_extents(
                t.node.shape, core.shape) and self.ctx.pruner.same(t.expr, expr)), None)
            if match is None:
                return None
            outs.append(rebuilt_chain(chain, as_shape(match.node, core.shape)))
        if all(over_inputs(o) for o in outs):
            return None
        try:
            graph = KernelGraph(outs, self.graph_inputs, self.ctx.output_names)
        except InvalidGraph:
            return None
        return graph if _no_dead_outputs(graph) else None

    # ---- next ops -----------------------------------------------------------------------------
    def _steps(self, tensors, last_key, custom_left, final: bool):
        pos = {t.node: i for i, t in enumerate(tensors)}
        for step in self._library_steps(tensors, pos):
            if step.key > last_key:
                yield step
        if custom_left > 0:
            for step in self._custom_steps(tensors, pos, self._goal(tensors, final)):
                if step.key > last_key:
                    yield step

    def _goal(self, tensors, final: bool) -> Goal:
        """The last kernel must write exactly the spec outputs no tensor holds yet."""
        if not final:
            return Goal(self.ctx.config.max_block_outputs)
        missing = tuple((expr, node.shape, node.dtype) for node, expr in self.spec_outputs
                        if not any((same_extents(t.node.shape, node.shape) or
                                    same_extents(t.node.shape, output_chain(node)[0].shape))
                                   and self.ctx.pruner.same(t.expr, expr)
                                   for t in tensors))
        return Goal(len(missing), missing)

    def _library_steps(self, tensors, pos):
        ctx = self.ctx
        for op in ctx.ops.kernel:
            for srcs, arg in self._operands(op, tensors):
                tensor = self._library_tensor(op, srcs, arg, tensors, pos)
                if tensor is not None:
                    idx = tuple(pos.get(s, -1) for s in srcs)
                    yield Step((max(idx), idx, _KIND_RANK[op], repr(arg)), (tensor,))

    def _operands(self, op, tensors):
        nodes = [t.node for t in tensors]
        if op is TOp.CAST:  # where the spec rounds a value of the same form (search/casts.py)
            for t in tensors:
                for d in cast_targets(self.casts, N.normalize(t.expr), t.node.dtype):
                    yield (t.node,), d
        elif op in UNARY:
            for a in nodes:
                if op is not TOp.CLAMP:
                    yield (a,), None
        elif op in BINARY:
            consts = [KNode(KOp.CONSTANT, (), (v, (1,), d)) for v, d in self.ctx.ops.constants]
            for a, b in itertools.product(nodes + consts, nodes + consts):
                if a.op is KOp.CONSTANT and b.op is KOp.CONSTANT:
                    continue
                yield (a, b), None
        elif op in TERNARY:  # select(c, a, b): a tensor predicate, branches of either kind
            consts = [KNode(KOp.CONSTANT, (), (v, (1,), d)) for v, d in self.ctx.ops.constants]
            masks = [n for n in nodes if is_mask(n)]
            for c, a, b in itertools.product(masks, nodes + consts, nodes + consts):
                if a is not b:
                    yield (c, a, b), None
        elif op is KOp.MATMUL:
            for a, b in itertools.product(nodes, nodes):
                yield (a, b), None
        elif op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX):
            for a in nodes:
                for d, n in enumerate(a.shape):
                    if n > 1:
                        yield (a,), d
        elif op is KOp.RMS_NORM:
            for a in nodes:
                for d in range(a.rank):
                    for eps in self.ctx.ops.rms_args:
                        yield (a,), (d, eps)

    def _library_tensor(self, op, srcs, arg, tensors, pos) -> Tensor | None:
        ctx = self.ctx
        if op in COMMUTATIVE and pos.get(srcs[0], -1) > pos.get(srcs[1], -1):
            return None
        try:
            node = KNode(op, srcs, arg)
        except InvalidGraph:
            ctx.counters.pruned[Reject.SHAPE.value] += 1
            return None
        if node in pos:
            ctx.counters.pruned[Reject.DUPLICATE.value] += 1
            return None
        by_node = {t.node: t for t in tensors}
        src_labels = [((by_node[s].labels if s in by_node else (UNIT_DIM,) * s.rank), s.shape)
                      for s in srcs]
        labels = checked_labels(ctx.analysis, op, src_labels, node.shape, arg)
        if labels is None:
            ctx.counters.pruned[Reject.LABEL.value] += 1
            return None
        exprs = [by_node[s].expr if s in by_node else ctx.pruner.constant(s.arg[0]) for s in srcs]
        expr = ctx.pruner.kernel_expr(node, exprs)
        reason = ctx.pruner.reject(expr)
        if reason is not None:
            ctx.counters.pruned[reason.value] += 1
            return None
        if any(ctx.pruner.same(expr, t.expr) and t.node.shape == node.shape
               and t.node.dtype is node.dtype for t in tensors):
            ctx.counters.pruned[Reject.DUPLICATE.value] += 1
            return None
        return Tensor(node, expr, labels)

    def _custom_steps(self, tensors, pos, goal):
        for subset in self._subsets(tensors, goal):
            srcs = [tensors[i] for i in subset]
            for si, sk in enumerate(self._skeletons(srcs, goal)):
                for bi, closed in enumerate(self._blocks(srcs, sk, goal)):
                    step = self._custom_step(srcs, closed, tensors, subset, si, bi)
                    if step is not None:
                        yield step

    def _blocks(self, srcs, sk, goal):
        """Closed block graphs for one (inputs, skeleton, goal), yielded as they are found;
        remembered once the enumeration has run to the end.

        Remembered by what the block enumeration reads of each input (shape, dtype, expression,
        labels, mask or not), not by the node: tensors that different earlier kernels computed
        the same way share one enumeration (the closed block graphs are the same; only the
        custom op's sources differ)."""
        key = (tuple((t.node.shape, t.node.dtype, t.expr, t.labels, is_mask(t.node))
                     for t in srcs), sk, goal)
        counters = self.ctx.counters
        done = self.block_cache.get(key)
        if done is not None:
            # replay the states the enumeration took, so counts and budgets do not depend on
            # what this process happened to have cached
            for states, closed in done:
                self._replay(states)
                if closed is None:
                    return
                counters.block_graphs += 1
                yield closed
            return
        found, last = [], counters.states
        try:
            blocks = BlockEnumerator(self.ctx, srcs, sk, reduced_sizes(sk), goal)
        except InvalidGraph:    # tiles that do not divide: a pruned skeleton, never a user's error
            counters.pruned[Reject.SHAPE.value] += 1
            self.block_cache[key] = [(0, None)]
            return
        for closed in blocks.run():
            found.append((counters.states - last, closed))
            yield closed
            last = counters.states      # the consumer's own states are not this enumeration's
        found.append((counters.states - last, None))
        self.block_cache[key] = found

    def _replay(self, states: int) -> None:
        counters, budget = self.ctx.counters, self.ctx.budget
        limit = budget.states if budget.cap is None else min(budget.states, budget.cap)
        counters.states = min(counters.states + states, max(limit, counters.states))
        if states:
            budget.check(counters)

    def _custom_step(self, srcs, closed, tensors, subset, si, bi) -> Step | None:
        try:
            nodes = custom(closed.graph, [t.node for t in srcs])
        except InvalidGraph:
            return None
        produced = tuple(Tensor(n, e, lab) for n, e, lab in zip(nodes, closed.exprs, closed.labels))
        fresh = [t for t in produced if not any(
            self.ctx.pruner.same(t.expr, u.expr) and u.node.shape == t.node.shape for u in tensors)]
        if not fresh:
            self.ctx.counters.pruned[Reject.DUPLICATE.value] += 1
            return None
        return Step((max(subset), subset, _KIND_RANK[KOp.CUSTOM], (si, bi)), produced)
