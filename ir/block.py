"""Block graphs: what one thread block computes, with its schedule (grid, loop, imap/fmap/omap).

A block graph is a frozen, interned record. Its schedule is explicit data next to the ops: the
grid, the for-loop trip count, per input an `imap` (grid axis -> split tensor dim) and an `fmap`
(the dim the loop walks), per output an `omap` (grid axis -> output dim). Construction runs the
well-formedness check, so every BlockGraph that exists is valid.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph, ShapeError
from mugraph.ir.node import BNode, KNode, _Interned, toposort
from mugraph.ir.ops import (ACCUMULATORS, BOp, KOp, RESCALE_ACCUMULATORS,
                            RUNNING_ACCUMULATORS)
from mugraph.ir.shapes import _fmt, check_shape

AXES = ("x", "y", "z")
Map = tuple  # three entries, one per grid axis: a tensor dim or None


def _norm_map(value, rank: int, what: str, field: str | None = None) -> tuple:
    """Accept (d0, d1, d2), a shorter tuple, a dict {"x": d} or None; return a 3-tuple."""
    if value is None:
        return (None, None, None)
    if isinstance(value, dict):
        bad = set(value) - set(AXES)
        if bad:
            raise InvalidGraph(f"{what} names unknown grid axes {sorted(bad)}", field=field,
                               hint="use x, y, z")
        value = tuple(value.get(a) for a in AXES)
    value = tuple(value) + (None,) * (3 - len(tuple(value)))
    if len(value) != 3:
        raise InvalidGraph(f"{what} {value!r} has more than 3 entries", field=field,
                           hint="one per grid axis")
    for v in value:
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < rank):
            raise InvalidGraph(f"{what} {value!r} maps a grid axis to dim {v!r}, but the tensor "
                               f"has rank {rank}", field=field,
                               hint=f"use a dim in 0..{rank - 1} or None")
    used = [v for v in value if v is not None]
    if len(used) != len(set(used)):
        raise InvalidGraph(f"{what} {value!r} maps two grid axes to the same dim", field=field,
                           hint="each grid axis must split a different dim")
    return value


def _grid(value) -> tuple[int, int, int]:
    value = tuple(value) + (1,) * (3 - len(tuple(value)))
    if len(value) != 3 or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1
                                  for g in value):
        raise InvalidGraph(f"grid {value!r} must be up to three positive ints", field="grid")
    if value[1] > 65535 or value[2] > 65535 or value[0] > 2**31 - 1:
        raise InvalidGraph(f"grid {value!r} exceeds CUDA's limits (2^31-1, 65535, 65535)",
                           field="grid")
    return value


def _forloop(value) -> int:
    # checked before any tile is cut, so a bad trip count never reaches a division
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidGraph(f"forloop={value!r} is not a trip count >= 1", field="forloop",
                           hint="use 1 for a block without a loop")
    return value


@dataclass(frozen=True)
class BlockInput:
    """The argument of a block INPUT node: which kernel tensor it tiles and how."""

    index: int
    shape: tuple           # the whole kernel tensor
    dtype: DType
    imap: Map
    fmap: int | None
    grid: tuple
    forloop: int

    def __post_init__(self):
        check_shape(self.shape, f"block input {self.index}")
        object.__setattr__(self, "grid", _grid(self.grid))
        _forloop(self.forloop)
        object.__setattr__(self, "imap", _norm_map(self.imap, len(self.shape),
                                                   f"input {self.index} imap", self._field("imap")))
        fmap_ok = isinstance(self.fmap, int) and not isinstance(self.fmap, bool) \
            and 0 <= self.fmap < len(self.shape)
        if self.fmap is not None and not fmap_ok:
            raise InvalidGraph(f"input {self.index} fmap {self.fmap!r} is not a dim of a rank-"
                               f"{len(self.shape)} tensor", field=self._field("fmap"),
                               hint="use a dim index or None")
        self.tile_shape  # runs the divisibility checks

    def _field(self, part: str) -> str:
        return f"inputs[{self.index}].{part}"

    @property
    def tile_shape(self) -> tuple:
        tile = list(self.shape)
        for axis, dim in enumerate(self.imap):
            if dim is None:
                continue
            if tile[dim] % self.grid[axis]:
                raise ShapeError(f"input {self.index} {_fmt(self.shape)}: grid {AXES[axis]}="
                                 f"{self.grid[axis]} does not divide dim {dim} ({tile[dim]})",
                                 field=self._field("imap"),
                                 hint="choose a grid extent that divides the dim it splits")
            tile[dim] //= self.grid[axis]
        if self.fmap is not None:
            if tile[self.fmap] % self.forloop:
                raise ShapeError(f"input {self.index} {_fmt(self.shape)}: forloop {self.forloop} "
                                 f"does not divide dim {self.fmap} of its block tile ({tile[self.fmap]})",
                                 field=self._field("fmap"),
                                 hint="choose a trip count that divides the per-block extent")
            tile[self.fmap] //= self.forloop
        return tuple(tile)


@dataclass(frozen=True)
class BlockOutput:
    """One output of a block graph: the tile value, its omap, and the kernel tensor it fills."""

    node: BNode
    omap: Map
    dtype: DType
    shape: tuple           # the whole kernel tensor the blocks' tiles form

    def __post_init__(self):
        if not isinstance(self.node, BNode):
            raise InvalidGraph(f"a block output must be a block tile, got {self.node!r}")
        object.__setattr__(self, "omap", _norm_map(self.omap, self.node.rank, "output omap"))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        object.__setattr__(self, "shape", check_shape(tuple(self.shape), "block output"))


class Phase(Enum):
    """When a block value exists: per iteration, hoisted out of the loop, or after the loop."""

    LOOP = "loop"
    INVARIANT = "invariant"
    ACCUMULATOR = "accumulator"
    EPILOGUE = "epilogue"


def phases(outputs) -> dict[BNode, Phase]:
    """The phase of every node reachable from `outputs` (nodes, in any order)."""
    result: dict[BNode, Phase] = {}
    for node in toposort(outputs):
        result[node] = _phase(node, result)
    return result


def _phase(node: BNode, known) -> Phase:
    if node.op is BOp.INPUT:
        return Phase.INVARIANT if node.arg.fmap is None else Phase.LOOP
    if node.op in ACCUMULATORS:
        return Phase.ACCUMULATOR
    src = {known[s] for s in node.srcs}
    if Phase.LOOP in src:
        return Phase.LOOP
    if src & {Phase.ACCUMULATOR, Phase.EPILOGUE}:
        return Phase.EPILOGUE
    return Phase.INVARIANT


class BlockGraph(_Interned):
    """One thread block's program: schedule + tile-level DAG. Valid by construction."""

    __slots__ = ("grid", "threads", "forloop", "inputs", "outputs")

    def __new__(cls, grid, threads: int, forloop: int, inputs, outputs):
        grid = _grid(grid)
        key = (grid, threads, forloop, tuple(inputs), tuple(outputs))

        def build(obj):
            for name, value in zip(cls.__slots__, key):
                object.__setattr__(obj, name, value)
            check_block_graph(obj)

        return cls._intern(key, build)

    @property
    def nodes(self) -> list[BNode]:
        return toposort([o.node for o in self.outputs])

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def phases(self) -> dict[BNode, Phase]:
        return phases([o.node for o in self.outputs])

    def __repr__(self) -> str:
        return (f"BlockGraph(grid={self.grid}, forloop={self.forloop}, "
                f"{len(self.inputs)} inputs, {len(self.outputs)} outputs)")

    def __str__(self) -> str:
        from mugraph.ir.printer import format_block_graph
        return format_block_graph(self)


