"""Identical layers: where a program repeats one stretch of steps (a stack of layers, each with
its own parameters), the partitioner cuts every repetition alike, so each distinct region is
searched once."""
from __future__ import annotations

import numpy as np
from jax.extend.core import Literal

from mugraph.search.classify import Classification, Kind
from mugraph.search.flatten import Step


MIN_LAYER_STEPS = 4          # a repeated stretch shorter than this is not taken for a layer


def layer_groups(c: Classification) -> dict:
    """Step index -> layer number. Where the program (its non-constant steps in program order,
    JAX steps included) repeats one stretch of steps covering at least half of it (a stack of
    identical layers), each repetition is one layer: 1, 2, ...; steps before are layer 0 and
    steps after the last repetition one more. Elsewhere every step is layer 0. The scheduler
    runs layer by layer and runs end between layers, so every layer is cut alike."""
    steps = [s for s in c.program.steps if c.kind(s.index) is not Kind.CONST]
    found = _repetition(np.array(_codes(steps))) if steps else None
    if found is None:
        return {s.index: 0 for s in steps}
    start, length, count = found
    return {s.index: 0 if k < start else min(1 + (k - start) // length, count + 1)
            for k, s in enumerate(steps)}


def layer_boundaries(c: Classification, order: list[Step], groups: dict) -> frozenset:
    """Positions of `order` where the layer changes (less those a value that cannot leave a
    kernel crosses)."""
    found = {k for k in range(1, len(order))
             if groups[order[k].index] != groups[order[k - 1].index]}
    return frozenset(found) - _uncuttable(c, order)


def _codes(order) -> list[int]:
    codes: dict = {}
    return [codes.setdefault(signature(s), len(codes)) for s in order]


def _repetition(codes: np.ndarray):
    """(start, length, count) of the stretch of `count` >= 2 repetitions of one stretch of
    `length` steps covering the most of `codes` (at least half of it), or None."""
    n, best = len(codes), None
    for length in range(MIN_LAYER_STEPS, n // 2 + 1):
        longest = _longest_true(codes[:-length] == codes[length:])
        count = (longest[0] + length) // length
        if count >= 2 and 2 * count * length >= n and \
                (best is None or count * length > best[1] * best[2]):
            best = (longest[1], length, count)
    return best


def _longest_true(flags: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest stretch of True in `flags` ((0, 0) when none)."""
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if not len(starts):
        return 0, 0
    k = int(np.argmax(ends - starts))
    return int(ends[k] - starts[k]), int(starts[k])


def _uncuttable(c: Classification, order) -> set:
    """Positions a value that cannot leave a kernel crosses (from its maker to its last use)."""
    pos = {s.index: k for k, s in enumerate(order)}
    bad: set = set()
    for s in order:
        if c.kind(s.index) is not Kind.LIFT:
            continue
        for vid in s.outs:
            users = [pos[u] for u in c.consumers.get(vid, ()) if u in pos]
            if users and c.exportable(vid) is not None:
                bad.update(range(pos[s.index] + 1, max(users) + 1))
    return bad


def period(run) -> int:
    """The shortest p that divides len(run) with step k like step k + p for every k (primitive,
    operand and result types, parameters), or len(run)."""
    sigs = [signature(s) for s in run]
    m = len(sigs)
    for p in range(1, m // 2 + 1):
        if m % p == 0 and all(sigs[k] == sigs[k % p] for k in range(p, m)):
            return p
    return m


def signature(step: Step) -> tuple:
    eqn = step.eqn
    avals = tuple(str(v.aval) for v in (*eqn.invars, *eqn.outvars))
    literals = tuple(repr(x.val) for x in step.ins if isinstance(x, Literal))
    return eqn.primitive.name, avals, literals, repr(sorted(eqn.params.items()))
