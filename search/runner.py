"""The search runner: a flat pipeline of named steps from a spec to a verified, ranked winner.

    canonicalise -> reduce shapes -> enumerate structures (iterative deepening, executors)
    -> verify each at reduced shapes -> size for the real shapes (cost model) -> rank
    -> verify the winner at the real shapes
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from mugraph.ir import KernelGraph
from mugraph.ir.errors import SearchError
from mugraph.search.config import SearchConfig
from mugraph.search.context import (Budget, BudgetExhausted, Counters, OpSets, Reject,
                                     StopReason, TaskCapReached)
from mugraph.search.instantiate import reduced_extents, reinstantiate_spec
from mugraph.search.labels import Label, analyze
from mugraph.search.leaves import index_inputs, restore
from mugraph.search.result import Candidate, SearchReport, SearchResult
from mugraph.search.rules import canonicalize


@dataclass
class Problem:
    """Everything a worker needs to run tasks of one structure search (picklable)."""

    reduced: KernelGraph
    config: SearchConfig


class Context:
    """Shared state of one structure search in one process."""

    def __init__(self, problem: Problem, deadline: float, states_left: int):
        from mugraph.search.pruning import Pruner
        self.config = problem.config
        self.spec = problem.reduced
        self.analysis = analyze(problem.reduced)
        self.pruner = Pruner(problem.reduced)
        self.ops = OpSets.from_spec(problem.reduced, problem.config)
        self.counters = Counters()
        self.budget = Budget(max(0.0, deadline - time.monotonic()), states_left)
        self.output_names = problem.reduced.output_names
        self._splits: dict = {}

    def is_reduction(self, label: Label) -> bool:
        return label.uid < 0 or label not in self.analysis.parallel

    def split_label(self, label: Label, extent: int) -> Label:
        """The label of the blocks' side-by-side partials when a grid axis splits `label`."""
        key = (label, extent)
        if key not in self._splits:
            self._splits[key] = Label(-1000 - len(self._splits), extent, f"{label!r}/split")
        return self._splits[key]


_WORKER: dict = {}


def _enumerator(problem: Problem, deadline: float, states_left: int, cap: int | None = None):
    from mugraph.search.kernel_enum import KernelEnumerator, Tensor
    cached = _WORKER.get("problem")
    if cached is None or cached.reduced is not problem.reduced or cached.config != problem.config:
        ctx = Context(problem, deadline, states_left)
        inputs = [Tensor(n, ctx.pruner.inputs[n], ctx.analysis.of(n)) for n in problem.reduced.inputs]
        outs = list(zip(problem.reduced.outputs, ctx.pruner.outputs))
        _WORKER.update(problem=problem, enum=KernelEnumerator(ctx, inputs, outs))
    enum = _WORKER["enum"]
    enum.ctx.budget = Budget(max(0.0, deadline - time.monotonic()), states_left, cap)
    enum.ctx.counters = Counters()
    return enum


def run_task(args):
    """One executor task: (problem, depth, task, deadline, states left, cap) ->
    (graphs, counters, stop reason or None, finished: bool)."""
    problem, depth, task, deadline, states_left, cap = args
    enum = _enumerator(problem, deadline, states_left, cap)
    found, stop, finished = [], None, True
    try:
        for graph in enum.run_task(task, depth):
            if graph not in found:
                found.append(graph)
    except BudgetExhausted as e:
        stop = e.reason
    except TaskCapReached:
        finished = False
    return found, enum.ctx.counters, stop, finished


