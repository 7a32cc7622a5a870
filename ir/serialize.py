"""JSON round trip of kernel graphs (with their block graphs), versioned, naming ops by name.

Schema (version 1)::

    {"format": "mugraph.kernel_graph", "version": 1,
     "inputs": [node ids], "outputs": [node ids], "output_names": [...],
     "nodes": [{"op": "input", "arg": {"name", "shape", "dtype"}},
               {"op": "constant", "arg": {"value": 0.5 | "inf" | "-inf", "shape", "dtype"}},
               {"op": "iota", "arg": {"shape", "dim", "dtype"}},
               {"op": "table", "arg": {"values": [row-major numbers], "shape", "dtype"}},
               {"op": "matmul", "srcs": [0, 1]},
               {"op": "custom", "srcs": [...], "arg": {"block_graph": 0, "output": 0}}, ...],
     "block_graphs": [{"grid": [x,y,z], "threads": 128, "forloop": F,
                       "nodes": [{"op": "input", "arg": {"index", "shape", "dtype", "imap", "fmap"}},
                                 {"op": "acc_sum", "srcs": [2]}, ...],
                       "outputs": [{"node": id, "omap": [..], "dtype": "float16", "shape": [..]}]}]}

Node lists are topologically ordered; every reference points backwards. Anything else is
rejected with `InvalidGraph` naming the field.
"""
from __future__ import annotations

import json

from mugraph.ir.block import BlockGraph, BlockInput, BlockOutput, _forloop, _grid
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph, MugraphError
from mugraph.ir.graph import KernelGraph
from mugraph.ir.node import BNode, KNode
from mugraph.ir.ops import BOp, KOp, TOp, op_by_name
from mugraph.ir.thread import from_entries, to_entries

FORMAT = "mugraph.kernel_graph"
VERSION = 1


# ---- writing -------------------------------------------------------------------------------------
def _arg_json(node, block_ids) -> object:
    op, arg = node.op, node.arg
    if arg is None:
        return None
    if op is KOp.INPUT:
        return {"name": arg[0], "shape": list(arg[1]), "dtype": arg[2].value}
    if op in (KOp.CONSTANT, BOp.CONSTANT):
        return {"value": _number_json(arg[0]), "shape": list(arg[1]), "dtype": arg[2].value}
    if op is KOp.IOTA:
        return {"shape": list(arg[0]), "dim": arg[1], "dtype": arg[2].value}
    if op is KOp.TABLE:
        return {"values": [_number_json(v) for v in arg[0].array(-1).tolist()],
                "shape": list(arg[1]), "dtype": arg[2].value}
    if op is KOp.CUSTOM:
        return {"block_graph": block_ids[arg[0]], "output": arg[1]}
    if op is BOp.INPUT:
        return {"index": arg.index, "shape": list(arg.shape), "dtype": arg.dtype.value,
                "imap": list(arg.imap), "fmap": arg.fmap}
    if op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return {"dim": arg[0], "eps": arg[1]}
    if op is TOp.CLAMP:
        return {"lo": arg[0], "hi": arg[1]}
    if op is TOp.CAST:
        return {"dtype": arg.value}
    if op is BOp.THREAD:
        return to_entries(arg)
    if op is KOp.SLICE:
        return {"starts": list(arg[0]), "limits": list(arg[1])}
    if isinstance(arg, tuple):
        return list(arg)
    return arg


_NON_FINITE = {"inf": float("inf"), "-inf": float("-inf")}


def _number_json(value: float):
    """A float, or "inf" / "-inf" (strict JSON has no infinities)."""
    return value if value == value and abs(value) != float("inf") else \
        ("inf" if value > 0 else "-inf")


def _nodes_json(nodes, block_ids) -> tuple[list, dict]:
    ids, out = {}, []
    for node in nodes:
        ids[node] = len(out)
        entry = {"op": node.op.value}
        if node.srcs:
            entry["srcs"] = [ids[s] for s in node.srcs]
        arg = _arg_json(node, block_ids)
        if arg is not None:
            entry["arg"] = arg
        out.append(entry)
    return out, ids


