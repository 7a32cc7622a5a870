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
    input_shapes: tuple = ()              # the traced shapes of the leaves (0-d scalars: ())
    output_shapes: tuple = ()             # the traced shapes of the flat outputs

    def run(self, arrays) -> list[np.ndarray]:
        """`jax.jit(fn)` on `arrays` (graph inputs in order, each in its dtype): flat outputs, a
        0-d output as the graph holds it ([1])."""
        import jax
        if not self._jitted:
            self._jitted.append(jax.jit(self.fn))
        arrays = [np.asarray(a) for a in arrays]
        if self.input_shapes:
            arrays = [a.reshape(s) for a, s in zip(arrays, self.input_shapes)]
        args = jax.tree_util.tree_unflatten(self.treedef, arrays)
        outs = jax.tree_util.tree_leaves(self._jitted[0](*args))
        return [np.asarray(o).reshape(-1) if np.ndim(o) == 0 else np.asarray(o) for o in outs]


_ORIGINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def record_jax_origin(graph, fn: Callable, example_args, output_shapes=None) -> None:
    """Remember that `graph` is `fn` traced at `example_args` (the latest trace wins), whose flat
    outputs have `output_shapes` (a 0-d output is a [1] tensor of the graph)."""
    import jax
    leaves, treedef = jax.tree_util.tree_flatten(tuple(example_args))
    inputs = tuple(tuple(np.shape(leaf)) for leaf in leaves)
    outputs = tuple(tuple(s) for s in output_shapes) if output_shapes is not None else \
        tuple(o.shape for o in graph.outputs)
    known = _ORIGINS.get(graph)
    if known is None or known.fn is not fn or known.treedef != treedef:  # keep its jax.jit
        _ORIGINS[graph] = JaxOrigin(fn, treedef, input_shapes=inputs, output_shapes=outputs)


def traced_outputs(graph, outputs) -> list:
    """`outputs` of `graph` (arrays in its output order) in the shapes its JAX function returns
    them: a 0-d scalar where the function returns one (a mean loss), the graph's [1] otherwise
    the same. Graphs not traced from JAX keep their shapes."""
    origin = _ORIGINS.get(graph)
    if origin is None or not origin.output_shapes:
        return list(outputs)
    return [np.reshape(o, s) if s == () and np.size(o) == 1 else o
            for o, s in zip(outputs, origin.output_shapes)]


def jax_origin(graph) -> JaxOrigin | None:
    """The JAX function `graph` was traced from, or None (built by hand, loaded from JSON)."""
    return _ORIGINS.get(graph)
