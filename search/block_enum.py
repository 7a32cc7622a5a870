"""Depth-first enumeration of one block graph's body, op by op, under a fixed skeleton.

Every new tile must pass cheap checks first (shape, labels, phase rules, canonical order), then
the abstract-expression check: its expression must be a sub-expression of a spec output. The
block closes when every dangling value is an accumulator or comes after one; each way of
writing those values out (omaps) yields one closed block graph.
"""
from __future__ import annotations

import itertools
import weakref
from collections import Counter
from dataclasses import dataclass

from mugraph.ir import BlockGraph, BlockInput, BlockOutput, BNode, DType, Phase
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.thread import ELEMENTWISE, fuse_threads
from mugraph.ir.ops import (ACCUMULATORS, BINARY, BOp, COMMUTATIVE, RESCALE_ACCUMULATORS,
                            RUNNING_ACCUMULATORS, TERNARY, TOp, UNARY, is_mask)
from mugraph.search.casts import cast_targets, operand_casts
from mugraph.search.context import Reject
from mugraph.search.labels import UNIT_DIM, DimLabel, Label, checked_labels
from mugraph.search.schedules import input_maps, tile_labels
from mugraph.search.thread_units import regions, units
from mugraph.verify import abstract
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract import normalize as N

_OP_RANK = {op: i for i, op in enumerate(list(BOp) + list(TOp))}


@dataclass(frozen=True)
class ClosedBlock:
    """A finished block graph and, per output, what the search knows of the tensor it writes."""

    graph: BlockGraph
    exprs: tuple
    labels: tuple          # per output: tuple[DimLabel, ...] of the kernel tensor


def _broadcastable(a: tuple, b: tuple) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def _shapes_may_fit(op, srcs) -> bool:
    """The common shape clashes, without building the node (a clash raises, which is slow);
    the node's own inference stays the judge of everything else."""
    if op in BINARY or op in RESCALE_ACCUMULATORS:
        return _broadcastable(srcs[0].shape, srcs[1].shape)
    if op in TERNARY:
        return all(_broadcastable(a.shape, b.shape) for a, b in itertools.combinations(srcs, 2))
    if op is BOp.MATMUL:
        a, b = srcs[0].shape, srcs[1].shape
        return len(a) >= 2 and len(b) >= 2 and a[-1] == b[-2] and _broadcastable(a[:-2], b[:-2])
    return True


def _outer(dim_label):
    return None if dim_label is None else dim_label.outer


def _scaling(op, srcs) -> bool:
    """A multiply or divide by a scalar constant."""
    return op in (TOp.MUL, TOp.DIV) and any(s.op is BOp.CONSTANT for s in srcs[-1:]) or \
        op is TOp.MUL and srcs[0].op is BOp.CONSTANT


def _constant_of(srcs):
    return next((s.arg[0] for s in srcs if s.op is BOp.CONSTANT), None)


def structure_scales(spec) -> frozenset:
    """Constants the spec multiplies or divides a matmul, reduction, norm or input by (a
    softmax scale, a LoRA alpha): a fused kernel may apply them on another side of the op."""
    from mugraph.ir.ops import KOp
    found = set()
    for n in spec.nodes:
        if n.op in (TOp.MUL, TOp.DIV):
            consts = [s for s in n.srcs if s.op is KOp.CONSTANT and all(d == 1 for d in s.shape)]
            others = [s for s in n.srcs if s not in consts]
            if consts and others and not isinstance(others[0].op, TOp):
                found.add(consts[0].arg[0])
    return frozenset(found)


def _rescaled_constant(op, srcs) -> bool:
    """c2 * (c1 * x): a product of constants the spec does not hold; where the program scales
    twice in a row, a thread unit does it in one op."""
    inner = [s for s in srcs if s.op is not BOp.CONSTANT]
    return _scaling(op, srcs) and len(inner) == 1 and _scaling(inner[0].op, inner[0].srcs)


_FORMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def spec_forms(spec) -> tuple[frozenset, frozenset]:
    """The normal forms of every value the spec computes (the subterms of its expressions, so
    the parts of a composite op such as rms_norm's mean count), and of those its tensors build
    only inside an elementwise region (see `thread_units.regions`)."""
    found = _FORMS.get(spec)
    if found is None:
        exprs = abstract.expressions(spec)
        forms = {n: N.normalize(e) for n, e in exprs.items()}
        internal = set(regions(spec).internal)
        inside = {forms[n] for n in internal} - {f for n, f in forms.items() if n not in internal}
        values = {N.normalize(t) for t in E.subterms(list(exprs.values()))}
        found = _FORMS[spec] = (frozenset(values), frozenset(inside))
    return found


def _broadcasts(small: tuple, big: tuple) -> bool:
    return len(small) <= len(big) and all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


class _State:
    """The body built so far: nodes in creation order with their facts; mutated by push/pop."""

    def __init__(self, inputs, exprs, labels, phases):
        self.nodes = list(inputs)
        self.pos = {n: i for i, n in enumerate(inputs)}
        self.exprs = dict(exprs)
        self.labels = dict(labels)
        self.phase = dict(phases)
        self.uses = Counter()
        self.keys = [(-1,)]
        self.n_inputs = len(inputs)
        self.values: dict = {}
        for n in inputs:
            self._count(n, self.exprs[n], 1)

    def push(self, node, expr, labels, phase, key):
        self.pos[node] = len(self.nodes)
        self.nodes.append(node)
        self.exprs[node], self.labels[node], self.phase[node] = expr, labels, phase
        for s in set(node.srcs):
            self.uses[s] += 1
        self.keys.append(key)
        self._count(node, expr, 1)

    def pop(self):
        node = self.nodes.pop()
        del self.pos[node]
        for s in set(node.srcs):
            self.uses[s] -= 1
        self.keys.pop()
        self._count(node, self.exprs[node], -1)

    def _count(self, node, expr, k: int) -> None:
        shapes = self.values.setdefault(N.normalize(expr), Counter())
        shapes[node.shape] += k

    def holds_form(self, form, shape=None) -> bool:
        """Whether a value with this normal form exists already (one that broadcasts to `shape`
        when given: a value that equals a smaller one everywhere is that one broadcast)."""
        shapes = self.values.get(form)
        return bool(shapes) and any(k > 0 and (shape is None or _broadcasts(s, shape))
                                    for s, k in shapes.items())

    @property
    def body_ops(self) -> int:
        return len(self.nodes) - self.n_inputs

    def sinks(self):
        return [n for n in self.nodes[self.n_inputs:] if self.uses[n] == 0]


def _phase_of(op, srcs, phase) -> Phase | None:
    """The phase of a new node, or None when the IR's phase rules forbid it."""
    src_phases = [phase[s] for s in srcs]
    if op in ACCUMULATORS:
        if src_phases[0] not in (Phase.LOOP, Phase.INVARIANT):
            return None
        if op in RESCALE_ACCUMULATORS and srcs[1].op not in RUNNING_ACCUMULATORS:
            return None
        return Phase.ACCUMULATOR
    if Phase.LOOP in src_phases:
        for s, p in zip(srcs, src_phases):
            if p is Phase.EPILOGUE or (p is Phase.ACCUMULATOR and s.op not in RUNNING_ACCUMULATORS):
                return None
        return Phase.LOOP
    if Phase.ACCUMULATOR in src_phases or Phase.EPILOGUE in src_phases:
        return Phase.EPILOGUE
    return Phase.INVARIANT


_PHASE_RANK = {Phase.INVARIANT: 0, Phase.LOOP: 1, Phase.ACCUMULATOR: 1, Phase.EPILOGUE: 2}
# the highest phase rank of an op reading a value of this phase (outside the loop an
# accumulator is read by epilogue ops)
_SOURCE_RANK = {Phase.INVARIANT: 0, Phase.LOOP: 1, Phase.ACCUMULATOR: 2, Phase.EPILOGUE: 2}


@dataclass(frozen=True)
class Goal:
    """What the block must produce: at most `max_outputs` values, or, for the last kernel of a
    candidate, exactly the spec outputs still missing (`targets`: (expression, shape, dtype))."""

    max_outputs: int
    targets: tuple = ()

    @property
    def final(self) -> bool:
        return bool(self.targets)