def _block_json(g: BlockGraph) -> dict:
    nodes, ids = _nodes_json(g.nodes, {})
    return {"grid": list(g.grid), "threads": g.threads, "forloop": g.forloop, "nodes": nodes,
            "inputs": [ids[n] for n in g.inputs],
            "outputs": [{"node": ids[o.node], "omap": list(o.omap), "dtype": o.dtype.value,
                         "shape": list(o.shape)} for o in g.outputs]}


def to_dict(graph: KernelGraph) -> dict:
    block_ids: dict[BlockGraph, int] = {}
    for bg, _ in graph.custom_ops():
        block_ids.setdefault(bg, len(block_ids))
    nodes, ids = _nodes_json(graph.nodes, block_ids)
    return {"format": FORMAT, "version": VERSION,
            "inputs": [ids[n] for n in graph.inputs], "outputs": [ids[n] for n in graph.outputs],
            "output_names": list(graph.output_names), "nodes": nodes,
            "block_graphs": [_block_json(bg) for bg in block_ids]}


def to_json(graph: KernelGraph, indent: int | None = 1) -> str:
    if not isinstance(graph, KernelGraph):
        raise InvalidGraph(f"to_json takes a KernelGraph, got {type(graph).__name__}")
    return json.dumps(to_dict(graph), indent=indent, sort_keys=False)


# ---- reading -------------------------------------------------------------------------------------
def _get(obj, key, kind, field, default=...):
    if not isinstance(obj, dict):
        raise InvalidGraph(f"expected an object, got {type(obj).__name__}", field=field)
    if key not in obj:
        if default is not ...:
            return default
        raise InvalidGraph(f"missing field {key!r}", field=field)
    value = obj[key]
    ok = isinstance(value, kind) and not (kind in (int, (int, float)) and isinstance(value, bool))
    if not ok:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidGraph(f"expected {names}, got {json.dumps(value)[:60]}", field=f"{field}.{key}")
    return value


def _ints(value, field, allow_none=False) -> tuple:
    if not isinstance(value, list):
        raise InvalidGraph(f"expected a list, got {json.dumps(value)[:60]}", field=field)
    for i, v in enumerate(value):
        if v is None and allow_none:
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidGraph(f"expected an integer, got {json.dumps(v)[:40]}", field=f"{field}[{i}]")
    return tuple(value)


def _dtype(value, field) -> DType:
    if not isinstance(value, str):
        raise InvalidGraph(f"expected a dtype name, got {json.dumps(value)[:40]}", field=field)
    return DType.parse(value, field=field)


def _ref(ids: list, value, field, what="node"):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(ids):
        known = f"0..{len(ids) - 1}" if ids else "there are none"
        raise InvalidGraph(f"{json.dumps(value)[:40]} does not name an earlier {what} ({known})",
                           field=field, hint="node lists are in topological order; sources "
                                             "point backwards" if what == "node" else None)
    return ids[value]


def _refs(ids: list, values, field) -> tuple:
    return tuple(_ref(ids, v, f"{field}[{i}]") for i, v in enumerate(values))


def _at(e: InvalidGraph, field: str) -> InvalidGraph:
    """`e` moved to the JSON path `field`, keeping its type (ShapeError stays ShapeError)."""
    return type(e)(e.message, field=field, hint=e.hint)


