"""Every op of every level has an entry in every table, and a node of each op survives the printer,
the JSON writer/reader and the interpreter.

Later layers add their own columns (finite-field semantics, abstract expressions, CUDA snippets)
by appending `(name, table, required_ops)` to TABLES.
"""
from __future__ import annotations

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import BOp, KOp, TOp, semantics, shapes
from mugraph.ir.interpret import ACCUMULATE, BLOCK_EVAL, KERNEL_EVAL
from mugraph.codegen import library_ops, render
from mugraph.ir.ops import (ACCUMULATORS, BINARY, BLOCK_LEAF, BLOCK_REDUCE, COMMUTATIVE,
                            COMPARISONS, KERNEL_LAYOUT, KERNEL_LEAF, KERNEL_REDUCE,
                            LAST_DIM_ACCUMULATORS, PARAMETRIC, PREDICATES, RESCALE_ACCUMULATORS,
                            RUNNING_ACCUMULATORS, TERNARY, UNARY)
from mugraph.search import cost
from mugraph.verify import finite_field
from mugraph.verify.abstract import lower
from tests.ir.jnp_reference import JNP_EVAL
from tests.ir.samples import all_samples, ops_in

KERNEL_OPS = frozenset(KOp) | frozenset(TOp)
BLOCK_OPS = frozenset(BOp) | frozenset(TOp)

# The kernel interpreter binds INPUT nodes to the caller's arrays and runs a CUSTOM node's block
# graph itself (run_block_graph), so KERNEL_EVAL holds neither. The block interpreter slices INPUT
# tiles itself and runs accumulators from ACCUMULATE, so BLOCK_EVAL holds neither of those.
INTERPRETER_HANDLES_KERNEL = frozenset({KOp.INPUT, KOp.CUSTOM})
INTERPRETER_HANDLES_BLOCK = frozenset({BOp.INPUT}) | ACCUMULATORS

# (name, table, the ops it must have an entry for). Append columns of later layers here.
TABLES = [
    ("shapes.KERNEL_SHAPE", shapes.KERNEL_SHAPE, KERNEL_OPS),
    ("shapes.BLOCK_SHAPE", shapes.BLOCK_SHAPE, BLOCK_OPS),
    ("shapes.ELEMENTWISE_SHAPE", shapes.ELEMENTWISE_SHAPE, frozenset(TOp)),
    ("interpret.KERNEL_EVAL", KERNEL_EVAL, KERNEL_OPS - INTERPRETER_HANDLES_KERNEL),
    ("interpret.BLOCK_EVAL", BLOCK_EVAL, BLOCK_OPS - INTERPRETER_HANDLES_BLOCK),
    ("interpret.ACCUMULATE", ACCUMULATE, ACCUMULATORS),
    ("semantics.NUMPY_ELEMENTWISE", semantics.NUMPY_ELEMENTWISE, frozenset(TOp)),
    ("tests jnp reference", JNP_EVAL, KERNEL_OPS - INTERPRETER_HANDLES_KERNEL),
    ("finite_field.FF_ELEMENTWISE", finite_field.FF_ELEMENTWISE, frozenset(TOp)),
    ("finite_field.KERNEL_DEGREE", finite_field.KERNEL_DEGREE,
     KERNEL_OPS - INTERPRETER_HANDLES_KERNEL),
    ("finite_field.BLOCK_DEGREE", finite_field.BLOCK_DEGREE,
     BLOCK_OPS - INTERPRETER_HANDLES_BLOCK),
    ("abstract.TOP_LOWER", lower.TOP_LOWER, frozenset(TOp)),
    ("abstract.KERNEL_LOWER", lower.KERNEL_LOWER, frozenset(KOp)),
    ("abstract.BLOCK_LOWER", lower.BLOCK_LOWER, frozenset(BOp)),
    ("codegen.ELEMENTWISE_C", render.ELEMENTWISE_C, frozenset(TOp)),
    ("codegen.LIBRARY_OPS", library_ops.LIBRARY_OPS, KERNEL_OPS - library_ops.NOT_LIBRARY),
    ("cost.ELEMENTWISE_FLOPS", cost.ELEMENTWISE_FLOPS, frozenset(TOp)),
]

