"""A search that remembers: answer from the result cache when an entry for the same search exists
and passes a fresh finite-field test against the spec; otherwise search and store the winner."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from mugraph.ir.errors import MugraphError
from mugraph.search.cache import (CorruptEntry, ResultCache, make_entry, read_entry, search_key)


@dataclass(frozen=True)
class Answer:
    """A search result and where it came from (`origin`: "search" or "cache"), in words."""

    result: object          # SearchResult
    origin: str
    note: str
    key: str | None = None


def cached_search(spec, config, *, cache=True, progress=None, executor=None,
                  extend: bool = True) -> Answer:
    """`search(spec, config)` through the cache (`cache`: True for the default one, a
    ResultCache, or False/None for none), resumable and stoppable.

    The budget is not in the key: a stored search serves an equal or smaller budget, and one that
    its budget stopped (time, states) is continued from its checkpoint when `config` gives it
    more (`extend`; False, for a budget nobody asked for, lets any stored search serve).
    The search saves checkpoints under its key; a run of the same search resumes from one.
    Ctrl-C or SIGTERM stops it within a second: `Interrupted` (a KeyboardInterrupt) is raised
    with the best structure verified so far as `.result` (a `Partial`) and the checkpoint kept."""
    from mugraph.search.checkpoint import Checkpointer
    check_memory(spec, config.target)
    store = ResultCache() if cache is True else (cache or None)
    key = search_key(spec, config) if store is not None else None
    found, why = Lookup("search"), ""
    if store is not None:
        found = lookup(store, key, config, extend)
        hit = _from_cache(store, found.entry, spec, config) if found.kind == "stored" else None
        if hit is None and found.kind == "search" and found.entry is None:
            hit, why = _from_bucket(store, key, spec, config)
        if hit is not None:
            return hit
        if found.kind == "search" and found.note:   # a continued search's report says so itself
            why = f"{found.note}; {why}"
    checkpoint = Checkpointer(store, key, continuing=found.note if found.kind == "continue"
                              else "") if store is not None else None
    result = _stoppable_search(spec, config, progress, executor, checkpoint)
    if store is None:
        return Answer(result, "search", "searched (no cache)")
    _remember(store, key, spec, config, result)
    if result.report.stop_reason not in CONTINUABLE:
        checkpoint.drop()       # kept otherwise: a larger budget continues from it
    note = result.report.resumed + "; " if result.report.resumed else ""
    return Answer(result, "search", f"{note}{why}searched; stored as cache entry {key[:12]}", key)


# the stop reasons of a search that more budget would take further
CONTINUABLE = ("time", "states")


@dataclass(frozen=True)
class Lookup:
    """What a search finds under its key: "stored" (a result that serves it), "continue" (a
    stored search its budget stopped, to go on from its checkpoint), "resume" (the checkpoint of
    a stopped run), or "search" (nothing to take up); `note` says why, for the report."""

    kind: str
    entry: object = None    # cache.Entry
    note: str = ""


def lookup(store, key: str, config, extend: bool = True) -> Lookup:
    """How `config`'s search takes up what the cache holds under `key` (see `cached_search`)."""
    entry, checkpoint = store.load(key), store.checkpoint(key)
    if entry is None:
        return Lookup("resume" if checkpoint is not None else "search")
    if not (extend and _wants_more(entry, config)):
        return Lookup("stored", entry)
    seconds, states = entry.budget
    stored = (f"the stored search {entry.key[:12]} (stopped by {entry.stop_reason} at a budget "
              f"of {seconds:g} s, {states} states)")
    if checkpoint is None:
        return Lookup("search", entry, f"{stored} left no checkpoint to continue from; searched "
                                       f"afresh with the larger budget")
    return Lookup("continue", entry, f"continued {stored} to {config.budget_seconds:g} s, "
                                     f"{config.budget_states} states")


def _wants_more(entry, config) -> bool:
    """Whether `config` raises the budget that stopped the stored search."""
    seconds, states = entry.budget
    stop = entry.stop_reason
    return (stop == "time" and config.budget_seconds > seconds) or \
        (stop == "states" and config.budget_states > states)


def _remember(store, key, spec, config, result) -> None:
    """The result under its key, in its shape bucket, with its generated code."""
    from mugraph.ir.serialize import to_json
    from mugraph.search.cache import bucket_key, describe_inputs
    store.store(make_entry(key, spec, config, result))
    store.add_to_bucket(bucket_key(spec, config), key, to_json(spec, indent=None),
                        describe_inputs(spec))
    store_sources(store, key, result.best, config.target)


