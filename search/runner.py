"""The search runner: a flat pipeline of named steps from a spec to a verified, ranked winner.

    validate -> canonicalise -> reduce shapes -> enumerate structures (iterative deepening,
    executors) -> verify, simplify and re-verify each at reduced shapes -> derive the split-K /
    split-KV form of each loop kernel (verified) -> size for the real shapes (cost model) ->
    rank -> check the winner at the real shapes (bounded: sampled output blocks where the whole
    output costs too much)

`config.budget_seconds` bounds the whole call; the report says why the enumeration stopped.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from mugraph.ir import KernelGraph
from mugraph.ir.errors import SearchError
from mugraph.ir.layout import copies
from mugraph.ir.ops import KERNEL_LAYOUT, KERNEL_LEAF, KOp
from mugraph.search.config import SearchConfig
from mugraph.search.context import (Budget, BudgetExhausted, Counters, OpSets, Reject,
                                     StopReason, TaskCapReached)
from mugraph.search.instantiate import reduced_extents, reinstantiate_spec
from mugraph.search.labels import Label, analyze
from mugraph.search.leaves import index_inputs, restore
from mugraph.search.result import Candidate, Rejections, SearchReport, SearchResult, SpecItself

# where a rejection happened (a simplified form that fails is dropped, the graph as found kept)
REDUCED, REAL = "the reduced shapes", "the real shapes"
SIMPLIFIED = "the reduced shapes, as a simplified form (the structure as found was kept)"
from mugraph.search.rules import canonicalize
from mugraph.search.simplify import op_count, simplify
from mugraph.search.split import split_structures


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
        self._composites = None

    def is_reduction(self, label: Label) -> bool:
        return label.uid < 0 or label not in self.analysis.parallel

    def is_composite(self, factors: tuple) -> bool:
        """Whether the spec has a dim of these labels (outer first): a head split's (H, D)."""
        if self._composites is None:
            self._composites = frozenset(dl.factors for dims in self.analysis.dims.values()
                                         for dl in dims if len(dl.factors) > 1)
        return factors in self._composites

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
    check at the real shapes, and the stop reason "interrupted".

    `config.budget_seconds` bounds the whole call: the enumeration ends `finish_reserve` seconds
    early so the ranking and the bounded check at the real shapes fit in what is left."""
    from mugraph.search.executors import make_executor
    config = validate(spec, config)
    started = time.monotonic()
    show = progress_hook(progress, config)
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
    # the budget is the whole search's: a resumed or continued one has spent some of it already
    deadline = started + config.budget_seconds - finish_reserve(config.budget_seconds) \
        - hooks.searched_before
    ranking.deadline = deadline
    try:
        counters, stop = _enumerate(problem, executor, started, deadline, show, ranking, hooks)
        searched = time.monotonic() - started + hooks.searched_before
    finally:
        getattr(show, "close", lambda: None)()
        if own_executor:
            executor.close()
    return _finish(spec, canonical, reduced, ranking, counters, stop, fired, config, started,
                   searched, hooks.resumed_note)


def validate(spec, config) -> SearchConfig:
    """Typed errors for bad arguments before any work is done."""
    if not isinstance(spec, KernelGraph):
        raise SearchError(f"search takes a KernelGraph, got {type(spec).__name__}",
                          hint="trace a JAX function with mugraph.ir.from_jax first")
    config = SearchConfig() if config is None else config
    if not isinstance(config, SearchConfig):
        raise SearchError(f"search takes a SearchConfig, got {type(config).__name__}",
                          hint="build one with mugraph.search.SearchConfig(...)")
    return config


FINISH_SHARE = 0.25     # of the budget kept for ranking and the final check ...
FINISH_MAX = 30.0       # ... but never more than this many seconds


def finish_reserve(budget: float) -> float:
    return min(FINISH_SHARE * budget, FINISH_MAX)


class _Ranking:
    """Verified structures, sized for the real shapes as they are found: the best so far."""

    def __init__(self, spec, constants, config, indexed=None, leaves=None):
        from mugraph.search.cost import estimate, estimate_floor, fits
        self.spec, self.constants, self.config = spec, constants, config
        self.indexed, self.leaves = indexed or spec, leaves or {}
        self.estimate, self.fits, self.floor = estimate, fits, estimate_floor
        self.candidates: list[Candidate] = []
        self.started = time.monotonic()
        self.first_found: dict = {}
        self.misfits = 0               # real-shape sizings that do not fit the target's memory
        self.simplified = 0            # structures the simplifier made smaller (re-verified)
        self.split = 0                 # split-K / split-KV structures derived and verified
        self.crashes: list = []        # verifier errors on candidates (each one rejected)
        self.rejections = Rejections()  # why candidates failed the test, by reason
        self.deadline = float("inf")   # when sizing must stop (the enumeration's deadline)

    def _fits(self, graph) -> bool:
        # sizing one structure at large shapes can take long: the deadline is checked per option
        if time.monotonic() > self.deadline:
            raise BudgetExhausted(StopReason.TIME)
        ok = self.fits(graph, self.config.target)
        self.misfits += not ok
        return ok

    def add(self, structure, states: int) -> None:
        from mugraph.search.sizing import size_structure
        target = self.config.target
        sized = size_structure(structure, list(self.indexed.inputs), self.constants, target,
                               self.estimate, self._fits, self.floor)
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
        self.resumed_note = checkpoint.resume_note() if self.start else ""
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


def _enumerate(problem, executor, started, deadline, show, ranking, hooks):
    """Iterative deepening on kernel ops; within a depth, iterative broadening over root tasks:
    every task gets a share of states per round, unfinished tasks run again with a share
    CAP_GROWTH times larger, so no single unpromising subtree can eat the budget. The state is
    saved after every task (hooks); a resumed search starts in the round it was stopped in.

    The stop reason is EXHAUSTED only when every task of every depth ran to its end; the state
    and time budgets, the candidate cap and an interrupt each stop it with their own reason."""
    config = problem.config
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
                hooks.save(started, depth, cap, None, pending, carried, counters, seen,
                           force=True)  # the round to run: a larger state budget continues here
                break
            batch = [(problem, depth, t, deadline, config.budget_states, min(cap, share))
                     for t in pending]
            unfinished, carried = carried, []
            for i, (task, (found, task_counters, task_stop, finished)) in enumerate(zip(
                    pending, executor.map(run_task, batch))):
                counters.merge(task_counters)
                try:
                    _verify_found(problem, found, seen, counters, ranking)
                except BudgetExhausted as e:      # sizing ran into the deadline
                    task_stop = task_stop or e.reason
                show(counters, ranking.best_seconds, time.monotonic() - started)
                task_stop = task_stop or _cap_or_deadline(counters, config, deadline)
                if task_stop is not None:
                    stop = task_stop
                    hooks.save(started, depth, cap, share, pending[i:], unfinished, counters,
                               seen, force=True)  # the stopped task runs again on resume
                    break
                if not finished:
                    unfinished.append(task)
                hooks.save(started, depth, cap, share, pending[i + 1:], unfinished, counters, seen)
            pending, cap = unfinished, cap * CAP_GROWTH
        if stop is not StopReason.EXHAUSTED:
            break
        hooks.save(started, depth + 1, FIRST_CAP, None, _NEXT_DEPTH, [], counters, seen)
    return counters, stop


def _cap_or_deadline(counters, config, deadline):
    """A stop reason the enumeration itself does not see: verifying and sizing take time too,
    and the candidate cap counts verified structures."""
    if time.monotonic() > deadline:
        return StopReason.TIME
    if counters.verified >= config.max_candidates:
        return StopReason.CANDIDATES
    return None


# a saved frontier at a depth boundary: the next depth's root tasks (computed when resuming)
_NEXT_DEPTH = None


def _verify_found(problem, found, seen, counters, ranking) -> None:
    """The finite-field test at the reduced shapes for every new structure; the verified ones
    are simplified (kept only if the simpler graph passes the test too) and ranked."""
    from mugraph.verify import quick_rejection
    config = problem.config

    def passes(graph, where=REDUCED) -> bool:
        try:
            why = quick_rejection(problem.reduced, graph, tests=config.verify_tests,
                                  seed=config.seed)
        except Exception as e:       # a verifier crash rejects the candidate, and is reported
            ranking.crashes.append(f"{type(e).__name__}: {e}"[:300])
            return False
        if why is not None:
            ranking.rejections.add(where, *why)
        return why is None

    for graph in found:
        if graph in seen:
            continue
        seen.add(graph)
        counters.candidates += 1
        if not passes(graph):
            counters.rejected += 1
            continue
        counters.verified += 1
        simpler, fired = simplify(graph)
        if fired and simpler not in seen and passes(simpler, SIMPLIFIED) \
                and _ieee_alike(problem, simpler, ranking.crashes):
            seen.add(simpler)
            ranking.simplified += 1
            graph = simpler
        ranking.add(graph, counters.states)
        _add_splits(graph, problem, seen, counters, ranking, passes)


SIMPLIFY_SEEDS = 3


def _ieee_alike(problem, graph, crashes: list) -> bool:
    """A rewrite the normaliser proposes holds in real arithmetic, which the finite-field test
    checks; moving a tensor factor past a sum does not hold for inf and NaN ((s * x) @ w is NaN
    where s * (x @ w) is inf). So a simplified graph must also pass the float test's special-value
    cases against the spec, at SIMPLIFY_SEEDS seeds (cheap at the reduced shapes), or the graph as
    found is kept."""
    from mugraph.verify.float_diff import float_diff
    seed = problem.config.seed
    try:
        return all(float_diff(problem.reduced, graph, seed=seed + k, modes=("float64",)).passed
                   for k in range(SIMPLIFY_SEEDS))
    except Exception as e:   # a rewrite the float test cannot run is not kept, and is reported
        crashes.append(f"{type(e).__name__}: {e}"[:300])
        return False


def _add_splits(graph, problem, seen, counters, ranking, passes) -> None:
    """The split-K / split-KV structures of a verified one (search/split.py), each verified."""
    config = problem.config
    for variant in split_structures(graph, config.max_kernel_ops, config.max_custom_ops):
        if variant in seen:
            continue
        seen.add(variant)
        counters.candidates += 1
        if passes(variant):
            counters.verified += 1
            ranking.split += 1
            ranking.add(variant, counters.states)
        else:
            counters.rejected += 1


def _rank_key(c: Candidate):
    """Faster first; ties (common when memory-bound) go to less traffic, less arithmetic,
    fewer launches, fewer block ops; the digest makes the order total and reproducible."""
    est = c.estimate
    return (round(c.seconds, 12), est.hbm_bytes, est.simt_flops, est.launches, op_count(c.graph),
            c.origin != "search", c.graph.digest())


def _finish(spec, canonical, reduced, ranking, counters, stop, fired, config, started, searched,
            resumed=""):
    from mugraph.search.cost import estimate, roofline
    target = config.target
    ranked = list(ranking.candidates)
    ranked.append(Candidate(spec, estimate(spec, target), "the unfused spec (library kernels)",
                            "spec"))
    if canonical is not spec:
        ranked.append(Candidate(canonical, estimate(canonical, target),
                                "the canonical spec (library kernels)", "spec"))
    ranked.sort(key=_rank_key)
    if stop is StopReason.INTERRUPTED:   # stopping: the best so far, unchecked at the real shapes
        outcome = _Checked(ranked, None, None)
    else:
        outcome = _check_ranked(spec, ranked, config, started + config.budget_seconds,
                                ranking.rejections)
    best = outcome.ranked[0]
    counters.pruned[Reject.MEMORY.value] = ranking.misfits
    found = ranking.first_found.get(best.graph, (None, None))
    report = SearchReport(
        stop_reason=stop.value, states=counters.states, block_graphs=counters.block_graphs,
        pruned=dict(counters.pruned), structures_found=counters.candidates,
        verified=counters.verified, rejected=counters.rejected + outcome.rejected,
        wall_seconds=time.monotonic() - started, search_seconds=searched, rules_fired=tuple(fired),
        reduced_shapes={n.arg[0]: n.shape for n in reduced.inputs}, target=target,
        spec_estimate=estimate(spec, target), roofline=roofline(spec, target),
        verification=outcome.verification, config=config.to_json(),
        best_found_seconds=found[0], best_found_states=found[1],
        final_check=_final_check_text(outcome),
        unchecked=outcome.unchecked, unchecked_why=outcome.unchecked_why,
        simplified=ranking.simplified, split=ranking.split,
        verifier_errors=tuple(ranking.crashes), resumed=resumed,
        rejections=ranking.rejections.rows())
    return SearchResult(best.graph, tuple(outcome.ranked), report, spec)


def _final_check_text(outcome) -> str:
    if isinstance(outcome.verification, SpecItself):
        return ""
    return outcome.sampled or "the whole output"


@dataclass
class _Checked:
    ranked: list
    verification: object
    sampled: str | None
    rejected: int = 0
    unchecked: int = 0
    unchecked_why: str = ""


def _check_ranked(spec, ranked, config, deadline, rejections=None) -> _Checked:
    """Check candidates at the real shapes, best first, until one passes; the spec itself needs
    no check and ends the walk. Once the deadline has passed, the rest are not checked (counted
    as unchecked) and the spec wins: the budget bounds the whole call. So is a candidate whose
    check does not fit the memory limit (`ir.memory`), with the reason kept for the report. Each
    rejection's reason goes to `rejections`."""
    from mugraph.ir.errors import ResourceError
    from mugraph.verify import rejection
    rejections = Rejections() if rejections is None else rejections
    kept, rejected, unchecked, why = [], 0, 0, []
    verification, sampled = None, None
    for cand in ranked:
        if verification is not None:
            kept.append(cand)
        elif cand.graph is spec:
            verification = SpecItself()
            kept.append(cand)
        elif time.monotonic() > deadline:
            unchecked += 1
            why.append("the budget ran out")
        else:
            try:
                report, pair, failed = _check_one(spec, cand.graph, config)
            except ResourceError as e:
                unchecked += 1
                why.append(e.message)
                continue
            if report is not None and report.equivalent:
                verification, sampled = report, pair.sampled
                kept.append(cand)
            else:
                rejected += 1
                rejections.add(REAL, *(failed or rejection(report)))
    return _Checked(kept, verification, sampled, rejected, unchecked, "; ".join(dict.fromkeys(why)))


