"""Nodes and graphs are interned and immutable: equal means identical, pickling keeps identity."""
from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import subprocess
import sys
import weakref

import pytest

from mugraph import ir
from mugraph.ir import BNode, BOp, KNode, KOp, TOp
from tests.ir.samples import block_sample, kernel_sample


def _rmsnorm_matmul(k: int = 32):
    x = ir.input("X", (4, k), "float16")
    w = ir.input("W", (k, 16), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    tx, tw = b.input(x, fmap=1), b.input(w, imap=(1,), fmap=0)
    out = (tx @ tw).acc_sum() * ((tx * tx).acc_sum_last() / float(k) + 1e-6).rsqrt()
    (o,) = b.finish([(out, (1,))])
    return ir.KernelGraph([o], output_names=["y"])


def test_equal_nodes_are_identical():
    x = ir.input("X", (2, 3), "float16")
    assert ir.input("X", (2, 3), "float16") is x
    assert ir.input("X", [2, 3], "f16") is x, "shape lists and dtype short names normalise"
    assert (x + 1.0) is (x + 1.0)
    assert (x + 1.0) is KNode(TOp.ADD, (x, ir.constant(1.0, (1, 1), "float16")))
    assert x.sum(-1) is x.sum(1)
    assert x.sum(0) is not x.sum(1)
    assert ir.input("X", (2, 3), "float32") is not x


def test_equal_graphs_are_identical():
    assert _rmsnorm_matmul() is _rmsnorm_matmul()
    g = _rmsnorm_matmul()
    bg = g.outputs[0].arg[0]
    assert bg is _rmsnorm_matmul().outputs[0].arg[0]
    assert ir.KernelGraph(g.outputs, g.inputs, ["y"]) is g
    assert ir.KernelGraph(g.outputs, g.inputs, ["z"]) is not g


def test_equality_is_identity():
    x = ir.input("X", (2, 3))
    assert x == ir.input("X", (2, 3)) and x != ir.input("Y", (2, 3))
    assert len({x, ir.input("X", (2, 3)), x.exp(), x.exp()}) == 2


@pytest.mark.parametrize("obj", [
    ir.input("X", (2, 3)), kernel_sample(TOp.EXP).outputs[0], kernel_sample(KOp.CUSTOM),
    block_sample(BOp.ACC_SUM_RESCALE).outputs[0].arg[0]], ids=["knode", "exp", "graph", "block"])
def test_setattr_raises(obj):
    with pytest.raises(AttributeError, match="immutable"):
        obj.shape = (1,)
    with pytest.raises(AttributeError):
        object.__getattribute__(obj, "__dict__")  # slots only: no place for stray attributes


def test_block_records_are_frozen():
    bg = _rmsnorm_matmul().outputs[0].arg[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        bg.inputs[0].arg.fmap = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        bg.outputs[0].omap = (None, None, None)
    bnode = bg.outputs[0].node
    with pytest.raises(AttributeError, match="immutable"):
        bnode.srcs = ()


@pytest.mark.parametrize("make", [
    lambda: ir.input("X", (2, 3)).exp().sum(0),
    lambda: _rmsnorm_matmul().outputs[0],
    lambda: _rmsnorm_matmul().outputs[0].arg[0],
    lambda: _rmsnorm_matmul().outputs[0].arg[0].outputs[0].node,
    _rmsnorm_matmul,
], ids=["knode", "custom-knode", "block-graph", "bnode", "kernel-graph"])
def test_pickle_round_trips_to_the_interned_object(make):
    obj = make()
    assert pickle.loads(pickle.dumps(obj)) is obj


def test_unpickling_rebuilds_through_the_constructor():
    g = _rmsnorm_matmul(k=44)  # a graph no other test module keeps alive
    data, text, ref = pickle.dumps(g), ir.to_json(g), weakref.ref(g.outputs[0].arg[0])
    del g
    gc.collect()
    assert ref() is None, "the interned graph is gone; loading must rebuild (and re-check) it"
    g = pickle.loads(data)
    assert ir.to_json(g) == text
    assert g is _rmsnorm_matmul(k=44)


def test_replace_builds_a_new_node():
    x = ir.input("X", (2, 3))
    y = x + 1.0
    z = y.replace(op=TOp.SUB)
    assert z is x - 1.0 and y.op is TOp.ADD
    assert y.replace() is y
    assert x.sum(0).replace(arg=1) is x.sum(1)
    with pytest.raises(ir.ShapeError):
        x.sum(0).replace(arg=2)  # the shape rule runs again


def test_hash_is_stable_within_a_process():
    a = _rmsnorm_matmul()
    h = (hash(a), hash(a.outputs[0]), hash(a.outputs[0].arg[0]))
    gc.collect()
    b = _rmsnorm_matmul()
    assert (hash(b), hash(b.outputs[0]), hash(b.outputs[0].arg[0])) == h


def test_digest_is_stable_across_processes():
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from tests.ir.test_nodes import _rmsnorm_matmul; print(_rmsnorm_matmul().digest())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == _rmsnorm_matmul().digest()
    assert _rmsnorm_matmul().digest() != kernel_sample(KOp.MATMUL).digest()


def test_nodes_of_two_levels_do_not_mix():
    x = ir.input("X", (4, 4))
    b = ir.BlockBuilder(grid=(1, 1, 1))
    t = b.input(x)
    with pytest.raises(ir.InvalidGraph, match="cannot be mixed"):
        BNode(TOp.ADD, (t, x))
    with pytest.raises(ir.InvalidGraph, match="cannot combine"):
        t + x


def test_kernel_and_block_dtype_rules():
    x16 = ir.input("A", (2, 2), "float16")
    x32 = ir.input("B", (2, 2), "float32")
    assert (x16 + x16).dtype is ir.DType.FLOAT16
    assert (x16 + x32).dtype is ir.DType.FLOAT32, "mixed dtypes widen to float32"
    assert (x16 * 2.0).dtype is ir.DType.FLOAT16, "Python numbers take the tensor's dtype"
    b = ir.BlockBuilder(grid=(1, 1, 1))
    t = b.input(x16)
    assert t.dtype is ir.DType.FLOAT16 and (t @ t).dtype is ir.DType.FLOAT32
    assert (t + t).dtype is ir.DType.FLOAT32, "block values other than input tiles are fp32"
    bf = b.input(ir.input("C", (2, 2), "bfloat16"))
    with pytest.raises(ir.ShapeError, match="mixes float16 and bfloat16"):
        t @ bf


def test_python_numbers_in_block_graphs_are_fp32_constants():
    # the kernel level keeps the tensor's dtype; block values live in fp32 registers
    x = ir.input("X", (2, 2), "float16")
    assert (x * 0.1).srcs[1].dtype is ir.DType.FLOAT16
    t = ir.BlockBuilder(grid=(1, 1, 1)).input(x)
    assert (t * 0.1).srcs[1].dtype is ir.DType.FLOAT32