def _scalar_arg(op, arg, field):
    if op in (KOp.CONSTANT, BOp.CONSTANT):
        return (_number(_get(arg, "value", (int, float, str), field), f"{field}.value"),
                _ints(_get(arg, "shape", list, field), f"{field}.shape"),
                _dtype(_get(arg, "dtype", str, field), f"{field}.dtype"))
    if op is KOp.TABLE:
        from mugraph.ir.table_values import TableValues
        values = _get(arg, "values", list, field)
        return (TableValues([_number(v, f"{field}.values[{i}]") for i, v in enumerate(values)]),
                _ints(_get(arg, "shape", list, field), f"{field}.shape"),
                _dtype(_get(arg, "dtype", str, field), f"{field}.dtype"))
    if op is KOp.IOTA:
        return (_ints(_get(arg, "shape", list, field), f"{field}.shape"),
                _get(arg, "dim", int, field), _dtype(_get(arg, "dtype", str, field), f"{field}.dtype"))
    if op in (KOp.RMS_NORM, BOp.RMS_NORM):
        return (_get(arg, "dim", int, field), float(_get(arg, "eps", (int, float), field)))
    if op is TOp.CLAMP:
        return (float(_get(arg, "lo", (int, float), field)), float(_get(arg, "hi", (int, float), field)))
    if op is TOp.CAST:
        return _dtype(_get(arg, "dtype", str, field), f"{field}.dtype")
    if op in (KOp.REDUCE_SUM, KOp.REDUCE_MAX, KOp.CONCAT, BOp.REDUCE_SUM, BOp.REDUCE_MAX):
        if not isinstance(arg, int) or isinstance(arg, bool):
            raise InvalidGraph(f"expected a dim, got {json.dumps(arg)[:40]}", field=field)
        return arg
    if op in (KOp.TRANSPOSE, KOp.RESHAPE, KOp.BROADCAST):
        return _ints(arg, field)
    if op is KOp.SLICE:
        return (_ints(_get(arg, "starts", list, field), f"{field}.starts"),
                _ints(_get(arg, "limits", list, field), f"{field}.limits"))
    if op is BOp.THREAD:
        try:
            return from_entries(arg)
        except InvalidGraph as e:
            raise _at(e, f"{field}{e.field and '.' + e.field or ''}") from None
    if arg is not None:
        raise InvalidGraph(f"{op.value} takes no argument", field=field)
    return None


def _number(value, field) -> float:
    if isinstance(value, bool):
        raise InvalidGraph(f"expected a number, got {json.dumps(value)}", field=field)
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise InvalidGraph(f"expected a number, \"inf\" or \"-inf\", got {json.dumps(value)[:40]}",
                               field=field)
        return _NON_FINITE[value]
    return float(value)


def _build(cls, op, srcs, arg, field):
    try:
        return cls(op, srcs, arg)
    except InvalidGraph as e:
        raise _at(e, field) from None


def _block_from(obj, field) -> BlockGraph:
    grid = _ints(_get(obj, "grid", list, field), f"{field}.grid")
    threads = _get(obj, "threads", int, field)
    forloop = _get(obj, "forloop", int, field)
    try:  # before any input is tiled by them
        grid, forloop = _grid(grid), _forloop(forloop)
    except InvalidGraph as e:
        raise _at(e, f"{field}.{e.field}") from None
    ids: list[BNode] = []
    for i, entry in enumerate(_get(obj, "nodes", list, field)):
        f = f"{field}.nodes[{i}]"
        op = _op(entry, "block", f)
        srcs = _refs(ids, _get(entry, "srcs", list, f, []), f"{f}.srcs")
        arg = _get(entry, "arg", object, f, None)
        if op is BOp.INPUT:
            arg = _block_input(arg, grid, forloop, f"{f}.arg")
        else:
            arg = _scalar_arg(op, arg, f"{f}.arg")
        ids.append(_build(BNode, op, srcs, arg, f))
    inputs = _refs(ids, _get(obj, "inputs", list, field), f"{field}.inputs")
    outputs = []
    for i, o in enumerate(_get(obj, "outputs", list, field)):
        f = f"{field}.outputs[{i}]"
        try:
            outputs.append(BlockOutput(_ref(ids, _get(o, "node", int, f), f"{f}.node"),
                                       _ints(_get(o, "omap", list, f), f"{f}.omap", True),
                                       _dtype(_get(o, "dtype", str, f), f"{f}.dtype"),
                                       _ints(_get(o, "shape", list, f), f"{f}.shape")))
        except InvalidGraph as e:
            raise _at(e, e.field or f) from None
    try:
        return BlockGraph(grid, threads, forloop, inputs, tuple(outputs))
    except InvalidGraph as e:
        raise _at(e, f"{field}.{e.field}" if e.field else field) from None