# ---- the well-formedness check ------------------------------------------------------------------
def _excerpt(graph: BlockGraph, node: BNode) -> str:
    from mugraph.ir.printer import format_block_node
    return "\n  at: " + format_block_node(node, graph)


def check_block_graph(g: BlockGraph) -> None:
    """Raise InvalidGraph (with the field and an IR excerpt) unless `g` follows every block rule."""
    if not isinstance(g.threads, int) or isinstance(g.threads, bool) or g.threads % 32 \
            or not 32 <= g.threads <= 1024:
        raise InvalidGraph(f"threads={g.threads!r} is not a multiple of 32 between 32 and 1024",
                           field="threads", hint="use 128 (the default) or 256")
    _forloop(g.forloop)
    if not g.outputs:
        raise InvalidGraph("a block graph needs at least one output", field="outputs")
    _check_inputs(g)
    phase = phases([o.node for o in g.outputs])
    _check_reachable_inputs(g, phase)
    for node, p in phase.items():
        _check_node_phase(g, node, p, phase)
    for i, out in enumerate(g.outputs):
        _check_output(g, i, out, phase)


def _check_inputs(g: BlockGraph) -> None:
    for i, node in enumerate(g.inputs):
        field = f"inputs[{i}]"
        if not isinstance(node, BNode) or node.op is not BOp.INPUT:
            raise InvalidGraph(f"{node!r} is not a block input node", field=field)
        spec = node.arg
        if spec.index != i:
            raise InvalidGraph(f"input node carries index {spec.index}", field=field,
                               hint="inputs must be listed in index order")
        if spec.grid != g.grid or spec.forloop != g.forloop:
            raise InvalidGraph(f"input was tiled for grid {spec.grid} / forloop {spec.forloop}, "
                               f"the graph has grid {g.grid} / forloop {g.forloop}", field=field)


