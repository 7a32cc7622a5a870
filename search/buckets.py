"""Shape buckets: a winner found for one shape serves another shape of the same program. When the
two specs are the same program up to their extents (and the constants derived from them), the
winner's structure is re-sized for the new shapes by the cost model and verified there, without a
search; when it does not fit or does not verify, the caller searches.
"""
from __future__ import annotations

import dataclasses
import time

from mugraph.ir.ops import KOp

_SHAPE_ARGS = (KOp.RESHAPE, KOp.BROADCAST)


def structure(spec) -> tuple:
    """The spec with its extents left out: two specs with equal structures differ only in the
    sizes of their dims and in the constants derived from them."""
    index = {n: i for i, n in enumerate(spec.nodes)}
    return tuple((n.op, tuple(index[s] for s in n.srcs), _shape_free(n)) for n in spec.nodes), \
        tuple(spec.output_names), tuple(index[o] for o in spec.outputs)


def _shape_free(node):
    if node.op is KOp.INPUT:
        return (node.arg[0], node.arg[2], len(node.arg[1]))
    if node.op is KOp.CONSTANT:
        return (node.arg[2], len(node.arg[1]))       # the value may be shape-derived (1/n)
    if node.op in _SHAPE_ARGS:
        return len(node.arg)
    return node.arg


def structure_digest(spec) -> str:
    import hashlib
    return hashlib.sha256(repr(structure(spec)).encode()).hexdigest()


def derived_constants(old_spec, new_spec) -> dict:
    """Old value -> new value of every constant that changed with the shapes: kernel constants
    (1/n of a mean) and the extents an rms_norm divides by (block graphs hold them)."""
    mapping = {}
    for old, new in zip(old_spec.nodes, new_spec.nodes):
        if old.op is KOp.CONSTANT and old.arg[0] != new.arg[0]:
            mapping[float(old.arg[0])] = float(new.arg[0])
        if old.op is KOp.RMS_NORM:
            dim = old.arg[0]
            n_old, n_new = old.srcs[0].shape[dim], new.srcs[0].shape[dim]
            if n_old != n_new:
                mapping[float(n_old)] = float(n_new)
    return mapping


@dataclasses.dataclass(frozen=True)
class Resized:
    """A winner re-sized for new shapes, with its check at those shapes."""

    graph: object
    estimate: object
    verification: object
    seconds: float
    sampled: str | None = None     # what the check ran on when not the whole output


def resize_winner(old_spec, old_graph, new_spec, target: str, seed: int = 0) -> Resized | None:
    """`old_graph` (a winner for `old_spec`) sized for `new_spec` by the cost model and checked
    against it (the check a search gives its winner, bounded in time and memory by sampling
    output blocks: `final_check.plan`); None when the specs are not the same program up to
    shapes, when no sizing fits, or when no sizing passes or can be checked."""
    from mugraph.ir.errors import ResourceError
    from mugraph.search.cost import estimate, estimate_floor, fits
    from mugraph.search.final_check import plan
    from mugraph.search.sizing import size_structure
    from mugraph.verify import check, quick_equivalent
    start = time.perf_counter()
    if structure(old_spec) != structure(new_spec):
        return None
    constants = derived_constants(old_spec, new_spec)
    sized = size_structure(old_graph, list(new_spec.inputs), constants, target, estimate,
                           lambda g: fits(g, target), estimate_floor) if old_graph.custom_ops() else \
        _library_only(old_graph, new_spec, target)
    for est, graph in sized:
        try:
            pair = plan(new_spec, graph)
        except ResourceError:       # its check does not fit the memory limit: search instead
            return None
        if quick_equivalent(pair.spec, pair.candidate, seed=seed):
            report = check(pair.spec, pair.candidate, seed=seed)
            if report.equivalent:
                return Resized(graph, est, report, time.perf_counter() - start, pair.sampled)
    return None


def _library_only(old_graph, new_spec, target):
    """A winner without custom kernels (the spec itself, or library ops): rebuilt over the new
    inputs as it is."""
    from mugraph.search.cost import estimate
    from mugraph.search.instantiate import resize
    graph = resize(old_graph, list(new_spec.inputs), lambda key, srcs: None, {})
    return [(estimate(graph, target), graph)] if graph is not None else []


def resized_result(old_result, new_spec, resized: Resized, target: str, note: str):
    """A SearchResult for the re-sized winner: the new estimate and check, the old search's
    counts, and `note` saying where it came from."""
    from mugraph.search.cost import estimate, roofline
    from mugraph.search.result import Candidate, SearchResult
    from mugraph.search.runner import describe
    winner = Candidate(resized.graph, resized.estimate, describe(resized.graph), "resized")
    unfused = Candidate(new_spec, estimate(new_spec, target), "the unfused spec (library kernels)",
                        "spec")
    report = dataclasses.replace(
        old_result.report, verification=resized.verification,
        spec_estimate=unfused.estimate, roofline=roofline(new_spec, target), target=target,
        resized=note, resumed="")
    ranked = [winner] if resized.graph is new_spec else [winner, unfused]
    return SearchResult(winner.graph, tuple(ranked), report, new_spec)
