"""Ill-formed graphs, files and inputs raise typed errors whose text (golden-filed) says what is
wrong, where, and how to fix it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import InvalidGraph, InvalidInput, ShapeError

X = ir.input("X", (4, 32), "float16")
W = ir.input("W", (32, 16), "float16")


def _rmsnorm_matmul_graph():
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    tx, tw = b.input(X, fmap=1), b.input(W, imap=(1,), fmap=0)
    out = (tx @ tw).acc_sum() * ((tx * tx).acc_sum_last() / 32.0 + 1e-6).rsqrt()
    (o,) = b.finish([(out, (1,))])
    return ir.KernelGraph([o], output_names=["y"])


GRAPH = _rmsnorm_matmul_graph()
DOC = ir.to_dict(GRAPH)  # nodes: 0 X, 1 W, 2 custom; block graph 0: 0 x, 1 w, 2 matmul, ...


def _edit(change):
    """from_dict of the RMSNorm+matmul file after `change(doc)` edits a deep copy of it."""
    def run():
        doc = json.loads(json.dumps(DOC))
        change(doc)
        return ir.from_dict(doc)
    return run


def _set(path, value):
    def change(doc):
        *parents, last = path
        for key in parents:
            doc = doc[key]
        if value is _DELETE:
            del doc[last]
        else:
            doc[last] = value
    return change


_DELETE = object()
BG = ("block_graphs", 0)


def _block(grid=(2, 1, 1), forloop=4, threads=128):
    b = ir.BlockBuilder(grid=grid, forloop=forloop, threads=threads)
    return b, b.input(X, fmap=1), b.input(W, imap=(1,), fmap=0)


def _output_larger_than_tiles():
    b, tx, tw = _block()
    b.finish([((tx @ tw).acc_sum(), (1,), "float16", (4, 32))])


def _grid_axis_not_in_omap():
    b, tx, tw = _block()
    b.finish([((tx @ tw).acc_sum(), None)])


def _loop_value_output():
    b, tx, tw = _block()
    b.finish([(tx @ tw, (1,))])


def _sum_read_in_loop():
    b, tx, tw = _block()
    partial = (tx @ tw).acc_sum()
    b.finish([((tx @ tw + partial).acc_sum(), (1,))])


def _after_loop_value_in_loop():
    b, tx, tw = _block(grid=(1, 1, 1))
    shifted = tx.acc_max_last() + 1.0
    b.finish([((tx - shifted).exp().acc_sum(), None), ((tx @ tw).acc_sum(), None)])


def _unused_block_input():
    b, tx, tw = _block()
    b.finish([(tx.acc_sum_last(), None)])


def _bad_threads():
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4, threads=100)
    b.finish([(b.input(X, fmap=1).acc_sum_last(), None)])


def _custom_input_shape():
    b = ir.BlockBuilder(grid=(1, 1, 1))
    bg = b.graph([(b.input(X).acc_sum_last(), None)])
    ir.custom(bg, [ir.input("Z", (4, 16), "float16")])


def _rescale_by_a_sum():
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    t = b.input(X, fmap=1)
    t.acc_sum_rescale(t.acc_sum())


# name -> (what raises, error type, field)
CASES = {
    # JSON files
    "json_not_json": (lambda: ir.from_json("{nodes: []}"), InvalidGraph, "$"),
    "json_not_an_object": (lambda: ir.from_json("[1, 2]"), InvalidGraph, "$"),
    "json_wrong_format": (_edit(_set(("format",), "onnx")), InvalidGraph, "format"),
    "json_unknown_version": (_edit(_set(("version",), 7)), InvalidGraph, "version"),
    "json_unknown_op": (_edit(_set(("nodes", 2, "op"), "frobnicate")), InvalidGraph,
                        "nodes[2].op"),
    "json_unknown_block_op": (_edit(_set((*BG, "nodes", 2, "op"), "custom")), InvalidGraph,
                              "block_graphs[0].nodes[2].op"),
    "json_missing_field": (_edit(_set(("nodes", 0, "arg", "shape"), _DELETE)), InvalidGraph,
                           "nodes[0].arg"),
    "json_missing_nodes": (_edit(_set(("nodes",), _DELETE)), InvalidGraph, "$"),
    "json_wrong_type": (_edit(_set(("nodes", 0, "arg", "shape"), "4x32")), InvalidGraph,
                        "nodes[0].arg.shape"),
    "json_wrong_type_in_list": (_edit(_set((*BG, "nodes", 1, "arg", "imap"), ["x"])),
                                InvalidGraph, "block_graphs[0].nodes[1].arg.imap[0]"),
    "json_forward_reference": (_edit(_set(("nodes", 2, "srcs"), [0, 2])), InvalidGraph,
                               "nodes[2].srcs[1]"),
    "json_out_of_range_output": (_edit(_set(("outputs",), [9])), InvalidGraph, "outputs[0]"),
    "json_block_graph_reference": (_edit(_set(("nodes", 2, "arg", "block_graph"), 3)),
                                   InvalidGraph, "nodes[2].arg.block_graph"),
    "json_bad_dtype": (_edit(_set(("nodes", 0, "arg", "dtype"), "int8")), InvalidGraph,
                       "nodes[0].arg.dtype"),
    "json_shape_mismatch": (_edit(_set(("nodes", 1, "arg", "shape"), [16, 16])), ShapeError,
                            "nodes[2]"),
    "json_grid_does_not_divide": (_edit(_set((*BG, "grid"), [3, 1, 1])), ShapeError,
                                  "block_graphs[0].nodes[1].arg.imap"),
    "json_zero_forloop": (_edit(_set((*BG, "forloop"), 0)), InvalidGraph,
                          "block_graphs[0].forloop"),
    "json_zero_grid": (_edit(_set((*BG, "grid"), [0, 1, 1])), InvalidGraph,
                       "block_graphs[0].grid"),
    "json_bad_threads": (_edit(_set((*BG, "threads"), 48)), InvalidGraph,
                         "block_graphs[0].threads"),
    "json_custom_output_index": (_edit(_set(("nodes", 2, "arg", "output"), 3)), InvalidGraph,
                                 "nodes[2]"),
    "json_output_name": (_edit(_set(("output_names",), [3])), InvalidGraph, "output_names[0]"),
    # shapes
    "shape_matmul_inner_dims": (lambda: X @ X, ShapeError, None),
    "shape_broadcast": (lambda: X + ir.input("Y", (4, 16)), ShapeError, None),
    "shape_custom_input": (_custom_input_shape, ShapeError, None),
    "shape_reduce_dim": (lambda: X.sum(2), ShapeError, None),
    "shape_rank_too_high": (lambda: ir.input("Z", (1, 2, 3, 4, 5)), ShapeError, None),
    "dtype_unknown": (lambda: ir.input("Z", (3,), np.int32), InvalidGraph, "dtype"),
    # block graphs
    "block_grid_does_not_divide": (lambda: _block(grid=(3, 1, 1)), ShapeError, "inputs[1].imap"),
    "block_forloop_does_not_divide": (lambda: _block(forloop=5), ShapeError, "inputs[0].fmap"),
    "block_imap_two_axes_one_dim": (
        lambda: ir.BlockBuilder(grid=(2, 2, 1)).input(W, imap=(1, 1)), InvalidGraph,
        "inputs[0].imap"),
    "block_output_unwritten": (_output_larger_than_tiles, ShapeError, "outputs[0]"),
    "block_grid_axis_not_in_omap": (_grid_axis_not_in_omap, InvalidGraph, "outputs[0].omap"),
    "block_loop_value_output": (_loop_value_output, InvalidGraph, "outputs[0]"),
    "block_sum_read_in_loop": (_sum_read_in_loop, InvalidGraph, "nodes"),
    "block_after_loop_value_in_loop": (_after_loop_value_in_loop, InvalidGraph, "nodes"),
    "block_unused_input": (_unused_block_input, InvalidGraph, "inputs[1]"),
    "block_bad_threads": (_bad_threads, InvalidGraph, "threads"),
    "block_negative_forloop": (lambda: ir.BlockBuilder(grid=(1, 1, 1), forloop=-2),
                               InvalidGraph, "forloop"),
    "block_rescale_by_a_sum": (_rescale_by_a_sum, InvalidGraph, None),
    # kernel graphs
    "graph_duplicate_input_names": (lambda: ir.KernelGraph([X + ir.input("X", (4, 32), "float32")]),
                                    InvalidGraph, "inputs[1]"),
    "graph_duplicate_output_names": (lambda: ir.KernelGraph([X, W], output_names=["a", "a"]),
                                     InvalidGraph, "output_names"),
    # interpreter inputs
    "input_wrong_count": (lambda: ir.interpret(GRAPH, [np.zeros((4, 32))]), InvalidInput, None),
    "input_wrong_shape": (lambda: ir.interpret(GRAPH, [np.zeros((4, 32))] * 2), InvalidInput,
                          None),
    "input_wrong_name": (lambda: ir.interpret(GRAPH, {"X": np.zeros((4, 32)),
                                                      "V": np.zeros((32, 16))}),
                         InvalidInput, None),
    "input_bare_array": (lambda: ir.interpret(GRAPH, np.zeros((4, 32))), InvalidInput, None),
    "input_block_graph_by_name": (
        lambda: ir.interpret(GRAPH.outputs[0].arg[0], {"X": np.zeros((4, 32))}), InvalidInput,
        None),
    "input_block_graph_wrong_shape": (
        lambda: ir.interpret(GRAPH.outputs[0].arg[0], [np.zeros((4, 32)), np.zeros((4, 32))]),
        InvalidInput, None),
    "input_bad_dtype_mode": (lambda: ir.interpret(GRAPH, [np.zeros((4, 32)), np.zeros((32, 16))],
                                                  dtype="float32"), InvalidInput, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_message(name, golden):
    run, error_type, field = CASES[name]
    with pytest.raises(ir.MugraphError) as info:
        run()
    e = info.value
    assert type(e) is error_type, f"{name} raised {type(e).__name__}: {e}"
    assert getattr(e, "field", None) == field
    golden(f"error_{name}", f"{type(e).__name__}: {e}")


def test_load_missing_file(tmp_path):
    with pytest.raises(ir.MugraphError, match="cannot read graph file .*nope.json"):
        ir.load(tmp_path / "nope.json")


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "g.json"
    ir.save(GRAPH, path)
    assert ir.load(path) is GRAPH
    assert json.loads(path.read_text())["format"] == "mugraph.kernel_graph"