def _check_reachable_inputs(g: BlockGraph, phase) -> None:
    listed = set(g.inputs)
    for node in phase:
        if node.op is BOp.INPUT and node not in listed:
            raise InvalidGraph(f"input {node.arg.index} is used but not listed", field="inputs")
    for i, node in enumerate(g.inputs):
        if node not in phase:
            raise InvalidGraph(f"input {i} {_fmt(node.arg.shape)} is never used", field=f"inputs[{i}]",
                               hint="drop the input or use it")


def _check_node_phase(g: BlockGraph, node: BNode, p: Phase, phase) -> None:
    if p is Phase.ACCUMULATOR:
        if phase[node.srcs[0]] not in (Phase.LOOP, Phase.INVARIANT):
            raise InvalidGraph(f"{node.op.value} accumulates a value that is not computed inside "
                               f"the loop ({phase[node.srcs[0]].value})", field="nodes",
                               hint="accumulate loop values; use epilogue ops after the loop"
                               + _excerpt(g, node))
        if node.op in RESCALE_ACCUMULATORS and phase[node.srcs[1]] is not Phase.ACCUMULATOR:
            raise InvalidGraph("a rescaling accumulator needs a running-max accumulator",
                               field="nodes")
        return
    if p is Phase.LOOP:
        for s in node.srcs:
            if phase[s] is Phase.ACCUMULATOR and s.op not in RUNNING_ACCUMULATORS:
                raise InvalidGraph(f"{node.op.value} reads the {s.op.value} accumulator inside the "
                                   "loop, where only a partial value exists", field="nodes",
                                   hint="only acc_max / acc_max_last may be read inside the loop "
                                        "(their running value)" + _excerpt(g, node))
            if phase[s] is Phase.EPILOGUE:
                raise InvalidGraph(f"{node.op.value} reads {s.op.value}, a value that exists only "
                                   "after the loop, inside the loop", field="nodes",
                                   hint="read the running acc_max / acc_max_last itself, or move "
                                        "the op after the loop" + _excerpt(g, node))