def search(spec: KernelGraph, config: SearchConfig | None = None, *, progress=None,
           executor=None, checkpoint=None) -> SearchResult:
    """Find the best verified μGraph for `spec` (see the module docstring for the steps).

    `checkpoint` (a `search.checkpoint.Checkpointer`) resumes from the state a stopped run left
    and saves the state as the search goes. A stop request (`search.interrupt`) ends the
    enumeration at once; the result then holds the best structure verified so far, without the
    check at the real shapes, and the stop reason "interrupted"."""
    from mugraph.search.executors import make_executor
    config = config or SearchConfig()
    if not isinstance(spec, KernelGraph):
        raise SearchError(f"search takes a KernelGraph, got {type(spec).__name__}",
                          hint="trace a JAX function with mugraph.ir.from_jax first")
    started = time.monotonic()
    show = progress if progress is not None else _default_progress(config)
    canonical, fired = canonicalize(spec)
    indexed, leaves = index_inputs(canonical)   # iotas are inputs of the structure search
    analysis = analyze(indexed)
    extents, constants = reduced_extents(analysis, indexed, config.reduced_extent)
    reduced = reinstantiate_spec(indexed, analysis, extents)
    problem = Problem(reduced, config)
    own_executor = executor is None
    executor = executor or make_executor(config.workers)
    ranking = _Ranking(spec, constants, config, indexed, leaves)
    hooks = _Hooks(checkpoint, ranking)
    try:
        counters, stop = _enumerate(problem, executor, started, show, ranking, hooks)
        searched = time.monotonic() - started + hooks.searched_before
    finally:
        getattr(show, "close", lambda: None)()
        if own_executor:
            executor.close()
    return _finish(spec, canonical, reduced, ranking, counters, stop, fired, config, started,
                   searched, hooks.resumed_note)


class _Ranking:
    """Verified structures, sized for the real shapes as they are found: the best so far."""

    def __init__(self, spec, constants, config, indexed=None, leaves=None):
        from mugraph.search.cost import estimate, fits
        self.spec, self.constants, self.config = spec, constants, config
        self.indexed, self.leaves = indexed or spec, leaves or {}
        self.estimate, self.fits = estimate, fits
        self.candidates: list[Candidate] = []
        self.started = time.monotonic()
        self.first_found: dict = {}
        self.misfits = 0               # real-shape sizings that do not fit the target's memory

    def _fits(self, graph) -> bool:
        ok = self.fits(graph, self.config.target)
        self.misfits += not ok
        return ok

    def add(self, structure, states: int) -> None:
        from mugraph.search.sizing import size_structure
        target = self.config.target
        sized = size_structure(structure, list(self.indexed.inputs), self.constants, target,
                               self.estimate, self._fits, bound=self.best_seconds)
        if sized:
            est, graph = sized[0]
            if self.leaves:
                graph = restore(graph, self.leaves, self.spec.inputs)
                est = self.estimate(graph, target)
            if all(c.graph is not graph for c in self.candidates):
                self.candidates.append(Candidate(graph, est, describe(graph), "search"))
                self.first_found[graph] = (time.monotonic() - self.started, states)

    @property
    def best_seconds(self) -> float | None:
        return min((c.seconds for c in self.candidates), default=None)


class _Hooks:
    """The runner's side of checkpoints: restore a saved state, save the current one."""

    def __init__(self, checkpoint, ranking):
        self.checkpoint, self.ranking = checkpoint, ranking
        self.start = checkpoint.resume() if checkpoint is not None else None
        self.searched_before = self.start.searched if self.start else 0.0
        self.resumed_note = (f"resumed from a checkpoint saved "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.start.saved))}"
                             f" at {self.start.where()}" if self.start else "")
        if self.start is not None:
            ranking.candidates[:] = self.start.candidates
            ranking.first_found.update(self.start.first_found)
            ranking.misfits = self.start.misfits

    def save(self, started, depth, cap, share, todo, unfinished, counters, seen, force=False):
        if self.checkpoint is None:
            return
        from mugraph.search.checkpoint import SearchState
        runs = self.start.runs + 1 if self.start else 1
        # a snapshot, consistent at this task boundary (the runner goes on mutating its own)
        snapshot = dataclasses.replace(counters, pruned=dict(counters.pruned))
        self.checkpoint.save(SearchState(
            depth, cap, share, None if todo is None else list(todo), list(unfinished), snapshot,
            list(seen), list(self.ranking.candidates), dict(self.ranking.first_found),
            self.ranking.misfits, time.monotonic() - started + self.searched_before, runs),
            force=force)


