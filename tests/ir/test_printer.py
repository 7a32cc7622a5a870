"""The printer's text for kernel graphs and the loop nests of their block graphs (golden files)."""
from __future__ import annotations

import math

from mugraph import ir
from mugraph.ir.printer import format_node


def rmsnorm_matmul() -> ir.KernelGraph:
    """IR_API.md's RMSNorm + matmul at small shapes: X read once for the norm and the GEMM."""
    x = ir.input("X", (4, 64), "float16")
    w = ir.input("W", (64, 32), "float16")
    b = ir.BlockBuilder(grid=(4, 1, 1), forloop=4, threads=128)
    tx = b.input(x, imap=None, fmap=1)
    tw = b.input(w, imap=(1,), fmap=0)
    out = (tx @ tw).acc_sum() * (((tx * tx).acc_sum_last() / 64.0) + 1e-6).rsqrt()
    (o,) = b.finish([(out, (1,))])
    return ir.KernelGraph([o], output_names=["y"])


def library_ops() -> ir.KernelGraph:
    """A kernel graph of library ops only: norm, matmul, activation, layout, reductions."""
    x = ir.input("X", (2, 4, 8), "float16")
    w = ir.input("W", (8, 6), "float16")
    bias = ir.input("b", (6,), "float32")
    h = (x.rms_norm(-1, 1e-5) @ w).silu()
    y = h.transpose((0, 2, 1)).amax(2).clamp(-4.0, 4.0)
    pooled = ir.concat([h.sum(1), (h * 0.5).exp().sum(1)], 1)
    z = pooled + bias.reshape((1, 1, 6)).broadcast_to((2, 1, 6))
    return ir.KernelGraph([y, z], output_names=["peak", "pooled"])


def online_softmax() -> ir.KernelGraph:
    """softmax(Q K) V with a running max and rescaled sums, the loop walking the keys."""
    q = ir.input("Q", (8, 16), "float16")
    k = ir.input("K", (16, 32), "float16")
    v = ir.input("V", (32, 16), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    tq, tk, tv = b.input(q, imap=(0,)), b.input(k, fmap=1), b.input(v, fmap=0)
    s = (tq @ tk) * (1.0 / math.sqrt(16))
    m = s.acc_max_last()
    p = (s - m).exp()
    (o,) = b.finish([((p @ tv).acc_sum_rescale(m) / p.acc_sum_last_rescale(m), (0,))])
    return ir.KernelGraph([o], output_names=["attn"])


def three_d_tiles() -> ir.KernelGraph:
    """A 3-D tensor split by two grid axes and walked by the loop along a third dim."""
    x = ir.input("X", (2, 4, 6), "bfloat16")
    b = ir.BlockBuilder(grid=(2, 2, 1), forloop=2)
    t = b.input(x, imap=(2, 0), fmap=1)
    (o,) = b.finish([(t.acc_max(), (2, 0))])
    return ir.KernelGraph([o])


def test_print_rmsnorm_matmul(golden):
    golden("print_rmsnorm_matmul", str(rmsnorm_matmul()))


def test_print_library_ops(golden):
    golden("print_library_ops", str(library_ops()))


def test_print_online_softmax(golden):
    golden("print_online_softmax", str(online_softmax()))


def test_print_three_d_tiles(golden):
    golden("print_three_d_tiles", str(three_d_tiles()))


def test_block_graph_prints_alone_with_default_input_names():
    bg = rmsnorm_matmul().outputs[0].arg[0]
    text = str(bg)
    assert text.startswith("block graph, grid (4,1,1) = 4 blocks x 128 threads, forloop 4")
    assert "in0[:, 16*i:16*i+16]" in text and "in1[16*i:16*i+16, 8*bx:8*bx+8]" in text


def test_reprs_are_one_line():
    g = rmsnorm_matmul()
    assert repr(g) == "KernelGraph(X:f16[4, 64], W:f16[64, 32] -> 1 outputs, 3 nodes)"
    assert repr(g.outputs[0]) == "KNode(custom f16[4,32])"
    assert repr(g.outputs[0].arg[0]) == "BlockGraph(grid=(4, 1, 1), forloop=4, 2 inputs, 1 outputs)"
    assert format_node(g.outputs[0]) == "custom(f16[4,64], f16[64,32]) -> f16[4,32]"
    assert format_node(g.inputs[0]) == "input 'X' f16[4,64]"