def _check_one(spec, graph, config):
    """(the check's report or None, the CheckPlan, the quick test's reason or None) of one
    candidate at the real shapes."""
    from mugraph.search.final_check import plan
    from mugraph.verify import check, quick_rejection
    pair = plan(spec, graph)
    # a cheap exact test first: a structure that fails at the real shapes is not worth the full
    # check (several float and finite-field runs)
    failed = quick_rejection(pair.spec, pair.candidate, seed=config.seed)
    if failed is not None:
        return None, pair, failed
    return check(pair.spec, pair.candidate, seed=config.seed), pair, None


def describe(graph: KernelGraph) -> str:
    """One line: how many kernels, and each custom kernel's grid and loop."""
    customs = graph.custom_ops()
    copied = set(copies(graph))    # layout ops that run as copies; the others are views
    library = [n for n in graph.nodes if n.op not in KERNEL_LEAF and n.op is not KOp.CUSTOM
               and (n.op not in KERNEL_LAYOUT or n in copied)]
    parts = [f"{len(customs)} custom kernel{'s' * (len(customs) != 1)}"]
    if library:
        parts.append(f"{len(library)} library op{'s' * (len(library) != 1)}")
    kernels = [f"grid{bg.grid} forloop {bg.forloop} ({len(bg.nodes) - len(bg.inputs)} block ops)"
               for bg, _ in customs]
    return ", ".join(parts) + (": " + "; ".join(kernels) if kernels else "")


def progress_hook(progress, config):
    """The runner's progress hook from a `progress` argument: a callable
    (counters, best seconds, elapsed) as given; None or True the default display (a live line,
    log lines, or none under MUGRAPH_PROGRESS=0); False none."""
    from mugraph.search.progress import Silent
    if progress is None or progress is True:
        return _default_progress(config)
    if progress is False:
        return Silent()
    if not callable(progress):
        raise SearchError(f"progress={progress!r} is not a callable, True, False or None",
                          hint="pass progress=False to silence the search, or a function "
                               "(counters, best_seconds, elapsed)")
    return progress


def _default_progress(config):
    from mugraph.search.progress import default_progress
    return default_progress(config.budget_seconds, in_flight=_in_flight_states)


def _in_flight_states() -> tuple[int, int]:
    """(which task, its states) for the task running in this process (in-process executor),
    whose counters are merged only when it ends."""
    enum = _WORKER.get("enum")
    return (id(enum.ctx.counters), enum.ctx.counters.states) if enum is not None else (0, 0)
