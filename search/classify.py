"""Which steps of a flat program mugraph lifts, which stay JAX, and why.

One walk lifts the program equation by equation with the front end's `lift_eqn`:
* CONST steps read only constants (literals, closed-over arrays, results of other CONST steps):
  masks, iotas, RoPE tables. Their lifted values (a uniform constant, an index expression) are
  rebuilt inside every region that reads them; what the front end cannot hold (a non-uniform
  array, `cos` of an index) is computed by JAX and fed into the regions that read it.
* LIFT steps lift; JAX steps do not: the front end's refusal is the reason, or an operand only
  JAX can hold (an integer or boolean computed by JAX: positions, top_k indices, segment ids).
  A JAX step's float results enter the regions that read them as fresh inputs.
A lifted value read by a JAX step (or returned) must leave its region as a tensor; a mask, an
index or a value of rank > 4 cannot, so the step that made it is re-classified JAX and the walk
runs again, until nothing changes (each round adds a step, so it ends).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from jax.extend.core import Literal

from mugraph.ir.errors import MugraphError, UnsupportedOp
from mugraph.ir.jax_frontend import (Opaque, View, boundary_view, closed_value, exported_node,
                                     lift_eqn, literal_value)
from mugraph.search.flatten import FlatProgram, Step

PROGRAM_OUTPUT = -1            # the consumer id of a value the function returns


class Kind(Enum):
    LIFT = "lift"
    JAX = "jax"
    CONST = "const"


@dataclass(frozen=True)
class Classification:
    """The walk's answer: a kind per step, why each JAX step stays JAX, the lifted value of each
    value id (None: only JAX holds it), and the IR nodes each LIFT step built."""

    program: FlatProgram
    kinds: tuple
    reasons: dict
    lifted: dict
    built: dict                    # LIFT step index -> tuple of the KNodes it added
    producer: dict                 # value id -> index of the step that computes it
    consumers: dict                # value id -> step indices reading it (PROGRAM_OUTPUT: returned)
    forced: dict = field(default_factory=dict)   # step index -> why it was made JAX

    def kind(self, index: int) -> Kind:
        return self.kinds[index]

    def steps_of(self, kind: Kind) -> list[Step]:
        return [s for s in self.program.steps if self.kinds[s.index] is kind]

    def is_const(self, vid) -> bool:
        producer = self.producer.get(vid)
        return vid in self.program.consts or (
            producer is not None and self.kinds[producer] is Kind.CONST)

    def exportable(self, vid) -> str | None:
        """None when the lifted value `vid` can leave a region as a tensor, else why not."""
        return why_not_exported(self.program, self.lifted.get(vid), vid)


def why_not_exported(program: FlatProgram, value, vid) -> str | None:
    v = program.value(vid)
    if isinstance(value, View) and value.from_mask:
        # x * mask.astype(f) lifts as where(mask, x, 0), as XLA computes it: the mask must stay
        # with the product
        return "a boolean mask converted to a float must stay with its use"
    try:
        exported_node(value, v.shape, v.dtype)
    except UnsupportedOp as e:
        return e.message.splitlines()[0]
    except MugraphError as e:
        return e.message
    except RecursionError:
        return "the front end recursed too deep laying it out"
    return None


def classify(program: FlatProgram, forced: dict | None = None) -> Classification:
    """Classify every step (see the module docstring), with the steps in `forced` (index -> why)
    kept JAX; walks until every lifted value that JAX or the caller reads can leave its region."""
    with deep_recursion():
        return _classify(program, forced)


@contextmanager
def deep_recursion(limit: int = 5000):
    """The front end walks node chains recursively; a stack of many layers makes long chains."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _classify(program: FlatProgram, forced: dict | None) -> Classification:
    producer = {o: s.index for s in program.steps for o in s.outs}
    consumers = _consumers(program)
    forced = dict(forced or {})
    while True:
        kinds, reasons, lifted, built = _walk(program, forced)
        stuck = _stuck_values(program, kinds, lifted, producer, consumers)
        more = {producer[vid]: why for vid, why in stuck.items() if producer[vid] not in forced}
        if not more:
            return Classification(program, tuple(kinds), reasons, lifted, built, producer,
                                  consumers, forced)
        forced.update(more)   # each round adds a step: the loop ends


def _consumers(program: FlatProgram) -> dict:
    users: dict = {}
    for step in program.steps:
        for vid in step.value_ins():
            users.setdefault(vid, []).append(step.index)
    for o in program.outputs:
        if not isinstance(o, Literal):
            users.setdefault(o, []).append(PROGRAM_OUTPUT)
    return users


