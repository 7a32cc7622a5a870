"""Schedule skeletons: which labels the grid splits and which one the loop walks.

A skeleton is shape-free: it names labels, not sizes. At the reduced instantiation each split
gets the smallest extent that yields at least two tiles (two blocks, two iterations); the real
sizes are chosen later by the cost model (`sizing.py`). Imaps and fmaps follow from labels: a
grid axis splits, in every input, the dim whose outer label it names.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from mugraph.search.labels import UNIT, UNIT_DIM, DimLabel, Label


@dataclass(frozen=True)
class Skeleton:
    grid: tuple[Label, ...]       # labels split by grid axes x, y, z (at most 3, distinct)
    loop: Label | None            # the label the for-loop walks

    def __str__(self) -> str:
        axes = ", ".join(f"{a}={lab!r}" for a, lab in zip("xyz", self.grid)) or "single block"
        loop = f"loop over {self.loop!r}" if self.loop is not None else "no loop"
        return f"grid({axes}), {loop}"


def _smallest_split(n: int) -> int:
    for d in range(2, n + 1):
        if n % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class ReducedSizes:
    """The grid extents and trip count of a skeleton at the reduced instantiation."""

    grid: tuple[int, int, int]
    forloop: int
    per_label: dict            # label -> (grid extent, loop trips)


def reduced_sizes(sk: Skeleton) -> ReducedSizes | None:
    grid, per_label, forloop = [], {}, 1
    for lab in sk.grid:
        e = _smallest_split(lab.extent)
        grid.append(e)
        per_label[lab] = (e, 1)
    if sk.loop is not None:
        e = per_label.get(sk.loop, (1, 1))[0]
        rest = sk.loop.extent // e
        forloop = _smallest_split(rest)
        if forloop < 2:
            return None
        per_label[sk.loop] = (e, forloop)
    grid += [1] * (3 - len(grid))
    if any(e < 2 for e in grid[:len(sk.grid)]):
        return None
    return ReducedSizes(tuple(grid), forloop, per_label)


def labels_of_tensors(tensors) -> list[Label]:
    """The splittable labels (outer factors of non-unit dims) of a set of tensors, by uid."""
    seen = {}
    for t in tensors:
        for dl in t.labels:
            if dl is not UNIT_DIM and dl.outer is not UNIT:
                seen.setdefault(dl.outer.uid, dl.outer)
    return [seen[k] for k in sorted(seen)]


def skeletons(tensors, is_reduction, max_axes: int = 3, final: bool = False):
    """Every useful skeleton over the labels of `tensors`, most promising first.

    The loop walks a reduction label (an accumulator over a parallel label would add up
    different output elements). In a candidate's last kernel the grid splits only parallel
    labels: a split reduction leaves partial results that another kernel must combine.
    Promising first: parallel splits, then more axes.
    """
    labels = labels_of_tensors(tensors)
    loops = [lab for lab in labels if is_reduction(lab)] + [None]
    splittable = [lab for lab in labels if not (final and is_reduction(lab))]
    out = []
    for k in range(min(max_axes, len(splittable)), -1, -1):
        for grid in itertools.combinations(splittable, k):
            for loop in loops:
                sk = Skeleton(grid, loop)
                sizes = reduced_sizes(sk)
                if sizes is not None and all(divides(t, sk, sizes) for t in tensors):
                    out.append(sk)
    def rank(sk):
        split_reductions = sum(1 for lab in sk.grid if is_reduction(lab))
        return (split_reductions, sk.loop is None, -len(sk.grid))
    return sorted(out, key=rank)


def divides(tensor, sk: Skeleton, sizes: ReducedSizes) -> bool:
    """Whether the skeleton's grid and loop cut `tensor` into whole tiles.

    Sizes come from label extents, but a tensor's dim may be shorter than its label (a block that
    accumulated loop tiles of a dim writes one tile's worth of it): such a dim may not divide."""
    imap, fmap = input_maps(tensor.labels, sk)
    tile = list(tensor.node.shape)
    for axis, dim in enumerate(imap):
        if dim is not None:
            if tile[dim] % sizes.grid[axis]:
                return False
            tile[dim] //= sizes.grid[axis]
    return fmap is None or tile[fmap] % sizes.forloop == 0


def input_maps(labels: tuple[DimLabel, ...], sk: Skeleton) -> tuple[tuple, int | None]:
    """imap and fmap of one input tensor (by its dim labels) under a skeleton."""
    def dim_of(lab):
        for d, dl in enumerate(labels):
            if dl is not UNIT_DIM and dl.outer is lab:
                return d
        return None
    imap = tuple(dim_of(lab) for lab in sk.grid) + (None,) * (3 - len(sk.grid))
    fmap = dim_of(sk.loop) if sk.loop is not None else None
    return imap, fmap


def tile_labels(labels: tuple[DimLabel, ...], imap, fmap, sizes: ReducedSizes, sk: Skeleton):
    """Dim labels of an input's tile: a fully split outer factor leaves the inner factors."""
    out = []
    for d, dl in enumerate(labels):
        split = [sk.grid[a] for a, dim in enumerate(imap) if dim == d and a < len(sk.grid)]
        if fmap == d:
            split.append(sk.loop)
        if not split:
            out.append(dl)
            continue
        lab = dl.outer
        g, f = sizes.per_label.get(lab, (1, 1))
        # a fully split composite dim leaves its inner factors; a plain label keeps its name
        # even at extent 1, so outputs can still be written along it
        out.append(DimLabel(dl.factors[1:]) if g * f == lab.extent and len(dl.factors) > 1 else dl)
    return tuple(out)