# Ops no table may hold: the level's universe (a kernel table keyed by a BOp is a typo).
UNIVERSE = {"shapes.KERNEL_SHAPE": KERNEL_OPS, "shapes.BLOCK_SHAPE": BLOCK_OPS,
            "interpret.KERNEL_EVAL": KERNEL_OPS - INTERPRETER_HANDLES_KERNEL,
            "interpret.BLOCK_EVAL": BLOCK_OPS - INTERPRETER_HANDLES_BLOCK}


def _names(ops) -> list[str]:
    return sorted(f"{type(op).__name__}.{op.name}" for op in ops)


@pytest.mark.parametrize("name,table,required", TABLES, ids=[t[0] for t in TABLES])
def test_table_has_every_op(name, table, required):
    missing = set(required) - set(table)
    assert not missing, f"{name} has no entry for {_names(missing)}"
    assert all(callable(v) or isinstance(v, (tuple, str, int)) for v in table.values())


@pytest.mark.parametrize("name", sorted(UNIVERSE))
def test_table_holds_only_its_levels_ops(name):
    table = dict((n, t) for n, t, _ in TABLES)[name]
    stray = set(table) - UNIVERSE[name]
    assert not stray, f"{name} has entries for ops that are not its level's: {_names(stray)}"


def test_accumulate_entries_are_init_update_final():
    for op, (init, update, final) in ACCUMULATE.items():
        assert callable(init) and callable(update) and (final is None or callable(final)), op


def test_op_groups_partition_and_nest():
    assert UNARY | BINARY | TERNARY == frozenset(TOp)
    assert not UNARY & BINARY and not (UNARY | BINARY) & TERNARY
    assert COMMUTATIVE <= BINARY and PARAMETRIC <= UNARY
    assert COMPARISONS <= BINARY and PREDICATES - COMPARISONS <= UNARY
    assert KERNEL_REDUCE | KERNEL_LAYOUT | KERNEL_LEAF <= frozenset(KOp)
    assert BLOCK_REDUCE | BLOCK_LEAF | ACCUMULATORS <= frozenset(BOp)
    assert RUNNING_ACCUMULATORS | RESCALE_ACCUMULATORS | LAST_DIM_ACCUMULATORS <= ACCUMULATORS
    assert not RUNNING_ACCUMULATORS & RESCALE_ACCUMULATORS


def test_op_names_are_unique_per_level():
    # the JSON reader looks ops up by name, structural enum first: a TOp named like a KOp or BOp
    # would be unreachable
    assert not {o.value for o in TOp} & {o.value for o in KOp}
    assert not {o.value for o in TOp} & {o.value for o in BOp}
    for op in KERNEL_OPS:
        assert ir.ops.op_by_name(op.value, "kernel") is op
    for op in BLOCK_OPS:
        assert ir.ops.op_by_name(op.value, "block") is op


SAMPLES = all_samples()
SAMPLE_IDS = [f"{level}-{op.value}" for op, level, _ in SAMPLES]


def test_samples_cover_every_op():
    kernel = {op for op, level, _ in SAMPLES if level == "kernel"}
    block = {op for op, level, _ in SAMPLES if level == "block"}
    assert kernel == KERNEL_OPS and block == BLOCK_OPS


@pytest.mark.parametrize("op,level,graph", SAMPLES, ids=SAMPLE_IDS)
def test_node_of_each_op_round_trips_prints_and_runs(op, level, graph):
    assert op in ops_in(graph)
    text = ir.to_json(graph)
    assert f'"op": "{op.value}"' in text, "the JSON writer names every op"
    assert ir.from_json(text) is graph, "the JSON reader rebuilds the interned graph"
    assert f"{op.value}" in str(graph), "the printer shows every op"
    arrays = [np.linspace(-1.0, 1.0, int(np.prod(n.shape))).reshape(n.shape) for n in graph.inputs]
    for dtype in ("float64", "own"):
        outs = ir.interpret(graph, arrays, dtype=dtype)
        assert all(np.isfinite(np.asarray(o, np.float64)).all() for o in outs), (op, dtype)
