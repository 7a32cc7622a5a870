"""The reference interpreter on tiny hand-computed cases: accumulators, tiling, output placement,
dtypes and how inputs are passed."""
from __future__ import annotations

import math
import sys

import ml_dtypes
import numpy as np
import pytest

from mugraph import ir
from mugraph.ir import BOp

ROW = np.array([[3.0, 1.0, 4.0, 2.0]])   # two loop iterations see [3, 1] then [4, 2]
E = math.exp


def _two_iterations(accumulate) -> np.ndarray:
    """Run `accumulate(tile)` over ROW with forloop 2 walking dim 1; return the single output."""
    x = ir.input("X", (1, 4), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    t = b.input(x, fmap=1)
    (o,) = b.finish([(accumulate(t), None)])
    (out,) = ir.interpret(ir.KernelGraph([o]), [ROW])
    return out


ACCUMULATOR_CASES = {
    BOp.ACC_SUM: (lambda t: t.acc_sum(), [[3 + 4, 1 + 2]]),
    BOp.ACC_SUM_LAST: (lambda t: t.acc_sum_last(), [[10.0]]),
    BOp.ACC_RMS_LAST: (lambda t: t.acc_rms_last(), [[math.sqrt((9 + 1 + 16 + 4) / 4)]]),
    BOp.ACC_MAX: (lambda t: t.acc_max(), [[4.0, 2.0]]),
    BOp.ACC_MAX_LAST: (lambda t: t.acc_max_last(), [[4.0]]),
    # running max 3 then 4: the first iteration's sum is rescaled by exp(3 - 4)
    BOp.ACC_SUM_LAST_RESCALE: (
        lambda t: (t - t.acc_max_last()).exp().acc_sum_last_rescale(t.acc_max_last()),
        [[(E(0) + E(-2)) * E(3 - 4) + E(0) + E(-2)]]),
    BOp.ACC_SUM_RESCALE: (
        lambda t: (t - t.acc_max_last()).exp().acc_sum_rescale(t.acc_max_last()),
        [[E(0) * E(-1) + E(0), E(-2) * E(-1) + E(-2)]]),
}


def test_every_accumulator_has_a_hand_computed_case():
    assert set(ACCUMULATOR_CASES) == set(ir.ops.ACCUMULATORS)


@pytest.mark.parametrize("op", sorted(ACCUMULATOR_CASES, key=lambda o: o.value),
                         ids=lambda o: o.value)
def test_accumulator_over_two_iterations(op):
    build, expected = ACCUMULATOR_CASES[op]
    np.testing.assert_allclose(_two_iterations(build), expected, rtol=1e-15, atol=0)


def test_rescaled_sums_equal_the_softmax_denominator():
    denominator = np.exp(ROW - ROW.max()).sum(keepdims=True)
    got = _two_iterations(ACCUMULATOR_CASES[BOp.ACC_SUM_LAST_RESCALE][0])
    np.testing.assert_allclose(got, denominator, rtol=1e-15)


def test_running_max_read_inside_the_loop_is_the_max_so_far():
    # acc_sum of (x - running max): iteration 1 sees max 3, iteration 2 sees max 4
    got = _two_iterations(lambda t: (t - t.acc_max_last()).acc_sum())
    np.testing.assert_array_equal(got, [[(3 - 3) + (4 - 4), (1 - 3) + (2 - 4)]])


def test_invariant_input_is_accumulated_every_iteration():
    x = ir.input("X", (1, 2), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=3)
    t = b.input(x)  # no fmap: the same tile every iteration
    (o,) = b.finish([(t.acc_sum(), None)])
    (out,) = ir.interpret(ir.KernelGraph([o]), [[[1.0, 2.0]]])
    np.testing.assert_array_equal(out, [[3.0, 6.0]])


def test_omap_places_each_block_tile():
    # block (bx, by) reads X[bx, by] and writes it at out[by, bx]: the output is X transposed
    x = ir.input("X", (2, 3), "float32")
    b = ir.BlockBuilder(grid=(2, 3, 1))
    t = b.input(x, imap=(0, 1))
    (o,) = b.finish([(t.acc_sum(), (1, 0))])
    assert o.shape == (3, 2)
    data = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(ir.interpret(ir.KernelGraph([o]), [data])[0], data.T)


def test_omap_over_three_axes_tiles_the_output():
    x = ir.input("X", (2, 4, 6), "float32")
    b = ir.BlockBuilder(grid=(3, 2, 2))
    t = b.input(x, imap=(2, 1, 0))   # x splits dim 2, y dim 1, z dim 0: tiles [1, 2, 2]
    (o,) = b.finish([((t * 10.0).acc_sum(), (2, 1, 0))])
    data = np.arange(48.0).reshape(2, 4, 6)
    np.testing.assert_array_equal(ir.interpret(ir.KernelGraph([o]), [data])[0], data * 10)


def test_imap_and_fmap_slice_a_3d_tensor():
    # grid x splits dim 2 (6 -> 3), grid y splits dim 0 (2 -> 1), the loop walks dim 1 (4 -> 2)
    x = ir.input("X", (2, 4, 6), "float32")
    b = ir.BlockBuilder(grid=(2, 2, 1), forloop=2)
    t = b.input(x, imap=(2, 0), fmap=1)
    assert t.shape == (1, 2, 3)
    (first,) = b.finish([(t.acc_sum(), (2, 0))])
    data = np.arange(48.0).reshape(2, 4, 6)
    expected = data[:, 0:2, :] + data[:, 2:4, :]
    np.testing.assert_array_equal(ir.interpret(ir.KernelGraph([first]), [data])[0], expected)


def test_block_tiles_of_every_block_at_one_iteration():
    from mugraph.ir.interpret import _block_tiles
    x = ir.input("X", (2, 4, 6), "float32")
    spec = ir.BlockBuilder(grid=(2, 2, 1), forloop=2).input(x, imap=(2, 0), fmap=1).arg
    data = np.arange(48.0).reshape(2, 4, 6)
    tiles = _block_tiles(data, spec, 1)
    assert tiles.shape == (2, 2, 1, 1, 2, 3)          # (gx, gy, gz) then the tile
    np.testing.assert_array_equal(tiles[1, 0, 0], data[0:1, 2:4, 3:6])   # block (1, 0, 0)
    np.testing.assert_array_equal(tiles[0, 1, 0], data[1:2, 2:4, 0:3])   # block (0, 1, 0)
    np.testing.assert_array_equal(_block_tiles(data, spec, 0)[0, 1, 0], data[1:2, 0:2, 0:3])


def test_imap_and_fmap_on_the_same_dim():
    # the grid splits dim 1 in two halves and the loop walks each half in two steps
    x = ir.input("X", (1, 8), "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    t = b.input(x, imap=(1,), fmap=1)
    (o,) = b.finish([(t.acc_sum(), (1,))])
    data = np.arange(8.0).reshape(1, 8)
    expected = np.concatenate([data[:, 0:2] + data[:, 2:4], data[:, 4:6] + data[:, 6:8]], 1)
    np.testing.assert_array_equal(ir.interpret(ir.KernelGraph([o]), [data])[0], expected)


def test_block_graph_runs_directly():
    x = ir.input("X", (2, 4), "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    (o,) = b.finish([(b.input(x, imap=(0,), fmap=1).acc_sum_last(), (0,))])
    data = np.arange(8.0).reshape(2, 4)
    np.testing.assert_array_equal(ir.interpret(o.arg[0], [data])[0], data.sum(1, keepdims=True))


def test_multi_output_custom_op_runs_its_block_graph_once(monkeypatch):
    module = sys.modules["mugraph.ir.interpret"]  # `mugraph.ir.interpret` is the function
    calls = []
    real = module.run_block_graph
    monkeypatch.setattr(module, "run_block_graph", lambda *a: calls.append(1) or real(*a))
    x = ir.input("X", (2, 4), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    t = b.input(x, fmap=1)
    lo, hi = b.finish([(t.acc_sum_last(), None), (t.acc_max_last(), None)])
    data = np.arange(8.0).reshape(2, 4)
    s, m = ir.interpret(ir.KernelGraph([lo, hi]), [data])
    assert len(calls) == 1
    np.testing.assert_array_equal(s, data.sum(1, keepdims=True))
    np.testing.assert_array_equal(m, data.max(1, keepdims=True))


def test_block_matmul_rounds_fp32_operands_to_the_mma_dtype():
    # p = x * (1 + 2^-12) is exact in fp32 but rounds to x in fp16 before the tensor-core MMA
    x = ir.input("X", (1, 1), "float16")
    w = ir.input("W", (1, 1), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1))
    tx, tw = b.input(x), b.input(w)
    (o,) = b.finish([(((tx * b.constant(1 + 2.0**-12)) @ tw).acc_sum(), None, "float32")])
    g = ir.KernelGraph([o])
    assert ir.interpret(g, [[[1.0]], [[1.0]]], dtype="own")[0][0, 0] == 1.0
    assert ir.interpret(g, [[[1.0]], [[1.0]]])[0][0, 0] == 1 + 2.0**-12


@pytest.mark.parametrize("dtype,numpy_dtype", [("float16", np.float16),
                                               ("bfloat16", ml_dtypes.bfloat16),
                                               ("float32", np.float32)])
def test_own_dtype_rounds_outputs_to_each_tensors_dtype(dtype, numpy_dtype):
    x = ir.input("X", (3,), dtype)
    g = ir.KernelGraph([x / 3.0])
    data = np.array([1.0, 2.0, 4.0])
    (own,) = ir.interpret(g, [data], dtype="own")
    (exact,) = ir.interpret(g, [data])
    assert own.dtype == numpy_dtype and exact.dtype == np.float64
    np.testing.assert_array_equal(own, (data / 3.0).astype(np.float32).astype(numpy_dtype))
    np.testing.assert_allclose(exact, data / 3.0, rtol=1e-16)


def test_own_dtype_rounds_block_outputs():
    x = ir.input("X", (2, 4), "bfloat16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    (o,) = b.finish([((b.input(x, fmap=1) / 3.0).acc_sum(), None)])
    (own,) = ir.interpret(ir.KernelGraph([o]), [np.ones((2, 4))], dtype="own")
    assert own.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(own.astype(np.float32),
                                  np.float32(2 / 3.0).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_inputs_are_rounded_to_their_dtype_even_in_float64():
    x = ir.input("X", (1,), "float16")
    (out,) = ir.interpret(ir.KernelGraph([x + 0.0]), [[1 + 2.0**-12]])
    assert out[0] == 1.0


def test_inputs_by_list_and_by_name_agree():
    x, w = ir.input("X", (2, 3), "float32"), ir.input("W", (3, 2), "float32")
    g = ir.KernelGraph([(x @ w).relu()])
    a, b = np.arange(6.0).reshape(2, 3) - 2, np.arange(6.0).reshape(3, 2)
    by_list = ir.interpret(g, [a, b])[0]
    by_name = ir.interpret(g, {"W": b, "X": a})[0]
    np.testing.assert_array_equal(by_list, by_name)
    np.testing.assert_array_equal(by_list, np.maximum(a @ b, 0))
    np.testing.assert_array_equal(ir.interpret(g, ([a.tolist(), b]))[0], by_list)


def test_kernel_library_ops_compute_what_numpy_computes():
    x = ir.input("X", (2, 3), "float32")
    data = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    cases = [
        (x.rms_norm(1, 0.25), data / np.sqrt((data**2).mean(1, keepdims=True) + 0.25)),
        (x.amax(0), data.max(0, keepdims=True)),
        (ir.concat([x, x * 2.0], 0), np.concatenate([data, data * 2], 0)),
        (x.T, data.T),
        (x.sum(1).reshape((2,)), data.sum(1)),
        (x.sum(0).broadcast_to((4, 3)), np.broadcast_to(data.sum(0), (4, 3))),
        (x.clamp(-1.0, 2.0), np.clip(data, -1, 2)),
        ((x * x + 1.0) ** x, (data**2 + 1) ** data),
        (x.gelu(), np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(data)),
        (x.silu(), data / (1 + np.exp(-data))),
        (ir.constant(2.5, (1, 1)) - x, 2.5 - data),
    ]
    outs = ir.interpret(ir.KernelGraph([node for node, _ in cases]), [data])
    for (node, expected), got in zip(cases, outs):
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=repr(node))


def _halves(n=4096):
    """Rows of +32 then -32: the sum is 0, but a 16-bit accumulator overflows on the first half
    (2048 * 32 = 65536 > 65504) and never comes back; fp32 does not."""
    row = np.concatenate([np.full(n // 2, 32.0), np.full(n // 2, -32.0)])
    return np.stack([row, row]).astype(np.float16)


def test_kernel_reductions_and_matmuls_accumulate_in_fp32_in_own_precision():
    x = ir.input("X", (2, 4096), "float16")
    w = ir.input("W", (4096, 8), "float16")
    graph = ir.KernelGraph([x.sum(1), x @ w, x.rms_norm(1, 0.0)])
    halves = _halves()
    acc = np.float16(0)
    with np.errstate(over="ignore"):
        for v in halves[0]:                      # what a 16-bit accumulator gives
            acc = np.float16(acc + v)
    assert not np.isfinite(acc)
    total, product, normed = ir.interpret(graph, [halves, np.ones((4096, 8), np.float16)], dtype="own")
    assert (total == 0).all() and (product == 0).all() and (np.abs(normed) == 1).all()
    from mugraph.codegen.library_ops import library_op   # the library calls generated code makes
    out = np.empty((2, 1), np.float16)
    library_op(ir.KOp.REDUCE_SUM)(np, x.sum(1), [halves], out)
    assert (out == 0).all()


def test_block_reductions_and_accumulators_accumulate_in_fp32_in_own_precision():
    X = ir.input("X", (2, 4096), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    x = b.input(X, imap=None, fmap=1)
    outs = b.finish([(x.sum(1).acc_sum(), (None,)), (x.acc_sum_last(), (None,)),
                     (x.acc_rms_last(), (None,))])
    total, last, rms = ir.interpret(ir.KernelGraph(outs, [X]), [_halves()], dtype="own")
    assert (total == 0).all() and (last == 0).all() and (rms == 32).all()