class BlockEnumerator:
    """Enumerates the bodies of one custom op: fixed input tensors, skeleton and reduced sizes.

    Canonical order: every new op's key (phase rank, newest source, sources, op, arg) exceeds
    the previous op's, so each DAG is built once, invariant ops first and epilogue ops last.
    """

    def __init__(self, ctx, tensors, skeleton, sizes, goal: Goal):
        self.ctx = ctx
        self.tensors = tensors
        self.skeleton = skeleton
        self.sizes = sizes
        self.goal = goal
        self.forloop = sizes.forloop
        allowed = not ctx.config.block_ops or BOp.THREAD.value in ctx.config.block_ops
        self.units = units(ctx.spec) if allowed else ()
        self._memo: dict = {}
        self._partials: dict = {}
        self._structured: dict = {}
        self.spec_forms, self.inside_forms = spec_forms(ctx.spec)
        self.scales = structure_scales(ctx.spec)
        self.casts = operand_casts(ctx.spec)
        if not self.units:
            self.inside_forms = frozenset()
        inputs, exprs, labels, phases = [], {}, {}, {}
        for i, t in enumerate(tensors):
            imap, fmap = input_maps(t.labels, skeleton)
            spec = BlockInput(i, t.node.shape, t.node.dtype, imap, fmap, sizes.grid, sizes.forloop)
            node = BNode(BOp.INPUT, (), spec)
            inputs.append(node)
            exprs[node] = t.expr
            labels[node] = tile_labels(t.labels, imap, fmap, sizes, skeleton)
            phases[node] = Phase.INVARIANT if fmap is None else Phase.LOOP
        self.state = _State(inputs, exprs, labels, phases)
        self.constants = [BNode(BOp.CONSTANT, (), (v, (1,), DType.FLOAT32))
                          for v in sorted({v for v, _ in ctx.ops.constants})]
        for c in self.constants:
            self.state.exprs[c] = ctx.pruner.constant(c.arg[0])
            self.state.labels[c] = None
            self.state.phase[c] = Phase.INVARIANT
            self.state.pos[c] = -1

    # ---- the walk --------------------------------------------------------------------------------
    def run(self):
        """Yield every ClosedBlock reachable within the op limit (depth-first)."""
        yield from self._walk()

    def _walk(self):
        ctx, st = self.ctx, self.state
        ctx.counters.states += 1
        ctx.budget.check(ctx.counters)
        yield from self._close()
        if st.body_ops >= ctx.config.max_block_ops or not self._can_finish():
            return
        children = [a for a in (self._admit(*c) for c in self._candidates()) if a is not None]
        children.sort(key=self._promise)
        for admitted in children:
            st.push(*admitted)
            yield from self._walk()
            st.pop()

    def _promise(self, admitted) -> tuple:
        """Children that compute a value the spec computes first, then those that build more of
        the target (a larger expression), then in order. The expression test is index-free (it
        takes sum(x * x) for x * sum(x)), so it admits values no program computes; trying the
        spec's own values first reaches the kernels made of them before that space."""
        form = N.normalize(admitted[1])
        return (form not in self.spec_forms, -self.ctx.pruner.size(admitted[1]), admitted[4])

    def _can_finish(self) -> bool:
        """Can the ops left still turn this body into at most `max_outputs` written values?

        Each op merges at most two dangling values into one; values still in the loop need an
        accumulator, which must come before any epilogue op.
        """
        st = self.state
        left = self.ctx.config.max_block_ops - st.body_ops
        sinks = st.sinks()
        unused = [n for n in st.nodes[:st.n_inputs] if st.uses[n] == 0]
        # loop values must be accumulated before the epilogue; invariant ones may be read after
        pending = any(st.phase[n] is Phase.LOOP for n in sinks + unused)
        if pending and st.keys[-1][0] == _PHASE_RANK[Phase.EPILOGUE]:
            return False
        pending = pending or any(st.phase[n] is Phase.INVARIANT for n in sinks)
        outputs = len(self.goal.targets) if self.goal.final else self.goal.max_outputs
        return max(0, len(sinks) + len(unused) - outputs) + (1 if pending else 0) <= left

    # ---- candidate ops ---------------------------------------------------------------------------
    def _candidates(self):
        """(op rank, op, sources, arg, source positions) of every op that could come next in
        canonical order; _admit checks them.

        A new op's phase rank is at most its sources' highest (an accumulator's value counts as
        an epilogue one: what reads it runs after the loop), so where that is no higher than
        the last op's, the new op must read the newest source of the last op or a later one,
        else its key is smaller: those combinations are not generated at all.
        """
        st, ops = self.state, self.ctx.ops.block
        values = list(st.nodes)
        pos = st.pos
        last = st.keys[-1]
        floor, top = (last[1], last[0]) if len(last) > 1 else (-10, -1)
        phase = st.phase
        hot = {v for v in values if pos[v] >= floor or _SOURCE_RANK[phase[v]] > top}

        def later(*srcs) -> bool:
            return any(s in hot for s in srcs)

        fresh = [a for a in values if a in hot]
        for op in ops:
            rank = _OP_RANK[op]
            if op is TOp.CAST:
                for a in fresh:
                    for d in cast_targets(self.casts, N.normalize(st.exprs[a]), a.dtype,
                                          narrow_only=True):
                        yield rank, op, (a,), d, (pos[a],)
            elif op in UNARY:
                if op is not TOp.CLAMP:
                    for a in fresh:
                        yield rank, op, (a,), None, (pos[a],)
            elif op in BINARY:
                operands = values + self.constants
                commutative = op in COMMUTATIVE
                for a in operands:
                    pa = pos[a]
                    for b in operands:
                        pb = pos[b]
                        if (pa < 0 and pb < 0) or (commutative and pa > pb) or \
                                not (a in hot or b in hot):
                            continue
                        yield rank, op, (a, b), None, (pa, pb)
            elif op in TERNARY:  # select(c, a, b): c a tile, a and b tiles or constants
                operands = values + self.constants
                for c in (v for v in values if is_mask(v, self._mask_tile)):
                    for a in operands:
                        for b in operands:
                            if a is not b and later(c, a, b):
                                yield rank, op, (c, a, b), None, (pos[c], pos[a], pos[b])
            elif op is BOp.MATMUL:
                for a in values:
                    for b in values:
                        if later(a, b):
                            yield rank, op, (a, b), None, (pos[a], pos[b])
            elif op in (BOp.REDUCE_SUM, BOp.REDUCE_MAX):
                for a in fresh:
                    for d, n in enumerate(a.shape):
                        if n > 1:
                            yield rank, op, (a,), d, (pos[a],)
            elif op is BOp.RMS_NORM:
                for a in fresh:
                    for d, n in enumerate(a.shape):
                        for eps in self.ctx.ops.rms_args:
                            if n > 1:
                                yield rank, op, (a,), (d, eps), (pos[a],)
            elif op in RESCALE_ACCUMULATORS:
                runs = [m for m in values if m.op in RUNNING_ACCUMULATORS]
                for a in values:
                    for m in runs:
                        if top < 1 or (top == 1 and max(pos[a], pos[m]) >= floor):
                            yield rank, op, (a, m), None, (pos[a], pos[m])
            elif op in ACCUMULATORS:
                for a in values:
                    if top < 1 or (top == 1 and pos[a] >= floor):
                        yield rank, op, (a,), None, (pos[a],)
        yield from self._unit_candidates(values, later)

    def _unit_candidates(self, values, later):
        """Thread units whose every operand is a block value with the expression it stands for."""
        same, exprs, pos = self.ctx.pruner.same, self.state.exprs, self.state.pos
        rank = _OP_RANK[BOp.THREAD]
        for unit in self.units:
            if any(map(self.state.holds_form, unit.inner)):
                continue        # it would recompute a value the block has: extend that instead
            choices = [[v for v in values if same(exprs[v], leaf)] for leaf in unit.leaves]
            for srcs in itertools.product(*choices):
                if later(*srcs):
                    yield rank, BOp.THREAD, srcs, unit.root, tuple(pos[s] for s in srcs)

    def _mask_tile(self, node) -> bool:
        """An input tile of a mask tensor is a mask."""
        return node.op is BOp.INPUT and is_mask(self.tensors[node.arg.index].node)

    def _admit(self, rank, op, srcs, arg, idx):
        """Order check, then the node's facts (memoised: they depend only on its sources).

        The order key needs only the phase, so a candidate out of order costs no node, label
        or expression work the first time it is seen.
        """
        st = self.state
        memo_key = (rank, srcs, arg)
        facts = self._memo.get(memo_key, ...)
        if facts is ...:
            phase = _phase_of(op, srcs, st.phase)
            if phase is None or not self._loop_shape_ok(op, srcs, phase):
                self.ctx.counters.pruned[Reject.PHASE.value] += 1
                self._memo[memo_key] = None
                return None
            if (_PHASE_RANK[phase], max(idx), idx, rank, repr(arg)) <= st.keys[-1]:
                return None
            facts = self._facts(op, srcs, arg, phase)
            self._memo[memo_key] = facts and facts + (_PHASE_RANK[phase], repr(arg))
            facts = self._memo[memo_key]
        if facts is None:
            return None
        node, expr, labels, phase, phase_rank, arg_text = facts
        key = (phase_rank, max(idx), idx, rank, arg_text)
        if key <= st.keys[-1] or node in st.pos:
            return None
        if op in ELEMENTWISE and op is not TOp.CAST and st.holds_form(N.normalize(expr), node.shape):
            self.ctx.counters.pruned[Reject.DUPLICATE.value] += 1   # x * 1, or a value twice
            return None
        return node, expr, labels, phase, key

    def _facts(self, op, srcs, arg, phase):
        """Build one candidate node (its phase known) and run the cheap checks, then the
        expression check."""
        st, ctx = self.state, self.ctx
        if self._scaled_before_linear(op, srcs) or self._rounds_later(op, srcs) \
                or _rescaled_constant(op, srcs) or self._reads_partial_sum(op, srcs, phase):
            ctx.counters.pruned[Reject.CANONICAL.value] += 1
            return None
        if not _shapes_may_fit(op, srcs):
            ctx.counters.pruned[Reject.SHAPE.value] += 1
            return None
        try:
            node = BNode(op, srcs, arg)
        except InvalidGraph:
            ctx.counters.pruned[Reject.SHAPE.value] += 1
            return None
        label_srcs = [(st.labels[s] if st.labels[s] is not None else (UNIT_DIM,) * s.rank, s.shape)
                      for s in srcs]
        labels = checked_labels(ctx.analysis, op, label_srcs, node.shape, arg)
        if labels is None:
            ctx.counters.pruned[Reject.LABEL.value] += 1
            return None
        expr = ctx.pruner.block_expr(node, [st.exprs[s] for s in srcs], self.forloop)
        reason = ctx.pruner.reject(expr)
        if reason is None and self._stray(op, srcs, expr):
            reason = Reject.CANONICAL
        if reason is not None:
            ctx.counters.pruned[reason.value] += 1
            return None
        return node, expr, labels, phase

    def _rounds_later(self, op, srcs) -> bool:
        """An fp32 product (three bf16 MMAs) of an operand the spec rounds to 16 bits first: the
        product of its cast is the program's rounding, and one 16-bit MMA."""
        if op is not BOp.MATMUL or any(s.dtype.is_16bit for s in srcs):
            return False
        return any(cast_targets(self.casts, N.normalize(self.state.exprs[s]), s.dtype,
                                narrow_only=True) for s in srcs)

    def _partial(self, node) -> bool:
        """A loop value that sums over part of the looped index: a matmul contracting it, a
        reduction over it, or elementwise math on such a value."""
        found = self._partials.get(node)
        if found is None:
            loop, labels = self.skeleton.loop, self.state.labels
            if loop is None or self.state.phase.get(node) is not Phase.LOOP:
                found = False
            elif node.op is BOp.MATMUL:
                found = _outer(labels[node.srcs[0]][-1]) is loop
            elif node.op in (BOp.REDUCE_SUM, BOp.REDUCE_MAX):
                found = _outer(labels[node.srcs[0]][node.arg]) is loop
            else:
                found = node.op in ELEMENTWISE and any(map(self._partial, node.srcs))
            self._partials[node] = found
        return found

    def _reads_partial_sum(self, op, srcs, phase) -> bool:
        """Elementwise math on a partial sum inside the loop: f(partial) summed over iterations
        is not f(sum) unless f is linear, and linear scalings are taken after the accumulator
        (`_scaled_before_linear`), so no such value leads to a candidate."""
        return phase is Phase.LOOP and op in ELEMENTWISE and any(map(self._partial, srcs))

    def _stray(self, op, srcs, expr) -> bool:
        """A single elementwise op must compute a value of the spec, or scale a computed value by
        one of its constants (a softmax scale on a score tile): the sub-expression test alone admits every
        term of an expanded polynomial (0.5 * y of gelu's 0.5 * y * (1 + tanh(...))), and the
        spec's values, or a thread unit of them, are all a fused kernel needs. Nor is a value
        built only inside an elementwise region made op by op, where a unit makes the region."""
        if not isinstance(op, TOp):
            return False
        form = N.normalize(expr)
        if form in self.inside_forms:
            return True
        return form not in self.spec_forms and not (
            _scaling(op, srcs) and _constant_of(srcs) in self.scales
            and any(map(self._after_structure, srcs)))

    def _after_structure(self, node) -> bool:
        """Whether `node` is computed from a matmul, reduction or accumulator result (a scale
        on an input tile itself is never needed: a linear consumer takes it after the sum
        (`_scaled_before_linear`), and the spec's own elementwise math is a thread unit)."""
        found = self._structured.get(node)
        if found is None:
            found = node.op not in ELEMENTWISE and node.op not in (BOp.INPUT, BOp.CONSTANT) \
                or node.op in ELEMENTWISE and any(map(self._after_structure, node.srcs))
            self._structured[node] = found
        return found

    def _loop_shape_ok(self, op, srcs, phase) -> bool:
        """With a loop, accumulate loop values (summing an invariant F times is a multiply);
        without one, an accumulator is the identity: only a plain one, writing the result."""
        if self.forloop > 1:
            return not (phase is Phase.ACCUMULATOR and self.state.phase[srcs[0]] is Phase.INVARIANT)
        return phase is not Phase.EPILOGUE and (phase is not Phase.ACCUMULATOR or op is BOp.ACC_SUM)

    def _scaled_before_linear(self, op, srcs) -> bool:
        """Canonical form for linear ops: scale after summing, never before.

        sum(c * x) = c * sum(x) and (c * a) @ b = c * (a @ b) for a loop-invariant c (and for
        a scalar constant c, a reduction within the tile too); both forms pass the expression
        check, so only the cheaper one (fewer multiplies) is built, unless the spec scales the
        tensor first (`_spec_scales_first`): for a tensor scale the two differ on inf and NaN.
        """
        if op not in (BOp.ACC_SUM, BOp.ACC_SUM_LAST, BOp.MATMUL, BOp.REDUCE_SUM):
            return False
        for s in (srcs if op is BOp.MATMUL else srcs[:1]):
            if _scaling(s.op, s.srcs) and len([t for t in s.srcs if t.op is BOp.CONSTANT]) == 1:
                return True
            if op is BOp.REDUCE_SUM or self._spec_scales_first(s):
                continue
            if s.op in (TOp.MUL, TOp.DIV) and self.state.phase[s.srcs[1]] is Phase.INVARIANT \
                    and self.state.phase[s.srcs[0]] is not Phase.INVARIANT:
                return True
            if s.op is TOp.MUL and self.state.phase[s.srcs[0]] is Phase.INVARIANT \
                    and self.state.phase[s.srcs[1]] is not Phase.INVARIANT:
                return True
        return False

    def _spec_scales_first(self, product) -> bool:
        """Whether the spec itself computes this scaled tile of inputs (x * s[:, None] before its
        matmul; a scaled partial sum is never the program's, though index-free forms match it).
        Then scaling first is the program's own order, and the only one IEEE special values
        allow: with s = inf, (s * x) @ w sums inf - inf into NaN where s * (x @ w) is +-inf, so
        moving a tensor scale past the sum is not an equivalence the float test accepts."""
        return not self._after_structure(product) and \
            N.normalize(self.state.exprs[product]) in self.spec_forms

    # ---- closing the block -----------------------------------------------------------------------
    def _close(self):
        st = self.state
        if st.body_ops == 0 or any(st.uses[n] == 0 for n in st.nodes[:st.n_inputs]):
            return
        sinks = st.sinks()
        if len(sinks) > self.goal.max_outputs:
            return
        if any(st.phase[n] not in (Phase.ACCUMULATOR, Phase.EPILOGUE) for n in sinks):
            return
        if self.goal.final and not self._meets_targets(sinks):
            return
        per_output = [self._omaps(n) for n in sinks]
        for choice in itertools.product(*per_output):
            closed = self._build(sinks, choice)
            if closed is not None:
                yield closed

    def _meets_targets(self, sinks) -> bool:
        """In a candidate's last kernel, the outputs are exactly the spec outputs still missing."""
        return self._matched_targets(sinks) is not None

    def _matched_targets(self, sinks):
        """The spec output each sink writes (in order), or None if they are not the targets."""
        if len(sinks) != len(self.goal.targets):
            return None
        same = self.ctx.pruner.same
        left, found = list(self.goal.targets), []
        for n in sinks:
            hit = next((t for t in left if same(self.state.exprs[n], t[0])), None)
            if hit is None:
                return None
            left.remove(hit)
            found.append(hit)
        return found

    def _omaps(self, node) -> list[tuple]:
        """Ways to write one output: each grid axis to the tile dim with its label, or, for a
        split of a label the tile no longer has (split-K), to a dim to concatenate along."""
        labels = self.state.labels[node]
        options = []
        for lab in self.skeleton.grid:
            same = [d for d, dl in enumerate(labels) if dl is not UNIT_DIM and
                    (dl.outer is lab or self.ctx.is_composite((lab,) + dl.factors))]
            options.append(same if same else list(range(len(labels))))
        result = []
        for omap in itertools.product(*options):
            if len(set(omap)) == len(omap):
                result.append(tuple(omap) + (None,) * (3 - len(omap)))
        return result

    def _build(self, sinks, omaps) -> ClosedBlock | None:
        st, sk, sizes = self.state, self.skeleton, self.sizes
        outputs, out_labels = [], []
        targets = self._matched_targets(sinks) if self.goal.final else None
        for i, (node, omap) in enumerate(zip(sinks, omaps)):
            dtype = targets[i][2] if targets else self._out_dtype(node)
            try:
                shape = list(node.shape)
                labels = list(st.labels[node])
                for axis, dim in enumerate(omap):
                    if dim is None:
                        continue
                    shape[dim] *= sizes.grid[axis]
                    labels[dim] = self._concat_label(labels[dim], sk.grid[axis], sizes)
                outputs.append(BlockOutput(node, omap, dtype, tuple(shape)))
                out_labels.append(tuple(labels))
            except InvalidGraph:
                return None
        try:
            graph = fuse_threads(BlockGraph(sizes.grid, 128, sizes.forloop,
                                            tuple(st.nodes[:st.n_inputs]), tuple(outputs)))
        except InvalidGraph:
            self.ctx.counters.pruned[Reject.SHAPE.value] += 1
            return None
        self.ctx.counters.block_graphs += 1
        return ClosedBlock(graph, tuple(st.exprs[n] for n in sinks), tuple(out_labels))

    def _out_dtype(self, node) -> DType:
        """An intermediate tensor's storage: its inputs' 16-bit dtype, else fp32 (a spec output
        is written in the spec's dtype)."""
        low = [t.node.dtype for t in self.tensors if t.node.dtype.is_16bit]
        return low[0] if low else DType.FLOAT32

    def _concat_label(self, tile: DimLabel, lab: Label, sizes) -> DimLabel:
        """The label of an output dim that blocks along a grid axis write side by side."""
        if tile is not UNIT_DIM and tile.outer is lab:
            return DimLabel((lab,) + tile.factors[1:])
        if tile is not UNIT_DIM and self.ctx.is_composite((lab,) + tile.factors):
            return DimLabel((lab,) + tile.factors)    # the inner factors of a head-split dim
        split = self.ctx.split_label(lab, sizes.grid[self.skeleton.grid.index(lab)])
        return DimLabel((split,)) if tile is UNIT_DIM else DimLabel((split,) + tile.factors)
