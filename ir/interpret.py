"""The reference interpreter: the executable definition of the IR.

Kernel graphs run node by node. A custom op's block graph runs literally: for every block of the
grid, for every loop iteration, each input tile is sliced by imap/fmap, the body runs on tiles,
accumulators combine, the epilogue runs, and each output tile is written where its omap says.
Every op's meaning comes from a semantics object (NumPy float64 by default), so verification
can run the same schedule over a finite field.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from mugraph.ir.block import BlockGraph, Phase
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph, InvalidInput
from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import BNode, KNode
from mugraph.ir import memory
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.ir.semantics import FLOAT64, OWN_DTYPE
from mugraph.ir.shapes import mma_dtype
from mugraph.ir.thread import evaluate

F32 = DType.FLOAT32


def interpret(graph, arrays, *, dtype=None, semantics=None) -> list[np.ndarray]:
    """Run `graph` (a KernelGraph or BlockGraph) on `arrays` and return its outputs.

    `arrays`: a sequence in input order, or a mapping by input name (kernel graphs).
    `dtype`: "float64" (default: exact reference) or "own" (each tensor's dtype, fp32 math).
    `semantics`: any object with the NumpySemantics interface; overrides `dtype`.
    """
    sem = semantics or _semantics_for(dtype)
    if isinstance(graph, BlockGraph):
        shapes = [(n.arg.shape, n.arg.dtype) for n in graph.inputs]
        values = [sem.input(a, d) for a, (s, d) in zip(_check_arrays(arrays, shapes), shapes)]
        return run_block_graph(sem, graph, values)
    if not isinstance(graph, KernelGraph):
        raise InvalidInput(f"interpret takes a KernelGraph or BlockGraph, got {type(graph).__name__}")
    memory.require(memory.evaluation_bytes([graph], FLOAT64_BYTES),
                   f"evaluating {memory.describe(graph)} with the reference interpreter",
                   "evaluate it at smaller shapes (the same program on smaller example arguments)")
    return _run_kernel_graph(sem, graph, arrays)


FLOAT64_BYTES = 8   # the reference's values (the finite-field test's are 16: its own check)


def _semantics_for(dtype):
    if dtype is None or dtype in ("float64", np.float64):
        return FLOAT64
    if dtype == "own":
        return OWN_DTYPE
    raise InvalidInput(f"interpret dtype={dtype!r} is not supported",
                       hint='use "float64" (exact reference) or "own" (each tensor\'s dtype)')


def _check_arrays(arrays, shapes) -> list:
    if isinstance(arrays, Mapping) or not isinstance(arrays, Sequence):
        raise InvalidInput(f"pass a block graph's inputs as a list, got {type(arrays).__name__}",
                           hint="block graph inputs have no names; list them in input order")
    arrays = list(arrays)
    if len(arrays) != len(shapes):
        raise InvalidInput(f"the block graph takes {len(shapes)} input arrays, got {len(arrays)}")
    for i, (a, (shape, _)) in enumerate(zip(arrays, shapes)):
        if tuple(np.shape(a)) != tuple(shape):
            raise InvalidInput(f"block graph input {i} has shape {tuple(np.shape(a))}, the graph "
                               f"expects {tuple(shape)}")
    return arrays


def bind_inputs(graph: KernelGraph, arrays) -> list:
    """Order `arrays` (sequence or mapping by name) as `graph.inputs`, checking shapes."""
    names = graph.input_names
    if isinstance(arrays, Mapping):
        missing = [n for n in names if n not in arrays]
        extra = [n for n in arrays if n not in names]
        if missing or extra:
            raise InvalidInput(f"inputs by name: missing {missing}, unexpected {extra}",
                               hint=f"the graph's inputs are {list(names)}")
        arrays = [arrays[n] for n in names]
    elif not isinstance(arrays, Sequence):
        raise InvalidInput(f"pass the inputs as a list or a dict, got {type(arrays).__name__}",
                           hint="wrap a single array in a list: [x]")
    arrays = list(arrays)
    if len(arrays) != len(names):
        raise InvalidInput(f"the graph takes {len(names)} inputs {list(names)}, got {len(arrays)} arrays")
    for i, (name, node, a) in enumerate(zip(names, graph.inputs, arrays)):
        if np.shape(a) == () and node.shape == (1,):   # a 0-d scalar input is held as [1]
            arrays[i] = a = np.reshape(a, (1,))
        if tuple(np.shape(a)) != node.shape:
            raise InvalidInput(f"input {name!r} has shape {tuple(np.shape(a))}, the graph expects "
                               f"{node.shape}", hint="pass arrays of the traced shapes")
    return arrays


def _run_kernel_graph(sem, graph: KernelGraph, arrays) -> list[np.ndarray]:
    values: dict[KNode, np.ndarray] = {
        n: sem.input(a, n.dtype) for n, a in zip(graph.inputs, bind_inputs(graph, arrays))}
    custom_results: dict[tuple, list] = {}
    for node in graph.nodes:
        if node in values:
            continue
        srcs = [values[s] for s in node.srcs]
        if node.op is KOp.CUSTOM:
            key = (node.arg[0], node.srcs)
            if key not in custom_results:
                custom_results[key] = run_block_graph(sem, node.arg[0], srcs)
            values[node] = custom_results[key][node.arg[1]]
        else:
            values[node] = KERNEL_EVAL[node.op](sem, node, srcs)
    return [values[o] for o in graph.outputs]


# ---- kernel ops ----------------------------------------------------------------------------------
def window(arg) -> tuple:
    """A SLICE's (starts, limits) as NumPy index slices."""
    return tuple(slice(a, b) for a, b in zip(*arg))


def _rms_norm(sem, node, x, dtype, lead: int = 0):
    """x * rsqrt(mean(x^2, dim) + eps), computed in fp32 (or float64) and rounded once."""
    dim, eps = node.arg
    dim += lead
    sq = sem.elementwise(TOp.MUL, [x, x], None, F32)
    mean = sem.elementwise(TOp.DIV, [sem.reduce_sum(sq, dim, F32),
                                     sem.constant(float(x.shape[dim]), (1,), F32)], None, F32)
    r = sem.elementwise(TOp.RSQRT, [sem.elementwise(TOp.ADD, [mean, sem.constant(eps, (1,), F32)],
                                                    None, F32)], None, F32)
    return sem.elementwise(TOp.MUL, [x, r], None, dtype)


def _iota(sem, node):
    """Index k along `dim` is the constant k: any semantics with `constant` computes an iota."""
    shape, dim, dtype = node.arg
    unit = tuple(1 for _ in shape)
    values = [sem.constant(float(k), unit, dtype) for k in range(shape[dim])]
    return np.ascontiguousarray(np.broadcast_to(np.concatenate(values, axis=dim), shape))


def _elementwise(sem, node, srcs):
    return sem.elementwise(node.op, srcs, node.arg, node.dtype)


KERNEL_EVAL = {
    KOp.CONSTANT: lambda sem, n, s: sem.constant(n.arg[0], n.arg[1], n.arg[2]),
    KOp.IOTA: lambda sem, n, s: _iota(sem, n),
    KOp.TABLE: lambda sem, n, s: sem.table(n.arg),
    KOp.MATMUL: lambda sem, n, s: sem.matmul(s[0], s[1], n.dtype),
    KOp.REDUCE_SUM: lambda sem, n, s: sem.reduce_sum(s[0], n.arg, n.dtype),
    KOp.REDUCE_MAX: lambda sem, n, s: sem.reduce_max(s[0], n.arg, n.dtype),
    KOp.RMS_NORM: lambda sem, n, s: _rms_norm(sem, n, s[0], n.dtype),
    KOp.CONCAT: lambda sem, n, s: sem.cast(np.concatenate(s, axis=n.arg), n.dtype),
    KOp.TRANSPOSE: lambda sem, n, s: np.ascontiguousarray(np.transpose(s[0], n.arg)),
    KOp.RESHAPE: lambda sem, n, s: np.reshape(s[0], n.arg),
    KOp.BROADCAST: lambda sem, n, s: np.ascontiguousarray(np.broadcast_to(s[0], n.arg)),
    KOp.SLICE: lambda sem, n, s: np.ascontiguousarray(s[0][window(n.arg)]),
} | {op: _elementwise for op in TOp}


# ---- block graphs --------------------------------------------------------------------------------
def _block_matmul(sem, n, s):
    """A tile matmul; an operand of lower rank (a 2-D weight tile next to a 4-D head tile) gets
    its missing batch dims after the grid axes, as in `_block_elementwise`."""
    a, b = (_align(v, src.rank, n.rank) for v, src in zip(s, n.srcs))
    return sem.matmul(a, b, F32, mma_dtype(n.srcs[0].dtype, n.srcs[1].dtype))


def _block_elementwise(sem, node, srcs):
    """Tile values carry the grid as LEAD leading axes, so an operand of lower rank (a 1-D bias
    tile next to a 2-D tile) gets its missing unit dims after them, not before. (Constants
    carry no grid axes and broadcast from the right as they are.)"""
    return sem.elementwise(node.op, [_align(v, s.rank, node.rank) for v, s in zip(srcs, node.srcs)],
                           node.arg, node.dtype)


def _align(value, rank: int, to: int):
    if rank == to or np.ndim(value) != LEAD + rank:
        return value
    shape = np.shape(value)
    return np.reshape(value, shape[:LEAD] + (1,) * (to - rank) + shape[LEAD:])


BLOCK_EVAL = {
    BOp.CONSTANT: lambda sem, n, s: sem.constant(n.arg[0], n.arg[1], n.arg[2]),
    BOp.MATMUL: _block_matmul,
    BOp.REDUCE_SUM: lambda sem, n, s: sem.reduce_sum(s[0], n.arg + LEAD, F32),
    BOp.REDUCE_MAX: lambda sem, n, s: sem.reduce_max(s[0], n.arg + LEAD, F32),
    BOp.RMS_NORM: lambda sem, n, s: _rms_norm(sem, n, s[0], F32, lead=LEAD),
    BOp.THREAD: lambda sem, n, s: evaluate(n, s, lambda m, v: BLOCK_EVAL[m.op](sem, m, v)),
} | {op: _block_elementwise for op in TOp}


def _add(sem, a, b):
    return sem.elementwise(TOp.ADD, [a, b], None, F32)


def _last_sum(sem, x):
    return sem.reduce_sum(x, len(x.shape) - 1, F32)


def _rescaled(sem, acc, m_prev, m_cur):
    """acc * exp(m_prev - m_cur): moves a sum from the old running max to the new one."""
    factor = sem.elementwise(TOp.EXP, [sem.elementwise(TOp.SUB, [m_prev, m_cur], None, F32)],
                             None, F32)
    return sem.elementwise(TOp.MUL, [acc, factor], None, F32)


def _rms_final(sem, node, acc, forloop):
    count = float(forloop * node.srcs[0].shape[-1])
    mean = sem.elementwise(TOp.DIV, [acc, sem.constant(count, (1,), F32)], None, F32)
    return sem.elementwise(TOp.SQRT, [mean], None, F32)


# Each accumulator: (initial state, update(sem, node, state, x, m_prev, m_cur), final value).
ACCUMULATE = {
    BOp.ACC_SUM: (lambda sem, n: sem.zeros(n.shape),
                  lambda sem, n, acc, x, mp, mc: _add(sem, acc, x), None),
    BOp.ACC_SUM_LAST: (lambda sem, n: sem.zeros(n.shape),
                       lambda sem, n, acc, x, mp, mc: _add(sem, acc, _last_sum(sem, x)), None),
    BOp.ACC_RMS_LAST: (lambda sem, n: sem.zeros(n.shape),
                       lambda sem, n, acc, x, mp, mc: _add(
                           sem, acc, _last_sum(sem, sem.elementwise(TOp.MUL, [x, x], None, F32))),
                       _rms_final),
    BOp.ACC_MAX: (lambda sem, n: sem.max_identity(n.shape),
                  lambda sem, n, acc, x, mp, mc: sem.elementwise(TOp.MAX, [acc, x], None, F32),
                  None),
    BOp.ACC_MAX_LAST: (lambda sem, n: sem.max_identity(n.shape),
                       lambda sem, n, acc, x, mp, mc: sem.elementwise(
                           TOp.MAX, [acc, sem.reduce_max(x, len(x.shape) - 1, F32)], None, F32),
                       None),
    BOp.ACC_SUM_RESCALE: (lambda sem, n: sem.zeros(n.shape),
                          lambda sem, n, acc, x, mp, mc: _add(sem, _rescaled(sem, acc, mp, mc), x),
                          None),
    BOp.ACC_SUM_LAST_RESCALE: (lambda sem, n: sem.zeros(n.shape),
                               lambda sem, n, acc, x, mp, mc: _add(
                                   sem, _rescaled(sem, acc, mp, mc), _last_sum(sem, x)), None),
}


class _Plan:
    """A block graph's nodes sorted into the phases the interpreter runs them in."""

    def __init__(self, graph: BlockGraph):
        phase = graph.phases()
        order = graph.nodes
        self.invariant = [n for n in order if phase[n] is Phase.INVARIANT]
        self.loop = [n for n in order if phase[n] in (Phase.LOOP, Phase.ACCUMULATOR)]
        self.accumulators = [n for n in order if phase[n] is Phase.ACCUMULATOR]
        self.epilogue = [n for n in order if phase[n] is Phase.EPILOGUE]
        self.running = [n for n in self.accumulators if n.op in (BOp.ACC_MAX, BOp.ACC_MAX_LAST)]


LEAD = 3  # block values carry the grid as three leading axes (x, y, z), size 1 where they do not vary


def run_block_graph(sem, graph: BlockGraph, inputs: list) -> list[np.ndarray]:
    """Run every block of `graph` over full kernel tensors `inputs`; return the output tensors.

    All blocks run together: a tile value has shape (gx, gy, gz, *tile), with extent 1 on a grid
    axis the value does not vary along, and each op applies blockwise (tile dims are offset by
    `LEAD`). Iterations run one after another, as in the loop nest the printer shows.
    """
    plan = _Plan(graph)
    values: dict[BNode, np.ndarray] = {}
    for node in plan.invariant:
        values[node] = _eval_block_node(sem, node, values, inputs, None)
    state = {n: ACCUMULATE[n.op][0](sem, n) for n in plan.accumulators}
    for it in range(graph.forloop):
        previous = {m: state[m] for m in plan.running}
        for node in plan.loop:
            if node in state:
                update = ACCUMULATE[node.op][1]
                m = node.srcs[1] if len(node.srcs) > 1 else None
                state[node] = update(sem, node, state[node], values[node.srcs[0]],
                                     previous.get(m), state.get(m))
                values[node] = state[node]
            else:
                values[node] = _eval_block_node(sem, node, values, inputs, it)
    for node in plan.accumulators:
        final = ACCUMULATE[node.op][2]
        values[node] = final(sem, node, state[node], graph.forloop) if final else state[node]
    for node in plan.epilogue:
        values[node] = _eval_block_node(sem, node, values, inputs, None)
    return [_assemble(sem.cast(values[o.node], o.dtype), o, graph.grid) for o in graph.outputs]


def _block_tiles(array, spec, iteration: int):
    """Every block's tile of one input at one iteration: shape (gx|1, gy|1, gz|1, *tile).

    A dim split by grid axis g becomes (grid[g], dim / grid[g]); the loop then takes its
    iteration's slice of the per-block part; the grid parts move to the front.
    """
    split_shape, grid_pos, dim_pos = [], {}, []
    for d, n in enumerate(spec.shape):
        axes = [g for g in range(3) if spec.imap[g] == d]
        if axes:
            grid_pos[axes[0]] = len(split_shape)
            split_shape += [spec.grid[axes[0]], n // spec.grid[axes[0]]]
        else:
            split_shape.append(n)
        dim_pos.append(len(split_shape) - 1)
    a = np.reshape(array, split_shape)
    if spec.fmap is not None:
        t = spec.tile_shape[spec.fmap]
        index = [slice(None)] * a.ndim
        index[dim_pos[spec.fmap]] = slice(iteration * t, (iteration + 1) * t)
        a = a[tuple(index)]
    lead = [grid_pos[g] for g in range(3) if g in grid_pos]
    a = np.transpose(a, lead + dim_pos)
    shape = [spec.grid[g] if g in grid_pos else 1 for g in range(3)] + list(spec.tile_shape)
    return np.reshape(a, shape)


def _assemble(value, out, grid) -> np.ndarray:
    """The output tensor from every block's tile, each written where its omap says.

    Grid axes not in the omap have extent 1 (the checker guarantees it), so they vanish.
    """
    tile = out.node.shape
    value = np.broadcast_to(value, tuple(grid) + tuple(tile))
    order = [g for g in range(3) if out.omap[g] is None]
    for d in range(len(tile)):
        order += [g for g in range(3) if out.omap[g] == d] + [LEAD + d]
    return np.ascontiguousarray(np.reshape(np.transpose(value, order), out.shape))


def _eval_block_node(sem, node, values, inputs, iteration):
    if node.op is BOp.INPUT:
        return _block_tiles(inputs[node.arg.index], node.arg, iteration or 0)
    rule = BLOCK_EVAL.get(node.op)
    if rule is None:
        raise InvalidGraph(f"no interpreter rule for block op {node.op.value}")
    return rule(sem, node, [values[s] for s in node.srcs])