def _from_bucket(store, key, spec, config) -> tuple[Answer | None, str]:
    """The winner of the same program at other shapes, re-sized and verified for these: an
    Answer, or (None, why the latest one did not apply)."""
    from mugraph.ir.serialize import from_json
    from mugraph.search.buckets import resize_winner, resized_result
    from mugraph.search.cache import bucket_key
    why = ""
    for old_key, spec_json, shapes in store.bucket(bucket_key(spec, config))[:3]:
        entry = store.load(old_key)
        if entry is None:
            continue
        try:
            old_spec = from_json(spec_json)
            old = read_entry(entry, old_spec)
        except Exception:  # a damaged bucket row or entry: the search goes on without it
            continue
        try:
            resized = resize_winner(old_spec, old.best, spec, config.target, seed=config.seed)
        except MugraphError as e:   # e.g. a mask whose dims the old shapes did not tie to the rest
            why = why or (f"the structure found for {shapes} does not re-size to these shapes "
                          f"({e.message.splitlines()[0]}); ")
            continue
        if resized is None:
            why = why or f"the structure found for {shapes} does not fit these shapes; "
            continue
        note = (f"re-sized from the structure found for {shapes} (cache entry {old_key[:12]}) "
                f"by the cost model, without a search; checked at these shapes "
                f"({resized.sampled or 'the whole output'}) in {resized.seconds:.2f} s: "
                f"{'EQUIVALENT' if resized.verification.equivalent else '?'}")
        result = resized_result(old, spec, resized, config.target, note)
        _remember(store, key, spec, config, result)
        return Answer(result, "resized", note, key), ""
    return None, why


# device memory of each target (bytes): A100 80 GB, H100 SXM 80 GB, H200 141 GB (NVIDIA data sheets)
DEVICE_MEMORY = {"a100": 80e9, "h100": 80e9, "h200": 141e9}


def check_memory(spec, target: str) -> None:
    """ResourceError when the spec's inputs and outputs alone exceed the target's memory (the
    search, verification and launch would all fail, or exhaust the host first)."""
    from mugraph.ir.errors import ResourceError
    tensors = {n: None for n in (*spec.inputs, *spec.outputs)}
    total = sum(_elems(n.shape) * n.dtype.itemsize for n in tensors)
    limit = DEVICE_MEMORY.get(target)
    if limit is not None and total > limit:
        largest = max(tensors, key=lambda n: _elems(n.shape) * n.dtype.itemsize)
        raise ResourceError(f"the program's inputs and outputs take {total / 1e9:.1f} GB, more "
                            f"than the {target}'s {limit / 1e9:.0f} GB (the largest: "
                            f"{list(largest.shape)} {largest.dtype.value})",
                            hint="split the work into smaller calls, or superoptimize a smaller "
                                 "instance (a structure found re-sizes to other shapes)")


def _elems(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class Partial:
    """What a stopped search had: its best verified structure sized for the real shapes (None
    when it had verified none), and a line saying how far it came and how to go on."""

    best: object            # KernelGraph or None
    estimate: object        # cost.Estimate or None
    note: str


def _stoppable_search(spec, config, progress, executor, checkpoint):
    from mugraph.ir.errors import Interrupted
    from mugraph.search import interrupt
    from mugraph.search.runner import search
    cancel = getattr(executor, "cancel", None)
    request = None
    try:
        with interrupt.stoppable(on_stop=cancel) as request:
            result = search(spec, config, progress=progress, executor=executor,
                            checkpoint=checkpoint)
    except KeyboardInterrupt:
        if checkpoint is not None and checkpoint.latest is not None:
            checkpoint.save(checkpoint.latest, force=True)  # the last task boundary reached
        raise Interrupted(*_partial(checkpoint, None, request)) from None
    except MemoryError:
        from mugraph.ir.errors import ResourceError
        raise ResourceError("this machine ran out of memory searching or verifying the program "
                            "at its real shapes",
                            hint="lower MUGRAPH_MEMORY_LIMIT (mugraph then samples or refuses "
                                 "its checks sooner), try a machine with more memory, or "
                                 "superoptimize a smaller instance of the program") from None
    if result.report.stop_reason == "interrupted" or request:
        raise Interrupted(*_partial(checkpoint, result, request))
    return result


def _partial(checkpoint, result, request) -> tuple[str, Partial]:
    """(message, Partial) from a result stopped by a signal, else from the last checkpoint."""
    signal = (request.signal if request else None) or "KeyboardInterrupt"
    resume = ("run the same search again to resume from the checkpoint" if checkpoint is not None
              else "no checkpoint kept (the cache is off)")
    state = checkpoint.latest if checkpoint is not None else None
    if result is not None and result.best_candidate.origin == "search":
        best, est = result.best, result.best_candidate.estimate
        where = f"{result.report.states} states, {result.report.verified} verified"
    elif state is not None and state.best() is not None:
        best, est = state.best().graph, state.best().estimate
        where = f"{state.counters.states} states, {state.counters.verified} verified"
    else:
        best, est, where = None, None, "no structure verified yet"
    what = ("the best kernel verified so far (finite-field test at the reduced shapes; not yet "
            "checked at the real shapes)" if best is not None else "nothing to show yet")
    message = f"search stopped by {signal} ({where}): {what}; {resume}"
    return message, Partial(best, est, message)


def _from_cache(store: ResultCache, entry, spec, config) -> Answer | None:
    key = entry.key
    start = time.perf_counter()
    try:
        result = read_entry(entry, spec)
        how = reverify(spec, result.best, config)
        if how is None:
            raise CorruptEntry("its winner failed a fresh finite-field test against the spec")
    except CorruptEntry as e:
        store.warn_once(key, f"result cache entry {key[:12]} cannot be used: {e}; searching "
                             "again and replacing it")
        store.delete(key)
        return None
    seconds = time.perf_counter() - start
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created))
    return Answer(result, "cache", f"from cache entry {key[:12]} (stored {when}{_budget_of(entry)}"
                                   f"), re-verified by a fresh finite-field test {how} in "
                                   f"{seconds:.2f} s", key)


