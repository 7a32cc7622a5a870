"""Search every region of a partition, decide which run as fused kernels, and estimate the whole.

* Identical regions (the same spec, so the same cache key: every layer of a model) are searched
  once; the distinct ones go through an executor (in-process, a process pool, Dask), each under
  `cached_search` (a cache hit is re-verified, a miss searched and stored).
* The budget: a round's seconds are split evenly among the distinct regions it searches, W of
  them at a time by W workers: each gets seconds x min(W, regions) / regions (at least 1 s, the
  config's least), so the searches together take about the round's seconds. A region that finds
  no fused kernel is cut again under tighter limits and its pieces searched in the next round
  (`search_program`: the first round gets half of the user's `budget_seconds`, the second 30%,
  the third 20%).
* A region is fused when its winner has a custom kernel, is verified EQUIVALENT to the region's
  spec, and is estimated faster than the XLA-like baseline of the region (what jax.jit would
  launch for it); otherwise it stays JAX and the reason is kept.
* The whole: the stitched estimate (the fused kernels, plus the XLA-like baseline of every lifted
  step left to JAX, lifted together so XLA's fusion across them counts) against the XLA-like
  baseline of the whole lifted program (which fuses across every cut). If the stitched program
  loses, the fused regions that gain least go back to JAX until it does not: with none left it
  is `fn` itself, 1.0x. Steps only JAX runs are charged the same on both sides (one fused launch
  per stretch of them, their bytes in and out).
"""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.ir.errors import MugraphError
from mugraph.ir.ops import KOp
from mugraph.search.baseline import xla_estimate
from mugraph.search.classify import PROGRAM_OUTPUT
from mugraph.search.cost import estimate, fused_kernel, roofline
from mugraph.search.partition import Partition, Region, lift_region


@dataclass(frozen=True)
class Outcome:
    """What became of one region: fused or JAX (with why), and the numbers behind it."""

    region: Region
    fused: bool
    reason: str = ""               # why it stays JAX ("" when fused)
    answer: object = None          # search.cached.Answer (None: not searched)
    kernel_s: float | None = None  # the winner's estimate
    xla_s: float | None = None     # the XLA-like baseline of the region's spec
    same_as: int | None = None     # the region whose search this one shares

    @property
    def kernel(self):
        """The winner's graph."""
        return None if self.answer is None else self.answer.result.best


MIN_REGION_SECONDS = 1.0     # SearchConfig's least budget


def region_budget(total: float, distinct: int, workers: int) -> float:
    """Seconds for each of `distinct` equal searches, `workers` at a time, within `total` (but at
    least MIN_REGION_SECONDS each)."""
    if distinct <= 0:
        return total
    return max(MIN_REGION_SECONDS, total * min(max(1, workers), distinct) / distinct)


def region_budgets(total: float, specs: list, workers: int) -> list[float]:
    """Seconds for each search of `specs`, `workers` at a time, within `total`: shared in
    proportion to each spec's compute ops (an attention of a dozen ops needs more states than a
    norm of three), at least MIN_REGION_SECONDS each. Deterministic: the same program asks the
    cache the same questions."""
    if not specs:
        return []
    weights = [max(1, _compute_ops(spec)) for spec in specs]
    pool = total * min(max(1, workers), len(specs))
    return [max(MIN_REGION_SECONDS, pool * w / sum(weights)) for w in weights]


def _compute_ops(spec) -> int:
    from mugraph.search.region import is_compute
    return sum(is_compute(n) for n in spec.nodes)


# a region of one op is one kernel under jax.jit too: there is nothing to fuse, so no search
ONE_OP = ("one op: jax.jit runs it as one kernel too, so there is nothing to fuse (not "
          "searched)")


@dataclass(frozen=True)
class Round:
    """One round of region searches: how many distinct regions it searched, seconds each on
    average (`region_budgets` shares a round's budget by ops)."""

    searched: int
    seconds_each: float
    split: int                     # regions the round's failures were cut into, for the next


ROUND_SHARES = (0.5, 0.3, 0.2)     # of the budget, for each round