def _check_output(g: BlockGraph, i: int, out: BlockOutput, phase) -> None:
    field = f"outputs[{i}]"
    if not isinstance(out, BlockOutput):
        raise InvalidGraph(f"{out!r} is not a BlockOutput", field=field)
    if phase[out.node] not in (Phase.ACCUMULATOR, Phase.EPILOGUE):
        raise InvalidGraph(f"output {i} is a {phase[out.node].value} value ({out.node.op.value}); "
                           "only values after an accumulator may leave the block", field=field,
                           hint="accumulate it (acc_sum with forloop=1 keeps a single tile)"
                           + _excerpt(g, out.node))
    omap = out.omap
    for axis, extent in enumerate(g.grid):
        if extent > 1 and omap[axis] is None:
            raise InvalidGraph(f"grid {AXES[axis]}={extent} is not mapped by omap {omap}: "
                               f"{extent} blocks would write the same tile", field=f"{field}.omap",
                               hint=f"map grid {AXES[axis]} to an output dim")
    covered = _covered_shape(out.node.shape, omap, g.grid)
    if covered != tuple(out.shape):
        raise ShapeError(f"blocks write tiles {_fmt(out.node.shape)} over grid {g.grid} with omap "
                         f"{omap}, covering {_fmt(covered)} of the declared output "
                         f"{_fmt(out.shape)}; part of the output would be left unwritten"
                         if all(c <= s for c, s in zip(covered, out.shape)) and
                         len(covered) == len(out.shape) else
                         f"blocks write tiles {_fmt(out.node.shape)} over grid {g.grid} with omap "
                         f"{omap}, covering {_fmt(covered)}, which does not fit the declared "
                         f"output {_fmt(out.shape)}", field=field,
                         hint="make tile x grid extent equal the output in every mapped dim")


def _covered_shape(tile, omap, grid) -> tuple:
    shape = list(tile)
    for axis, dim in enumerate(omap):
        if dim is not None:
            shape[dim] *= grid[axis]
    return tuple(shape)


# ---- builder ----------------------------------------------------------------------------------------
class BlockBuilder:
    """Builds one custom kernel: `b.input(X, imap, fmap)` tiles, then `b.finish([(tile, omap)])`."""

    def __init__(self, grid, forloop: int = 1, threads: int = 128):
        self.grid = _grid(grid)
        self.forloop = _forloop(forloop)
        self.threads = threads
        self._srcs: list[KNode] = []
        self._inputs: list[BNode] = []

    def input(self, tensor: KNode, imap=None, fmap: int | None = None) -> BNode:
        if not isinstance(tensor, KNode):
            raise InvalidGraph(f"BlockBuilder.input takes a kernel tensor (KNode), got {tensor!r}")
        if isinstance(fmap, int) and fmap < 0:
            fmap += tensor.rank
        spec = BlockInput(len(self._inputs), tensor.shape, tensor.dtype,
                          _norm_map(imap, tensor.rank, f"input {len(self._inputs)} imap",
                                    f"inputs[{len(self._inputs)}].imap"), fmap,
                          self.grid, self.forloop)
        node = BNode(BOp.INPUT, (), spec)
        self._srcs.append(tensor)
        self._inputs.append(node)
        return node

    def constant(self, value: float, shape=(1,)) -> BNode:
        return BNode(BOp.CONSTANT, (), (float(value), tuple(shape), DType.FLOAT32))

    def graph(self, outputs) -> BlockGraph:
        """`outputs`: (tile, omap) or (tile, omap, dtype) tuples, or BlockOutput records."""
        return BlockGraph(self.grid, self.threads, self.forloop, tuple(self._inputs),
                          tuple(self._output(i, o) for i, o in enumerate(outputs)))

    def finish(self, outputs) -> tuple[KNode, ...]:
        graph = self.graph(outputs)
        return custom(graph, self._srcs)

    def _output(self, i: int, spec) -> BlockOutput:
        if isinstance(spec, BlockOutput):
            return spec
        node, omap, *rest = spec
        dtype = DType.parse(rest[0]) if rest else self._default_dtype()
        omap = _norm_map(omap, node.rank, f"output {i} omap", f"outputs[{i}].omap")
        shape = tuple(rest[1]) if len(rest) > 1 else _covered_shape(node.shape, omap, self.grid)
        return BlockOutput(node, omap, dtype, shape)

    def _default_dtype(self) -> DType:
        low = [t.dtype for t in self._srcs if t.dtype.is_16bit]
        return low[0] if low else DType.FLOAT32


def custom(graph: BlockGraph, srcs) -> tuple[KNode, ...]:
    """The kernel tensors a custom op computes: one KNode per block-graph output."""
    srcs = tuple(srcs)
    return tuple(KNode(KOp.CUSTOM, srcs, (graph, i)) for i in range(len(graph.outputs)))
