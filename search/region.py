"""One region: a stretch of lifted steps lifted alone into its own KernelGraph, the spec its
search starts from. Values from outside enter as inputs named in0, in1, ... in first-use order
and its results leave as out0, out1, ...: the same structure at the same shapes (every layer of a
model) is the same KernelGraph, so one search (and one cache entry) serves them all."""
from __future__ import annotations

from dataclasses import dataclass

from jax.extend.core import Literal

from mugraph.ir.errors import MugraphError, UnsupportedOp
from mugraph.ir.graph import KernelGraph
from mugraph.ir.jax_frontend import (Const, Opaque, boundary_input, boundary_view, exported_node, lift_eqn,
                                     literal_value)
from mugraph.ir.node import toposort
from mugraph.ir.ops import KERNEL_LAYOUT, KERNEL_LEAF, KOp
from mugraph.search.classify import PROGRAM_OUTPUT, Classification, deep_recursion


@dataclass(frozen=True)
class Region:
    """A stretch of lifted steps searched as one program."""

    index: int
    steps: tuple                   # Step, in schedule order
    inputs: tuple                  # value ids entering, in the spec's input order (in0, in1, ...)
    outputs: tuple                 # value ids leaving, in the spec's output order (out0, ...)
    free_outputs: tuple            # (value id, number): results that are one constant (JAX fills)
    spec: KernelGraph | None       # None: nothing to compute (layout only), or it did not lift
    note: str = ""                 # why there is no spec
    estimate_s: float = 0.0        # the partitioner's fused estimate
    lifted: bool = True            # False: the steps do not lift as one region (see `note`)

    @property
    def matmuls(self) -> int:
        return 0 if self.spec is None else sum(n.op is KOp.MATMUL for n in self.spec.nodes)

    @property
    def ops(self) -> int:
        return 0 if self.spec is None else sum(is_compute(n) for n in self.spec.nodes)


def is_compute(node) -> bool:
    return node.op not in KERNEL_LAYOUT and node.op not in KERNEL_LEAF


def rebuilt(c: Classification, vid) -> bool:
    """A constant the region rebuilds itself (uniform, or an index expression)."""
    return c.is_const(vid) and not isinstance(c.lifted.get(vid), Opaque)


def lift_region(c: Classification, steps, index: int = 0, seconds: float = 0.0) -> Region:
    """The region of `steps` with its spec (canonical names: in0.., out0..)."""
    with deep_recursion():
        return _lift_region(c, steps, index, seconds)


def _lift_region(c: Classification, steps, index: int, seconds: float) -> Region:
    inside = {s.index for s in steps}
    env, inputs = {}, []
    try:
        for step in steps:
            args = [_region_arg(c, x, env, inputs) for x in step.ins]
            env.update(zip(step.outs, lift_eqn(step.eqn, args)))
    except (UnsupportedOp, MugraphError) as e:
        return _unlifted(steps, index, inputs, f"the region does not lift alone: "
                                                f"{e.message.splitlines()[0]}")
    except RecursionError:
        return _unlifted(steps, index, inputs, "the region does not lift alone: the front end "
                                                "recursed too deep")
    leaving = [v for s in steps for v in s.outs
               if any(u == PROGRAM_OUTPUT or u not in inside for u in c.consumers.get(v, ()))]
    outputs = [v for v in leaving if not isinstance(env[v], Const)]
    free = tuple((v, env[v].value) for v in leaving if isinstance(env[v], Const))
    try:
        nodes = [exported_node(env[v], c.program.value(v).shape, c.program.value(v).dtype)
                 for v in outputs]
    except MugraphError as e:
        return _unlifted(steps, index, inputs, f"a result cannot leave the region: "
                                                f"{e.message.splitlines()[0]}")
    if not nodes or not any(is_compute(n) for n in toposort(nodes)):
        return Region(index, tuple(steps), tuple(v for v, _ in inputs), tuple(outputs), free,
                      None, "nothing to compute (layout changes only)", seconds)
    spec = KernelGraph(nodes, inputs=[n for _, n in inputs])
    return Region(index, tuple(steps), tuple(v for v, _ in inputs), tuple(outputs), free, spec,
                  "", seconds)


def _unlifted(steps, index, inputs, note: str) -> Region:
    return Region(index, tuple(steps), tuple(v for v, _ in inputs), (), (), None, note,
                  lifted=False)


def _region_arg(c: Classification, x, env: dict, inputs: list):
    """A step operand inside a region: a literal, a value made in the region, a constant the
    region rebuilds, or a new input."""
    if isinstance(x, Literal):
        return literal_value(x)
    if x in env:
        return env[x]
    if rebuilt(c, x):
        return c.lifted[x]
    v = c.program.value(x)
    view = boundary_view(f"in{len(inputs)}", v.shape, v.dtype)
    if view is None:
        raise UnsupportedOp(f"{v.describe()} cannot enter a kernel", primitive="input")
    env[x] = view
    inputs.append((x, boundary_input(view)))
    return view


def describe_region(region: Region) -> str:
    """One line: the steps' primitives and where they come from."""
    prims = [s.primitive for s in region.steps if s.primitive not in _QUIET]
    counts: dict = {}
    for name in prims:
        counts[name] = counts.get(name, 0) + 1
    shown = ", ".join(f"{n} x{k}" if k > 1 else n for n, k in counts.items())
    return shown or "layout only"


_QUIET = frozenset({"broadcast_in_dim", "reshape", "squeeze", "transpose", "convert_element_type",
                    "stop_gradient", "copy", "copy_p"})