def search_program(p: Partition, config, *, cache=None, executor=None, progress=None):
    """Search the regions of `p`; where a region finds no fused kernel, cut it again under
    tighter limits (one matmul fewer, half the ops: `partition.tighter`) and search the pieces,
    for up to len(ROUND_SHARES) rounds; round k gets ROUND_SHARES[k] of the budget (fixed
    shares, not the time left: the same program asks the cache the same questions). No round
    starts once the rounds so far were given the whole budget (each search takes at least
    MIN_REGION_SECONDS). Returns (the final partition, its outcomes, the rounds)."""
    from mugraph.search.partition import refine, tighter
    known, rounds, given = {}, [], 0.0
    for k, share in enumerate(ROUND_SHARES):
        budget = max(MIN_REGION_SECONDS, config.budget_seconds * share)
        fresh = len({r.spec for r in p.regions if r.spec is not None and r.ops > 1} - set(known))
        outcomes = search_regions(p, config.replace(budget_seconds=budget), cache=cache,
                                  executor=executor, known=known, progress=progress)
        split = {o.region.index: t for o in outcomes if not o.fused and o.region.spec is not None
                 and (t := tighter(o.region, p.limits)) is not None}
        each = region_budget(budget, fresh, config.workers)
        given += each * fresh / max(1, min(config.workers, fresh))
        last = k == len(ROUND_SHARES) - 1 or given >= config.budget_seconds
        rounds.append(Round(fresh, each, 0 if last else len(split)))
        if not split or last:
            break
        p = refine(p, split, config.target)
    return p, outcomes, tuple(rounds)


def search_regions(p: Partition, config, *, cache=None, executor=None, known=None,
                   progress=None) -> list:
    """An Outcome per region of `p` (in region order). `cache`: a ResultCache or None;
    `executor`: a search.executors executor (default: by `config.workers`); `known`: answers by
    spec from earlier rounds (used as they are; new ones are added); `progress`: each search's
    progress display (as `search`'s), in-process only (workers keep quiet)."""
    from mugraph.search.executors import make_executor
    known = {} if known is None else known
    searchable = [r for r in p.regions if r.spec is not None and r.ops > 1]
    groups: dict = {}
    for r in searchable:
        groups.setdefault(r.spec, []).append(r.index)
    distinct = [spec for spec in groups if spec not in known]
    if distinct:
        budgets = region_budgets(config.budget_seconds, distinct, config.workers)
        own = executor is None
        executor = executor or make_executor(min(config.workers, len(distinct)))
        folder = str(cache.folder) if cache is not None else None
        shown = progress if getattr(executor, "name", "") == "in-process" else _silent
        try:
            answers = list(executor.map(search_task, [
                (spec, config.replace(budget_seconds=seconds, workers=1), folder, shown)
                for spec, seconds in zip(distinct, budgets)]))
        finally:
            if own:
                executor.close()
        known.update(zip(distinct, answers))
    by_spec = known
    outcomes = []
    for r in p.regions:
        if r.spec is None:
            outcomes.append(Outcome(r, False, r.note))
            continue
        if r.ops <= 1:
            outcomes.append(Outcome(r, False, ONE_OP, None, None,
                                    xla_estimate(r.spec, config.target).seconds))
            continue
        first = groups[r.spec][0]
        outcome = decide(r, by_spec[r.spec], config.target)
        outcomes.append(outcome if first == r.index else
                        Outcome(r, outcome.fused, outcome.reason, outcome.answer,
                                outcome.kernel_s, outcome.xla_s, same_as=first))
    return outcomes


def search_task(task):
    """One executor task: (spec, config, cache folder or None, progress) -> Answer, or the
    error's text."""
    from mugraph.search.cache import ResultCache
    from mugraph.search.cached import cached_search
    spec, config, folder, progress = task
    store = ResultCache(folder) if folder is not None else False
    try:
        return cached_search(spec, config, cache=store, progress=progress)
    except MugraphError as e:
        return f"{type(e).__name__}: {e.message.splitlines()[0]}"


def _silent(*_) -> None:
    return None


def decide(region: Region, answer, target: str) -> Outcome:
    """Fused when the winner has a custom kernel, is EQUIVALENT and beats jax.jit's estimate."""
    xla = xla_estimate(region.spec, target).seconds
    if isinstance(answer, str):
        return Outcome(region, False, f"its search failed: {answer}", None, None, xla)
    result = answer.result
    best = result.best_candidate
    if best.origin != "search" or not best.graph.custom_ops():
        return Outcome(region, False, _no_fused_reason(result), answer, best.seconds, xla)
    verification = result.report.verification
    if verification is None or not verification.equivalent:
        why = getattr(verification, "reason", None) or "not verified"
        return Outcome(region, False, f"its winner is not verified EQUIVALENT ({why})", answer,
                       best.seconds, xla)
    if best.seconds >= xla:
        return Outcome(region, False, f"its best kernel is estimated {best.seconds * 1e6:.2f} us, "
                                      f"slower than jax.jit's {xla * 1e6:.2f} us", answer,
                       best.seconds, xla)
    return Outcome(region, True, "", answer, best.seconds, xla)


def _no_fused_reason(result) -> str:
    """Why a search's winner has no custom kernel: none found, or every one found estimated
    slower than the spec's own library kernels (a compute-bound GEMM: cuBLAS's rate against
    mma.sync's)."""
    report = result.report
    fused = [c for c in result.candidates if c.origin == "search" and c.graph.custom_ops()]
    if not fused:
        return f"the search found no fused kernel ({report.stop_reason} after {report.states} states)"
    spec = result.candidates[0]
    return (f"the search found {report.verified} verified fused structures, but the best fused "
            f"kernel is estimated {fused[0].seconds * 1e6:.2f} us, slower than the spec's own "
            f"kernels ({spec.seconds * 1e6:.2f} us)")