def _stuck_values(program, kinds, lifted, producer, consumers) -> dict:
    """Lifted values (made by LIFT steps) that JAX reads or the function returns but that cannot
    leave a region: value id -> why."""
    stuck = {}
    for vid, users in consumers.items():
        made_by = producer.get(vid)
        if made_by is None or kinds[made_by] is not Kind.LIFT:
            continue
        if not any(u == PROGRAM_OUTPUT or kinds[u] is Kind.JAX for u in users):
            continue
        why = why_not_exported(program, lifted[vid], vid)
        if why is not None:
            stuck[vid] = f"{program.value(vid).describe()} is needed outside mugraph's kernels " \
                         f"and cannot leave one ({why})"
    return stuck


def _walk(program: FlatProgram, forced: dict):
    env = {vid: boundary_view(f"v{vid}", program.value(vid).shape, program.value(vid).dtype)
           for vid in program.inputs}
    env.update((vid, closed_value(c)) for vid, c in program.consts.items())
    const_ids = set(program.consts)
    kinds, reasons, built = [], {}, {}
    for step in program.steps:
        args = [literal_value(x) if isinstance(x, Literal) else env[x] for x in step.ins]
        if all(isinstance(x, Literal) or x in const_ids for x in step.ins):
            kind, outs = Kind.CONST, _lift_const(step, args)
            const_ids.update(step.outs)
        elif step.index in forced:
            kind, outs, reasons[step.index] = Kind.JAX, None, forced[step.index]
        else:
            kind, outs, why = _lift(program, step, args)
            if why is not None:
                reasons[step.index] = why
        if kind is Kind.JAX:
            outs = [boundary_view(f"v{o}", program.value(o).shape, program.value(o).dtype)
                    for o in step.outs]
        elif kind is Kind.LIFT:
            built[step.index] = _new_nodes(outs, [a for x, a in zip(step.ins, args)
                                                  if not isinstance(x, Literal)
                                                  and x not in const_ids])
        kinds.append(kind)
        env.update(zip(step.outs, outs))
    return kinds, reasons, env, built


def _lift_const(step: Step, args) -> list:
    """A constant-only step's lifted values; Opaque where the front end cannot hold them."""
    try:
        return lift_eqn(step.eqn, args)
    except Exception:  # noqa: BLE001 - any refusal means JAX computes the constant
        return [Opaque(program_shape(o), np.dtype(o.aval.dtype)) for o in step.eqn.outvars]


def program_shape(var) -> tuple:
    return tuple(int(d) for d in var.aval.shape)


def _lift(program: FlatProgram, step: Step, args):
    """(kind, lifted outputs, reason) of one step that reads a non-constant value."""
    fed = []
    for x, a in zip(step.ins, args):
        if isinstance(a, Opaque):   # a constant JAX computes, fed into the region as an input
            a = boundary_view(f"v{x}", program.value(x).shape, program.value(x).dtype)
        if a is None:
            v = program.value(x)
            return Kind.JAX, None, (f"it reads {v.name}, a {v.dtype.name}{list(v.shape)} value "
                                    "only JAX computes here")
        fed.append(a)
    try:
        return Kind.LIFT, lift_eqn(step.eqn, fed), None
    except UnsupportedOp as e:
        return Kind.JAX, None, _reason(e)
    except MugraphError as e:
        return Kind.JAX, None, f"lifting `{step.primitive}` failed: {e.message.splitlines()[0]}"
    except RecursionError:
        return Kind.JAX, None, f"lifting `{step.primitive}` recursed too deep (a very long " \
                               "chain of elementwise ops)"


def _reason(e: UnsupportedOp) -> str:
    first = e.message.splitlines()[0]
    return f"{first} (at {e.source})" if e.source else first


def _new_nodes(outs, args) -> tuple:
    """The nodes a step built: those under its outputs, down to the nodes of its operands `args`
    (constants a region rebuilds count with the step that reads them). Local to the step: two
    identical layers count alike, though interned nodes are shared between them."""
    stop = {a.node for a in args if isinstance(a, View)}
    fresh, seen, stack = [], set(), [o.node for o in outs if isinstance(o, View)]
    while stack:
        node = stack.pop()
        if node in seen or node in stop:
            continue
        seen.add(node)
        fresh.append(node)
        stack.extend(node.srcs)
    return tuple(fresh)