def _budget_of(entry) -> str:
    """", a 60 s search stopped by time", for the origin line of a cache answer."""
    seconds, states = entry.budget
    return f", a {seconds:g} s / {states} state search stopped by {entry.stop_reason}"


def reverify(spec, graph, config) -> str | None:
    """Test a stored winner with fresh random draws (not the search's seed); say how, or None
    when it fails. Where the spec is larger than the search's reduced instantiation, the test
    runs the winner's structure there (what the search itself verifies; an exact test at the
    real shapes of a large matmul takes seconds per draw), and falls back to the real shapes
    when the structure does not re-size or fails there."""
    seed = secrets.randbits(31)
    small = _at_reduced_shapes(spec, graph, config)
    if small is not None and quick_equivalent(*small, tests=2, seed=seed):
        return "of its structure at the reduced shapes"
    if quick_equivalent(spec, graph, tests=2, seed=seed):
        return "at the real shapes"
    return None


def quick_equivalent(spec, graph, *, tests: int, seed: int) -> bool:
    from mugraph.verify import quick_equivalent as test
    return test(spec, graph, tests=tests, seed=seed)


def _at_reduced_shapes(spec, graph, config):
    """(reduced spec, the winner re-sized to it) as the search instantiates them, or None when
    the spec is no larger than that or the structure does not re-size. Iotas and tables are
    inputs there, as in the search (`search.leaves`): an iota takes the reduced extents, a table
    keeps its rigid dims; both are put back before the test."""
    from mugraph.ir.errors import MugraphError
    from mugraph.search.instantiate import reduced_extents, reinstantiate_spec, resize
    from mugraph.search.labels import analyze
    from mugraph.search.leaves import index_inputs, leaves_as_inputs, restore
    from mugraph.search.rules import canonicalize
    canonical, _ = canonicalize(spec)
    indexed, leaves = index_inputs(canonical)
    winner = leaves_as_inputs(graph, leaves, indexed)
    if winner is None:
        return None
    analysis = analyze(indexed)
    extents, constants = reduced_extents(analysis, indexed, config.reduced_extent)
    try:
        reduced = reinstantiate_spec(indexed, analysis, extents)
        if all(r.shape == s.shape for r, s in zip(reduced.inputs, indexed.inputs)):
            return None
        inverse = {real: small for small, real in constants.items()}
        small = resize(winner, list(reduced.inputs), _first_fit(inverse), inverse)
        if small is None:
            return None
        own = list(reduced.inputs[:len(spec.inputs)])
        return restore(reduced, leaves, own), restore(small, leaves, own)
    except MugraphError:   # a structure that does not re-size: the caller tests the real shapes
        return None


def _first_fit(constants):
    """A `resize` chooser: the first grid and trip count that the new sources admit (any valid
    sizing computes the structure's function; the test needs one, not the fastest)."""
    from mugraph.ir.errors import InvalidGraph
    from mugraph.search.instantiate import resize_block
    from mugraph.search.sizing import block_options

    def choose(key, srcs):
        for grid, forloop in block_options(key[0], srcs):
            try:
                resize_block(key[0], srcs, grid, forloop, constants)
                return grid, forloop
            except InvalidGraph:
                continue
        return None

    return choose


def store_sources(store: ResultCache, key: str, graph, target: str) -> None:
    """The winner's CUDA for the target's arch, and its CUBIN where NVRTC is installed."""
    from mugraph.codegen.compile import _nvrtc_version, compile_cuda
    from mugraph.codegen.generate import generate_cuda
    from mugraph.ir.errors import MugraphError
    from mugraph.search.targets import get_target
    if not graph.custom_ops():
        return
    arch = get_target(target).arch
    try:
        source = generate_cuda(graph, arch=arch)
    except MugraphError:
        return  # the kernel still runs through the interpreter; codegen errors surface on use
    cubin = None
    if _nvrtc_version():
        try:
            cubin = compile_cuda(source, arch, name="mugraph_kernel").cubin
        except MugraphError:
            cubin = None
    store.store_source(key, arch, source, cubin)