# ---- the whole program ------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimates:
    """End-to-end estimates of the program (seconds on the target)."""

    stitched: float | None         # fused kernels + XLA-like for the lifted steps left to JAX
    baseline: float | None         # XLA-like baseline of the whole lifted program
    unfused: float | None          # one library launch per lifted op
    jax_only: float                # steps only JAX runs, charged alike on both sides
    note: str = ""
    floor: float | None = None     # the lifted program's roofline (its inputs read and outputs
                                   # written once at peak HBM bandwidth, or its essential FLOPs at
                                   # the tensor-core peak, one launch) + the JAX-only steps: no
                                   # stitched program doing the program's work is estimated below it

    @property
    def ceiling(self) -> float | None:
        """The largest speedup over the baseline any stitched program could be estimated at:
        baseline / floor (a target above it cannot be met under this model)."""
        if not self.floor or self.baseline is None:
            return None
        return self.baseline / self.floor

    @property
    def speedup(self) -> float | None:
        if not self.stitched or self.baseline is None:
            return None
        return self.baseline / self.stitched

    @property
    def speedup_vs_unfused(self) -> float | None:
        if not self.stitched or self.unfused is None:
            return None
        return self.unfused / self.stitched


def whole_estimates(p: Partition, outcomes: list, target: str) -> Estimates:
    """The Estimates with the fused regions of `outcomes`."""
    fused = [o for o in outcomes if o.fused]
    jax_only = _jax_steps_estimate(p, target)
    whole = _lifted_graph(p, set())
    rest = _lifted_graph(p, {o.region.index for o in fused})
    if whole is False or rest is False:
        return Estimates(None, None, None, jax_only, "the lifted steps do not lift together")
    base = xla_estimate(whole, target).seconds if whole is not None else 0.0
    unfused = estimate(whole, target).seconds if whole is not None else 0.0
    rest_s = xla_estimate(rest, target).seconds if rest is not None else 0.0
    kernels = sum(o.kernel_s for o in fused)
    floor = roofline(whole, target).seconds if whole is not None else 0.0
    return Estimates(kernels + rest_s + jax_only, base + jax_only, unfused + jax_only, jax_only,
                     floor=floor + jax_only)


MAX_ESTIMATES = 40      # whole-program estimates spent choosing which regions stay fused ...
MAX_ESTIMATE_WORK = 2e6  # ... and their work (graph nodes x matmuls: the XLA-like baseline's
                         # cost grows so), which bounds the choice on a stack of many layers


def never_slower(p: Partition, outcomes: list, target: str) -> tuple[list, Estimates]:
    """The fused regions the whole-program estimate prefers, and its Estimates. From every
    region that wins alone, the group of identical regions whose return to JAX lowers the
    stitched estimate most goes back, while one does (XLA fuses a region's ops with its
    neighbours, which a custom kernel's edge prevents). On a stack of identical layers these
    trials run on one layer (every layer has the same regions), elsewhere on the whole program
    while a round of trials fits in MAX_ESTIMATES estimates (fewer on a large program:
    MAX_ESTIMATE_WORK). Then, while the stitched program is still estimated slower than the
    whole program's XLA-like baseline, the group that gains least alone goes back, down to
    `fn` itself."""
    window = _one_layer(p, outcomes)
    if window is not None:
        returned = _improve(*window, target)[1]
    else:
        returned = _improve(p, outcomes, target)[1]
    for spec, why in returned:
        outcomes = _to_jax(outcomes, spec, why)
    est = whole_estimates(p, outcomes, target)
    while _fused_specs(outcomes) and est.stitched is not None and est.baseline is not None \
            and est.stitched > est.baseline:
        worst = min((o for o in outcomes if o.fused), key=lambda o: o.xla_s - o.kernel_s)
        why = (f"fused alone it is estimated faster ({worst.kernel_s * 1e6:.2f} us vs "
               f"{worst.xla_s * 1e6:.2f} us), but the stitched program was estimated "
               f"{est.stitched * 1e6:.2f} us against jax.jit's {est.baseline * 1e6:.2f} us for "
               "the whole (XLA fuses across the region's edges)")
        outcomes = _to_jax(outcomes, worst.region.spec, why)
        est = whole_estimates(p, outcomes, target)
    return outcomes, est


