"""Custom kernels read model-code layouts as views and write outputs through them, on the CPU harness:
a head split (a reshape of a [B, S, H*D] input read as [B, H, S, D]), slices (an offset into the buffer),
GQA's jnp.repeat (a repeated dim: element i reads i // r), and a head merge of the result (written through
a transpose and a reshape). Each graph runs the generated CUDA on the harness against the reference
interpreter and jax.numpy; the launch plan shows that no copy ran."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir
from mugraph.codegen import run_on_cpu
from mugraph.codegen.generate import generate
from mugraph.ir.layout import copies, strided_view

F16 = "float16"


def _arrays(graph, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n.shape).astype(np.float16) for n in graph.inputs]


def _runs_right_without_copies(graph, want) -> None:
    arrays = _arrays(graph)
    kinds = [k.kind for k in generate(graph).plan.kernels]
    assert kinds == ["custom"] * len(graph.custom_ops()), kinds
    assert not copies(graph)
    got = run_on_cpu(graph, arrays)
    ref = ir.interpret(graph, arrays)
    for g, r, w in zip(got, ref, want(*arrays)):
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(np.asarray(g, np.float64), r, atol=2e-3 * scale)
        np.testing.assert_allclose(r, np.asarray(w, np.float64), atol=2e-3 * scale)


def _one_kernel(srcs, maps, body, omap, grid, forloop=1):
    b = ir.BlockBuilder(grid=grid, forloop=forloop)
    tiles = [b.input(s, imap=imap, fmap=fmap) for s, (imap, fmap) in zip(srcs, maps)]
    (out,) = b.finish([(body(*tiles), omap)])
    return out


def test_head_split_view_feeds_a_batched_matmul():
    x = ir.input("x", (1, 16, 64), F16)
    w = ir.input("w", (32, 16), F16)
    q = x.reshape((1, 16, 2, 32)).transpose((0, 2, 1, 3))          # [1, 2, 16, 32], a view
    out = _one_kernel([q, w], [((None, 1, None), None), ((None,) * 3, None)],
                      lambda tq, tw: (tq @ tw).acc_sum(), (None, 1, None), (1, 2, 1))
    _runs_right_without_copies(ir.KernelGraph([out]), lambda x, w: [
        jnp.einsum("bshd,de->bhse", jnp.asarray(x, jnp.float32).reshape(1, 16, 2, 32),
                   jnp.asarray(w, jnp.float32))])


def test_slices_are_offsets_into_their_buffer():
    x = ir.input("x", (8, 64), F16)
    lo, hi = x.slice((0, 0), (8, 32)), x.slice((0, 32), (8, 64))   # rotate-half's halves
    assert strided_view(hi).offset == 32
    out = _one_kernel([lo, hi], [((0, None, None), None)] * 2,
                      lambda a, b: (a * b - b).acc_sum(), (0, None, None), (2, 1, 1))
    _runs_right_without_copies(ir.KernelGraph([out]), lambda x: [
        np.asarray(x[:, :32], np.float32) * x[:, 32:] - x[:, 32:]])


@pytest.mark.parametrize("heads_per_block", [1, 2, 4])
def test_a_repeated_kv_dim_reads_each_head_for_its_group(heads_per_block):
    q = ir.input("q", (4, 8, 16), F16)
    k = ir.input("k", (1, 8, 2, 16), F16)
    rep = k.reshape((8, 2, 1, 16)).broadcast_to((8, 2, 2, 16)).reshape((8, 4, 16))
    kt = rep.transpose((1, 2, 0))                                     # [4, 16, 8]
    assert strided_view(kt).repeats == (2, 1, 1)
    out = _one_kernel([q, kt], [((0, None, None), None)] * 2,
                      lambda tq, tk: (tq @ tk).acc_sum(), (0, None, None), (4 // heads_per_block, 1, 1))

    def want(q, k):
        kk = np.repeat(np.asarray(k, np.float32)[0], 2, axis=1)        # [8, 4, 16]
        return [np.einsum("hsd,thd->hst", np.asarray(q, np.float32), kk)]
    _runs_right_without_copies(ir.KernelGraph([out]), want)


def test_a_head_merge_after_a_transpose_is_written_through_the_output():
    x = ir.input("x", (2, 16, 32), F16)
    w = ir.input("w", (32, 16), F16)
    core = _one_kernel([x, w], [((0, None, None), None), ((None,) * 3, None)],
                       lambda tx, tw: (tx @ tw).acc_sum(), (0, None, None), (2, 1, 1))
    merged = core.reshape((1, 2, 16, 16)).transpose((0, 2, 1, 3)).reshape((1, 16, 32))
    _runs_right_without_copies(ir.KernelGraph([merged]), lambda x, w: [
        np.transpose(np.asarray(x, np.float32) @ np.asarray(w, np.float32), (1, 0, 2)).reshape(1, 16, 32)])


def test_a_merge_that_is_no_view_is_copied_before_the_kernel_reads_it():
    x = ir.input("x", (2, 8, 16), F16)
    merged = x.transpose((1, 0, 2)).reshape((8, 32))                  # no strided view of x
    assert strided_view(merged) is None
    out = _one_kernel([merged], [((0, None, None), None)], lambda t: (t * 2.0).acc_sum(),
                      (0, None, None), (2, 1, 1))
    graph = ir.KernelGraph([out])
    assert copies(graph)
    arrays = _arrays(graph)
    got = run_on_cpu(graph, arrays)[0]
    want = np.transpose(np.asarray(arrays[0], np.float32), (1, 0, 2)).reshape(8, 32) * 2.0
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=1e-2)
