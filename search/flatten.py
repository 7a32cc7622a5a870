"""A JAX function traced once into a flat program: every equation of its jaxpr, nested calls
(jit, custom_jvp / custom_vjp, remat, closed_call) inlined, over numbered values.

This is what the partitioner cuts: one `Step` per primitive equation, reading and writing `Value`s
(the function's flattened pytree leaves, closed-over constants, and equation results). Inlining
keeps a nested jit's body cuttable like the rest (the front end lifts a call whole or not at all).
Only the primal meaning of custom_jvp / custom_vjp bodies is kept: the programs built from a flat
program are differentiated through the user's own function (see `mugraph.program`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
from jax.extend.core import Literal

from mugraph.ir.errors import InvalidInput
from mugraph.ir.jax_frontend import CALLS, _call_body, _default_names, _trace


@dataclass(frozen=True)
class Value:
    """One value of the flat program: its jaxpr shape and dtype, and a name for reports."""

    id: int
    shape: tuple
    dtype: np.dtype
    name: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{self.name}:{self.dtype.name}{list(self.shape)}"


@dataclass(frozen=True)
class Step:
    """One primitive equation: `ins` are value ids or jaxpr Literals, `outs` value ids."""

    index: int
    eqn: object
    ins: tuple
    outs: tuple

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    def value_ins(self) -> tuple:
        """The value ids it reads (literals left out), each once."""
        return tuple(dict.fromkeys(i for i in self.ins if not isinstance(i, Literal)))


@dataclass(frozen=True)
class FlatProgram:
    """`fn` at its example arguments as flat steps over numbered values."""

    fn: Callable
    values: tuple                 # Value, by id
    steps: tuple                  # Step, in program order (topological)
    inputs: tuple                 # value ids of the flattened argument leaves, in order
    outputs: tuple                # value ids (or Literals) of the flattened results, in order
    consts: dict                  # value id -> closed-over array
    in_tree: object
    out_tree: object

    def value(self, vid) -> Value:
        return self.values[vid]

    @property
    def out_dtypes(self) -> tuple:
        return tuple(np.dtype(o.aval.dtype) if isinstance(o, Literal) else self.values[o].dtype
                     for o in self.outputs)


def flatten_program(fn: Callable, example_args) -> FlatProgram:
    """Trace `fn(*example_args)` once (pytrees of arrays or ShapeDtypeStructs) and flatten it."""
    if not callable(fn):
        raise InvalidInput(f"a program of regions needs a function, got {type(fn).__name__}")
    example_args = tuple(example_args)
    leaves_with_paths, in_tree = jax.tree_util.tree_flatten_with_path(example_args)
    for i, (_, leaf) in enumerate(leaves_with_paths):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise InvalidInput(f"example argument leaf {i} is a {type(leaf).__name__}, not an "
                               "array", hint="pass arrays or jax.ShapeDtypeStruct; bind other "
                                             "arguments with functools.partial")
    closed, out_shape = _trace(fn, example_args)
    names = _default_names(fn, example_args, [p for p, _ in leaves_with_paths])
    builder = _Builder()
    inputs = tuple(builder.new(v.aval, name) for v, name in zip(closed.jaxpr.invars, names))
    env = dict(zip(closed.jaxpr.invars, inputs))
    env.update((var, builder.constant(var.aval, c))
               for var, c in zip(closed.jaxpr.constvars, closed.consts))
    outputs = builder.inline(closed.jaxpr, env)
    steps = _live(builder.steps, outputs)
    _, out_tree = jax.tree_util.tree_flatten(out_shape)
    return FlatProgram(fn, tuple(builder.values), steps, inputs, tuple(outputs), builder.consts,
                       in_tree, out_tree)


class _Builder:
    """Numbers values and appends steps while walking nested jaxprs."""

    def __init__(self):
        self.values: list[Value] = []
        self.steps: list[Step] = []
        self.consts: dict = {}

    def new(self, aval, name: str) -> int:
        vid = len(self.values)
        clean = re.sub(r"\W", "_", name)
        self.values.append(Value(vid, tuple(int(d) for d in aval.shape), np.dtype(aval.dtype),
                                 clean))
        return vid

    def constant(self, aval, array) -> int:
        vid = self.new(aval, f"const{len(self.consts)}")
        self.consts[vid] = array
        return vid

    def inline(self, jaxpr, env: dict) -> list:
        """Append `jaxpr`'s equations (calls inlined) with its invars bound by `env`; return the
        ids (or Literals) of its outvars."""
        def read(var):
            return var if isinstance(var, Literal) else env[var]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if eqn.primitive.name in CALLS:
                outs = self._inline_call(eqn, ins)
            else:
                outs = [self.new(v.aval, f"{eqn.primitive.name}{len(self.values)}")
                        for v in eqn.outvars]
                self.steps.append(Step(len(self.steps), eqn, tuple(ins), tuple(outs)))
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def _inline_call(self, eqn, ins) -> list:
        body, consts = _call_body(eqn)
        inner = dict(zip(body.invars, ins))
        inner.update((var, self.constant(var.aval, c)) for var, c in zip(body.constvars, consts))
        return self.inline(body, inner)


def _live(steps: list, outputs) -> tuple:
    """The steps the outputs depend on, renumbered in program order."""
    live = {o for o in outputs if not isinstance(o, Literal)}
    kept = []
    for step in reversed(steps):
        if any(o in live for o in step.outs):
            kept.append(step)
            live.update(step.value_ins())
    return tuple(Step(i, s.eqn, s.ins, s.outs) for i, s in enumerate(reversed(kept)))