FIRST_CAP = 2048     # states per task in the first round; each round multiplies it by CAP_GROWTH
CAP_GROWTH = 4


def _enumerate(problem, executor, started, show, ranking, hooks):
    """Iterative deepening on kernel ops; within a depth, iterative broadening over root tasks:
    every task gets a share of states per round, unfinished tasks run again with a share
    CAP_GROWTH times larger, so no single unpromising subtree can eat the budget. The state is
    saved after every task (hooks); a resumed search starts in the round it was stopped in."""
    config = problem.config
    deadline = started + config.budget_seconds
    counters, seen, stop = Counters(), set(), StopReason.EXHAUSTED
    enum = _enumerator(problem, deadline, config.budget_states)
    first_depth, resumed = 1, hooks.start
    if resumed is not None:
        counters, seen, first_depth = resumed.counters, set(resumed.seen), resumed.depth
    for depth in range(first_depth, config.max_kernel_ops + 1):
        pending, cap, carried, fixed_share = enum.root_tasks(depth), FIRST_CAP, [], None
        if resumed is not None:
            if resumed.todo is not None:  # None: stopped between depths, the new depth's tasks
                pending, cap, carried = resumed.todo, resumed.cap, list(resumed.unfinished)
                fixed_share = resumed.share
            resumed = None
        while (pending or carried) and stop is StopReason.EXHAUSTED:
            if not pending:  # a resumed round whose own tasks had all run
                pending, cap, carried = carried, cap * CAP_GROWTH, []
                continue
            # the states left are shared out, so tasks running side by side cannot overrun
            # them; a task that uses its share runs again next round, like one at its cap
            share = fixed_share or (config.budget_states - counters.states) // len(pending)
            fixed_share = None
            if share < 1:
                stop = StopReason.STATES
                break
            batch = [(problem, depth, t, deadline, config.budget_states, min(cap, share))
                     for t in pending]
            unfinished, carried = carried, []
            for i, (task, (found, task_counters, task_stop, finished)) in enumerate(zip(
                    pending, executor.map(run_task, batch))):
                counters.merge(task_counters)
                _verify_found(problem, found, seen, counters, ranking)
                show(counters, ranking.best_seconds, time.monotonic() - started)
                if task_stop is not None:
                    stop = task_stop
                    hooks.save(started, depth, cap, share, pending[i:], unfinished, counters,
                               seen, force=True)  # the stopped task runs again on resume
                    break
                if not finished:
                    unfinished.append(task)
                hooks.save(started, depth, cap, share, pending[i + 1:], unfinished, counters, seen)
            pending, cap = unfinished, cap * CAP_GROWTH
        if stop is not StopReason.EXHAUSTED or counters.verified >= config.max_candidates:
            break
        hooks.save(started, depth + 1, FIRST_CAP, None, _NEXT_DEPTH, [], counters, seen)
    return counters, stop


# a saved frontier at a depth boundary: the next depth's root tasks (computed when resuming)
_NEXT_DEPTH = None


def _verify_found(problem, found, seen, counters, ranking) -> None:
    """The finite-field test at the reduced shapes for every new structure; rank the verified."""
    from mugraph.verify import quick_equivalent
    config = problem.config
    for graph in found:
        if graph in seen:
            continue
        seen.add(graph)
        counters.candidates += 1
        if quick_equivalent(problem.reduced, graph, tests=config.verify_tests, seed=config.seed):
            counters.verified += 1
            ranking.add(graph, counters.states)
        else:
            counters.rejected += 1


def _rank_key(c: Candidate):
    """Faster first; ties (common when memory-bound) go to less traffic, less arithmetic,
    fewer launches, fewer block ops; the digest makes the order total and reproducible."""
    est = c.estimate
    ops = sum(len(bg.nodes) for bg, _ in c.graph.custom_ops())
    return (round(c.seconds, 12), est.hbm_bytes, est.simt_flops, est.launches, ops,
            c.origin != "search", c.graph.digest())