def _improve(p: Partition, outcomes: list, target: str) -> tuple[list, list]:
    """(outcomes, [(spec, why)] returned to JAX) by best-improvement trials on `p`."""
    est, spent, allowed = whole_estimates(p, outcomes, target), 1, _estimates_allowed(p)
    returned = []
    while est.stitched is not None and spent + len(_fused_specs(outcomes)) <= allowed:
        trials = []
        for spec in _fused_specs(outcomes):
            trials.append((whole_estimates(p, _to_jax(outcomes, spec, None), target), spec))
            spent += 1
        better = min(trials, key=lambda t: t[0].stitched, default=None)
        if better is None or better[0].stitched >= est.stitched * (1 - 1e-9):
            break
        why = _whole_reason(est, better[0])
        outcomes = _to_jax(outcomes, better[1], why)
        returned.append((better[1], why))
        est = better[0]
    return outcomes, returned


def _one_layer(p: Partition, outcomes: list):
    """(partition, outcomes) of one middle layer of a stack of identical layers, its regions
    renumbered, or None when the program does not repeat."""
    from dataclasses import replace
    from mugraph.search.layers import layer_groups
    groups = layer_groups(p.classification)
    layers = sorted(set(groups.values()))
    if len(layers) < 3:
        return None
    middle = layers[len(layers) // 2]

    def first_step(kind, x):
        return p.regions[x].steps[0] if kind == "region" else x

    items, regions, chosen = [], [], []
    for kind, x in p.items:
        if groups.get(first_step(kind, x).index) != middle:
            continue
        if kind == "region":
            region = replace(p.regions[x], index=len(regions))
            chosen.append(replace(outcomes[x], region=region))
            items.append(("region", region.index))
            regions.append(region)
        else:
            items.append((kind, x))
    return replace(p, items=tuple(items), regions=tuple(regions)), chosen


def _estimates_allowed(p: Partition) -> int:
    whole = _lifted_graph(p, set())
    if not whole:
        return MAX_ESTIMATES
    nodes = whole.nodes
    work = len(nodes) * max(1, sum(n.op is KOp.MATMUL for n in nodes))
    return int(max(2, min(MAX_ESTIMATES, MAX_ESTIMATE_WORK // work)))


def _fused_specs(outcomes) -> list:
    return list(dict.fromkeys(o.region.spec for o in outcomes if o.fused))


def _to_jax(outcomes, spec, why) -> list:
    """`outcomes` with every fused region of `spec` kept as JAX (for `why`)."""
    return [Outcome(o.region, False, why or "", o.answer, o.kernel_s, o.xla_s, o.same_as)
            if o.fused and o.region.spec is spec else o for o in outcomes]


def _whole_reason(before: Estimates, after: Estimates) -> str:
    return (f"fused alone it is estimated faster, but the whole program is estimated faster with "
            f"it as JAX ({after.stitched * 1e6:.2f} us against {before.stitched * 1e6:.2f} us): "
            "XLA fuses its ops with its neighbours")


def _lifted_graph(p: Partition, leave_out: set):
    """The lifted steps outside the regions `leave_out`, lifted together (what jax.jit sees of
    them): a KernelGraph, None when there is nothing to compute, False when they do not lift
    together."""
    steps = [s for r in p.regions if r.index not in leave_out for s in r.steps]
    if not steps:
        return None
    order = {s.index: k for k, (kind, s) in enumerate(_flat_items(p))}
    steps.sort(key=lambda s: order[s.index])
    region = lift_region(p.classification, steps)
    return region.spec if region.lifted else False


def _flat_items(p: Partition):
    """(kind, step) for every scheduled step, regions expanded in place."""
    for kind, x in p.items:
        if kind == "region":
            for s in p.regions[x].steps:
                yield "lift", s
        else:
            yield kind, x


def _jax_steps_estimate(p: Partition, target: str) -> float:
    """Each stretch of consecutive JAX steps as one fused kernel: the bytes it reads from
    outside and writes for outside, one launch."""
    c = p.classification
    total, stretch = 0.0, []
    for kind, x in list(p.items) + [("end", None)]:
        if kind == "jax":
            stretch.append(x)
            continue
        if stretch:
            total += _stretch_seconds(c, stretch, target)
            stretch = []
    return total


def _stretch_seconds(c, steps, target: str) -> float:
    from mugraph.ir.node import kernel_input
    inside = {s.index for s in steps}
    made = {v for s in steps for v in s.outs}
    reads = {v for s in steps for v in s.value_ins() if v not in made}
    writes = [v for v in made if any(u == PROGRAM_OUTPUT or u not in inside
                                     for u in c.consumers.get(v, ()))]
    # reads as fp32 vectors of the same byte count (integer values have no IR dtype)
    nodes = [kernel_input(f"v{v}", (max(1, c.program.value(v).nbytes // 4),), "float32")
             for v in reads if not c.is_const(v)]
    write = sum(c.program.value(v).nbytes for v in writes)
    return fused_kernel("jax steps", nodes, write, 0, 0, target).seconds
