"""Where a kernel graph came from: the JAX function `from_jax` traced it from, kept beside the graph.

The table is weak and outside the graph, so a graph's structural identity (hash, equality, JSON)
does not change; the float test uses it to compare candidates with `jax.jit(fn)` itself.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class JaxOrigin:
    """A JAX function and the pytree structure of the example arguments it was traced with."""

    fn: Callable
    treedef: object                       # of the example arguments; leaves = graph inputs
    _jitted: list = field(default_factory=list, repr=False, compare=False)

    def run(self, arrays) -> list[np.ndarray]:
        """`jax.jit(fn)` on `arrays` (graph inputs in order, each in its dtype): flat outputs."""
        import jax
        if not self._jitted:
            self._jitted.append(jax.jit(self.fn))
        args = jax.tree_util.tree_unflatten(self.treedef, [np.asarray(a) for a in arrays])
        outs = jax.tree_util.tree_leaves(self._jitted[0](*args))
        return [np.asarray(o) for o in outs]


_ORIGINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def record_jax_origin(graph, fn: Callable, example_args) -> None:
    """Remember that `graph` is `fn` traced at `example_args` (the latest trace wins)."""
    import jax
    treedef = jax.tree_util.tree_structure(tuple(example_args))
    known = _ORIGINS.get(graph)
    if known is None or known.fn is not fn or known.treedef != treedef:  # keep its jax.jit
        _ORIGINS[graph] = JaxOrigin(fn, treedef)


def jax_origin(graph) -> JaxOrigin | None:
    """The JAX function `graph` was traced from, or None (built by hand, loaded from JSON)."""
    return _ORIGINS.get(graph)