def _finish(spec, canonical, reduced, ranking, counters, stop, fired, config, started, searched,
            resumed=""):
    from mugraph.search.cost import estimate, roofline
    from mugraph.verify import check, quick_equivalent
    target = config.target
    ranked = list(ranking.candidates)
    ranked.append(Candidate(spec, estimate(spec, target), "the unfused spec (library kernels)",
                            "spec"))
    if canonical is not spec:
        ranked.append(Candidate(canonical, estimate(canonical, target),
                                "the canonical spec (library kernels)", "spec"))
    ranked.sort(key=_rank_key)
    verification, rejected = None, 0
    while ranked and stop is not StopReason.INTERRUPTED:  # stopping: no check at the real shapes
        if ranked[0].graph is spec:
            # the program itself is its own reference: nothing to verify, and a float test of
            # a 16-bit program against float64 can fail for the program itself (bf16 softmax)
            verification = None
            break
        # a cheap exact test first: a structure that fails at the real shapes is not worth the
        # full check (several float and finite-field runs)
        if quick_equivalent(spec, ranked[0].graph, seed=config.seed):
            verification = check(spec, ranked[0].graph, seed=config.seed)
            if verification.equivalent:
                break
        rejected += 1
        ranked.pop(0)
    if not ranked:
        raise SearchError("no candidate passed verification at the real shapes")
    best = ranked[0]
    counters.pruned[Reject.MEMORY.value] = ranking.misfits
    report = SearchReport(
        stop_reason=stop.value, states=counters.states, block_graphs=counters.block_graphs,
        pruned=dict(counters.pruned), structures_found=counters.candidates,
        verified=counters.verified, rejected=counters.rejected + rejected,
        wall_seconds=time.monotonic() - started, search_seconds=searched, rules_fired=tuple(fired),
        reduced_shapes={n.arg[0]: n.shape for n in reduced.inputs}, target=target,
        spec_estimate=estimate(spec, target), roofline=roofline(spec, target),
        verification=verification, config=config.to_json(),
        best_found_seconds=ranking.first_found.get(best.graph, (None, None))[0],
        best_found_states=ranking.first_found.get(best.graph, (None, None))[1], resumed=resumed)
    return SearchResult(best.graph, tuple(ranked), report, spec)


def describe(graph: KernelGraph) -> str:
    """One line: how many kernels, and each custom kernel's grid and loop."""
    customs = graph.custom_ops()
    from mugraph.ir.ops import KERNEL_LAYOUT, KOp
    read_by_library = {s for n in graph.nodes if n.op.value != "custom" for s in n.srcs}
    library = [n for n in graph.nodes if n.op.value not in ("input", "constant", "custom")
               and not (n.op in KERNEL_LAYOUT and n not in read_by_library
                        and (n not in graph.outputs or n.op is KOp.RESHAPE))]   # views
    parts = [f"{len(customs)} custom kernel{'s' * (len(customs) != 1)}"]
    if library:
        parts.append(f"{len(library)} library op{'s' * (len(library) != 1)}")
    kernels = [f"grid{bg.grid} forloop {bg.forloop} ({len(bg.nodes) - len(bg.inputs)} block ops)"
               for bg, _ in customs]
    return ", ".join(parts) + (": " + "; ".join(kernels) if kernels else "")


def _default_progress(config):
    from mugraph.search.progress import default_progress
    return default_progress(config.budget_seconds, in_flight=_in_flight_states)


def _in_flight_states() -> tuple[int, int]:
    """(which task, its states) for the task running in this process (in-process executor),
    whose counters are merged only when it ends."""
    enum = _WORKER.get("enum")
    return (id(enum.ctx.counters), enum.ctx.counters.states) if enum is not None else (0, 0)