def _block_input(arg, grid, forloop, field) -> BlockInput:
    fields = (_get(arg, "index", int, field),
              _ints(_get(arg, "shape", list, field), f"{field}.shape"),
              _dtype(_get(arg, "dtype", str, field), f"{field}.dtype"),
              _ints(_get(arg, "imap", list, field), f"{field}.imap", True),
              _get(arg, "fmap", (int, type(None)), field))
    try:
        return BlockInput(*fields, grid, forloop)
    except InvalidGraph as e:
        # BlockInput names its own parts (`inputs[i].imap`); in the file they are `arg.imap`
        part = e.field.rsplit(".", 1)[1] if e.field else None
        raise _at(e, f"{field}.{part}" if part else field) from None


def _op(entry, level, field):
    name = _get(entry, "op", str, field)
    op = op_by_name(name, level)
    if op is None:
        raise InvalidGraph(f"unknown {level}-level op {name!r}", field=f"{field}.op",
                           hint="this file may come from a newer mugraph")
    return op


def from_dict(obj) -> KernelGraph:
    if not isinstance(obj, dict):
        raise InvalidGraph(f"expected a JSON object, got {type(obj).__name__}", field="$")
    if obj.get("format") != FORMAT:
        raise InvalidGraph(f"format is {obj.get('format')!r}, expected {FORMAT!r}", field="format",
                           hint="this is not a mugraph graph file; write one with mugraph.ir.save")
    version = obj.get("version")
    if version != VERSION:
        raise InvalidGraph(f"schema version {version!r} is not supported (this mugraph reads "
                           f"version {VERSION})", field="version",
                           hint="regenerate the file with this mugraph, or upgrade mugraph")
    blocks = [_block_from(b, f"block_graphs[{i}]")
              for i, b in enumerate(_get(obj, "block_graphs", list, "$", []))]
    ids: list[KNode] = []
    for i, entry in enumerate(_get(obj, "nodes", list, "$")):
        f = f"nodes[{i}]"
        op = _op(entry, "kernel", f)
        srcs = _refs(ids, _get(entry, "srcs", list, f, []), f"{f}.srcs")
        arg = _get(entry, "arg", object, f, None)
        if op is KOp.INPUT:
            arg = (_get(arg, "name", str, f"{f}.arg"),
                   _ints(_get(arg, "shape", list, f"{f}.arg"), f"{f}.arg.shape"),
                   _dtype(_get(arg, "dtype", str, f"{f}.arg"), f"{f}.arg.dtype"))
        elif op is KOp.CUSTOM:
            arg = (_ref(blocks, _get(arg, "block_graph", int, f"{f}.arg"), f"{f}.arg.block_graph",
                        "block graph"),
                   _get(arg, "output", int, f"{f}.arg"))
        else:
            arg = _scalar_arg(op, arg, f"{f}.arg")
        ids.append(_build(KNode, op, srcs, arg, f))
    inputs = _refs(ids, _get(obj, "inputs", list, "$"), "inputs")
    outputs = _refs(ids, _get(obj, "outputs", list, "$"), "outputs")
    names = _get(obj, "output_names", list, "$", None)
    return KernelGraph(outputs, inputs, names)


def from_json(text: str) -> KernelGraph:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise InvalidGraph(f"not valid JSON: {e}", field="$") from None
    return from_dict(obj)


def save(graph: KernelGraph, path) -> None:
    with open(path, "w") as f:
        f.write(to_json(graph) + "\n")


def load(path) -> KernelGraph:
    try:
        with open(path) as f:
            return from_json(f.read())
    except OSError as e:
        raise MugraphError(f"cannot read graph file {path}: {e.strerror}") from None
