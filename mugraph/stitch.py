"""Run a program of regions: JAX for the steps it keeps, a region runner for the fused regions.

One walk serves every path: `run_plan(plan, leaves, run_region)` evaluates the flat program in
schedule order, binding each JAX step's primitive (as `jax.core.eval_jaxpr` does) and calling
`run_region(outcome, inputs)` for each fused region (its winner on the CPU harness, through the
interpreter, or as a custom call inside `jax.jit`). Constant-only steps run on demand. A 0-d
value crosses a region's edge as a shape-(1,) tensor.

`as_jax_program` wraps the walk as one JAX-traceable function of the user's arguments with a
custom VJP whose backward is JAX's VJP of the user's function itself, so `jax.grad` sees the
program the user wrote and `jax.vmap` maps each step (fused regions run once per batch element).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from mugraph.ir.errors import InvalidInput
from mugraph.ir.jax_frontend import boundary_array


@dataclass(frozen=True)
class Plan:
    """What runs: the partition, and the fused outcome (or None) per region index."""

    partition: object              # search.partition.Partition
    fused: dict                    # region index -> search.regions.Outcome, fused ones only

    @property
    def program(self):
        return self.partition.program


def run_plan(plan: Plan, leaves, run_region: Callable) -> list:
    """The flat outputs of the program on flat argument `leaves`."""
    program = plan.program
    steps = program.steps
    producer = plan.partition.classification.producer
    env = dict(zip(program.inputs, leaves))
    env.update((vid, jnp.asarray(c)) for vid, c in program.consts.items())

    def read(x):
        if isinstance(x, Literal):
            return x.val
        if x not in env:       # a constant-only step nobody ran yet
            _run_step(steps[producer[x]], read, env)
        return env[x]

    for kind, x in plan.partition.items:
        if kind == "jax":
            _run_step(x, read, env)
        elif x in plan.fused:
            _run_region(plan.fused[x], read, env, run_region, program)
        else:
            for step in plan.partition.regions[x].steps:
                _run_step(step, read, env)
    return [read(o) for o in program.outputs]


def _run_step(step, read, env: dict) -> None:
    eqn = step.eqn
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*(read(x) for x in step.ins), **params)
    env.update(zip(step.outs, out if eqn.primitive.multiple_results else [out]))


def _run_region(outcome, read, env: dict, run_region: Callable, program) -> None:
    region = outcome.region
    ins = [_to_tensor(read(v), program.value(v)) for v in region.inputs]
    outs = run_region(outcome, ins)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for vid, out in zip(region.outputs, outs):
        v = program.value(vid)
        env[vid] = jnp.reshape(out, v.shape).astype(v.dtype) if _is_jax(out) else \
            np.asarray(out).reshape(v.shape).astype(v.dtype)
    for vid, number in region.free_outputs:
        v = program.value(vid)
        env[vid] = jnp.full(v.shape, number, v.dtype)


def _to_tensor(x, value):
    """A region input: 0-d values as shape (1,), booleans as float32 0/1 (`boundary_view`)."""
    x = boundary_array(x if _is_jax(x) else np.asarray(x), value.dtype)
    if value.shape:
        return x
    return jnp.reshape(x, (1,)) if _is_jax(x) else np.reshape(x, (1,))


def _is_jax(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer))


# ---- as one JAX function ---------------------------------------------------------------------------
def as_jax_program(plan: Plan, region_fns: dict, fn: Callable) -> Callable:
    """The plan as a function of `fn`'s own arguments (pytrees) returning `fn`'s results;
    `region_fns`: region index -> JAX function of the region's inputs (its kernel's as_jax)."""
    program = plan.program

    def forward(*leaves):
        return tuple(run_plan(plan, leaves, lambda o, ins: region_fns[o.region.index](*ins)))

    def flat_fn(*leaves):
        args = jax.tree_util.tree_unflatten(program.in_tree, leaves)
        return tuple(jax.tree_util.tree_leaves(fn(*args)))

    differentiable = jax.custom_vjp(forward)

    def fwd(*leaves):
        return forward(*leaves), leaves

    def bwd(leaves, cotangents):
        _, vjp = jax.vjp(flat_fn, *leaves)
        return vjp(tuple(cotangents))

    differentiable.defvjp(fwd, bwd)

    def call(*args):
        leaves = check_arguments(program, args)
        outs = differentiable(*leaves)
        return jax.tree_util.tree_unflatten(program.out_tree, list(outs))

    # one XLA program even when called eagerly (step by step, each primitive would compile alone)
    return jax.jit(call)


def host_program(plan: Plan, run_region: Callable) -> Callable:
    """The plan as one jitted function of flat leaves whose fused regions run on the host:
    `run_region(outcome, numpy inputs) -> numpy outputs` (the interpreter, the CPU harness)."""
    def region(outcome, ins):
        results = [jax.ShapeDtypeStruct(n.shape, n.dtype.numpy) for n in outcome.region.spec.outputs]

        def host(*arrays):
            outs = run_region(outcome, [np.asarray(a) for a in arrays])
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            return tuple(np.asarray(o).astype(r.dtype) for o, r in zip(outs, results))
        return jax.pure_callback(host, results, *ins, vmap_method="sequential")

    return jax.jit(lambda *leaves: tuple(run_plan(plan, leaves, region)))


def check_arguments(program, args) -> list:
    """`args` flattened, checked against the traced structure, shapes and dtypes."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    if tree != program.in_tree:
        raise InvalidInput(f"the arguments have the structure {tree}, the program was compiled "
                           f"for {program.in_tree}",
                           hint="call it with arguments shaped like the example arguments")
    for vid, leaf in zip(program.inputs, leaves):
        v = program.value(vid)
        if tuple(np.shape(leaf)) != v.shape or np.dtype(leaf.dtype) != v.dtype:
            raise InvalidInput(f"argument {v.name!r} is {np.dtype(leaf.dtype).name}"
                               f"{list(np.shape(leaf))}, the program expects {v.dtype.name}"
                               f"{list(v.shape)}", hint="mugraph.jit compiles per shape; "
                                                       "superoptimize again for other shapes")
    return leaves
