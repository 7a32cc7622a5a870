"""Hand-made pairs for the formal check: schedules that read or write the wrong elements are never
proved, and equivalent rewrites (other tilings, split-K, split-KV, associativity, transposes,
concat halves) are. Each pair's label is confirmed by float64 interpretation (the oracle), so no
pair can pass by being accidentally equivalent; random schedules close the file."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from mugraph import ir
from mugraph.ir.errors import MugraphError
from mugraph.verify.abstract import prove_equivalent
from tests.verify.test_abstract_elements import _split_kv_softmax
from tests.verify.test_abstract_mutants import oracle_equivalent

F32 = "float32"


def _ab(m=4, k=8, n=8):
    return ir.input("A", (m, k), F32), ir.input("B", (k, n), F32)


def tiled_matmul(grid=(2, 1, 1), forloop=2, a=(None, 1), b=((1,), 0), omap=(1,), shapes=(4, 8, 8)):
    """A @ B in one custom op: a = (imap, fmap) of A, b = (imap, fmap) of B."""
    A, B = _ab(*shapes)
    blk = ir.BlockBuilder(grid=grid, forloop=forloop)
    ta, tb = blk.input(A, imap=a[0], fmap=a[1]), blk.input(B, imap=b[0], fmap=b[1])
    return ir.KernelGraph(blk.finish([((ta @ tb).acc_sum(), omap)]), [A, B])


def matmul_spec(shapes=(4, 8, 8)):
    A, B = _ab(*shapes)
    return ir.KernelGraph([A @ B], [A, B])


def _rowsum(acc="sum", imap=(0,), fmap=1, grid=(2, 1, 1), forloop=2):
    X = ir.input("X", (8, 8), F32)
    blk = ir.BlockBuilder(grid=grid, forloop=forloop)
    x = blk.input(X, imap=imap, fmap=fmap)
    out = x.acc_sum_last() if acc == "sum" else x.acc_max_last()
    return ir.KernelGraph(blk.finish([(out, (0,))]), [X])


def _x(shape=(8, 8)):
    return ir.input("X", shape, F32)


def _square_tiles(omap=(0, 1, None), a_imap=(0, None, None)):
    A, B = _ab(8, 8, 8)
    blk = ir.BlockBuilder(grid=(2, 2, 1), forloop=2)
    ta, tb = blk.input(A, imap=a_imap, fmap=1), blk.input(B, imap=(None, 1, None), fmap=0)
    return ir.KernelGraph(blk.finish([((ta @ tb).acc_sum(), omap)]), [A, B])


def _concat_halves(order):
    A, B = ir.input("A", (4, 8), F32), ir.input("B", (4, 8), F32)
    parts = [A, B] if order == "ab" else [B, A]
    return ir.KernelGraph([ir.concat(parts, 0).exp()], [A, B])


def _halves_by_kernels():
    """exp(concat([A, B])) as concat of two custom kernels, one per half."""
    A, B = ir.input("A", (4, 8), F32), ir.input("B", (4, 8), F32)
    halves = []
    for t in (A, B):
        blk = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
        x = blk.input(t, imap=(1,))
        halves.append(blk.finish([(x.exp().acc_sum(), (1,))])[0])
    return ir.KernelGraph([ir.concat(halves, 0)], [A, B])


def _split_k_graph():
    A, B = _ab(4, 8, 8)
    k1 = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    ta, tb = k1.input(A, imap=(1,), fmap=1), k1.input(B, imap=(0,), fmap=0)
    (part,) = k1.finish([((ta @ tb).acc_sum(), (1,))])              # [4, 16]: split s at cols 8s..
    k2 = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    tp = k2.input(part, imap=None, fmap=1)                          # iteration s: cols 8s..8s+7
    return ir.KernelGraph(k2.finish([(tp.acc_sum(), None)]), [A, B])


def _softmax_spec(rows=4, seq=16, d=2):
    Q, Kt, V = ir.input("Q", (rows, d)), ir.input("K", (d, seq)), ir.input("V", (seq, d))
    s = Q @ Kt
    e = (s - s.amax(-1)).exp()
    return ir.KernelGraph([(e / e.sum(-1)) @ V], [Q, Kt, V])


def _online_softmax(variant=None, rows=4, seq=16, d=2):
    Q, Kt, V = ir.input("Q", (rows, d)), ir.input("K", (d, seq)), ir.input("V", (seq, d))
    blk = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    q = blk.input(Q, imap=(0,))
    k, v = blk.input(Kt, fmap=1), blk.input(V, fmap=0)
    s = q @ k
    m = s.acc_max_last()
    e = (s - m).exp()
    if variant == "running max, plain sums":
        out = (e @ v).acc_sum() / e.acc_sum_last()
    elif variant == "tile max":
        et = (s - s.amax(-1)).exp()
        out = (et @ v).acc_sum() / et.acc_sum_last()
    else:
        out = (e @ v).acc_sum_rescale(m) / e.acc_sum_last_rescale(m)
    return ir.KernelGraph(blk.finish([(out, (0,))]), [Q, Kt, V])


def _chain(order):
    X, A, B = ir.input("X", (4, 8), F32), ir.input("A", (8, 4), F32), ir.input("B", (4, 8), F32)
    return ir.KernelGraph([(X @ A) @ B if order == "left" else X @ (A @ B)], [X, A, B])


def _pair(name):
    A, B = _ab(8, 8, 8)
    X, Y = _x(), ir.input("Y", (8, 8), F32)
    pairs = {
        # ---- not equivalent -------------------------------------------------------------------
        "swapped omap": lambda: (_square_tiles(), _square_tiles(omap=(1, 0, None))),
        "wrong grid axis": lambda: (_square_tiles(), _square_tiles(a_imap=(None, 0, None))),
        "wrong fmap (loop and split dims trade)": lambda: (tiled_matmul(), tiled_matmul(b=((0,), 1))),
        "row sums: loop walks rows": lambda: (_rowsum(), _rowsum(imap=(1,), fmap=0)),
        "max accumulator replaced by sum": lambda: (_rowsum("max"), _rowsum("sum")),
        "transposed operand": lambda: (ir.KernelGraph([A @ B], [A, B]), ir.KernelGraph([A @ B.T], [A, B])),
        "swapped operands": lambda: (ir.KernelGraph([A @ B], [A, B]), ir.KernelGraph([B @ A], [A, B])),
        "reduction over the wrong dim": lambda: (ir.KernelGraph([X.sum(1)], [X]),
                                         ir.KernelGraph([X.sum(0).T], [X])),
        "broadcast along the wrong dim": lambda: (ir.KernelGraph([Y + X.sum(1)], [X, Y]),
                                          ir.KernelGraph([Y + X.sum(1).reshape((1, 8))], [X, Y])),
        "concat halves swapped (off by one tile)": lambda: (_concat_halves("ab"), _concat_halves("ba")),
        "running max with plain sums": lambda: (_softmax_spec(), _online_softmax("running max, plain sums")),
        "running max replaced by each tile's max": lambda: (_softmax_spec(), _online_softmax("tile max")),
        # ---- equivalent ---------------------------------------------------------------------------
        "tiled matmul": lambda: (matmul_spec(), tiled_matmul()),
        "tiled matmul, 2-d grid": lambda: (matmul_spec((8, 8, 8)), _square_tiles()),
        "tiled matmul, one block, 4 iterations": lambda: (matmul_spec(), tiled_matmul(grid=(1, 1, 1),
                                                                              forloop=4, b=(None, 0),
                                                                              omap=None)),
        "split-K in two kernels": lambda: (matmul_spec(), _split_k_graph()),
        "row sums in tiles": lambda: (ir.KernelGraph([X.sum(1)], [X]), _rowsum()),
        "row max in tiles": lambda: (ir.KernelGraph([X.amax(1)], [X]), _rowsum("max")),
        "matmul chain reassociated": lambda: (_chain("left"), _chain("right")),
        "matmul through transposes": lambda: (ir.KernelGraph([A @ B], [A, B]),
                                      ir.KernelGraph([(B.T @ A.T).T], [A, B])),
        "concat of two kernels": lambda: (_concat_halves("ab"), _halves_by_kernels()),
        "online softmax": lambda: (_softmax_spec(), _online_softmax()),
        "split-KV softmax, different row tiles": lambda: (_softmax_spec(), _split_kv_softmax()),
        "rms_norm op vs its formula": lambda: (ir.KernelGraph([X.rms_norm(1, 1e-5)], [X]),
                                       ir.KernelGraph([X * ((X * X).sum(1) / 8.0 + 1e-5).rsqrt()],
                                                      [X])),
    }
    return pairs[name]()


NOT_EQUIVALENT = ["swapped omap", "wrong grid axis", "wrong fmap (loop and split dims trade)",
                  "row sums: loop walks rows", "max accumulator replaced by sum",
                  "transposed operand", "swapped operands", "reduction over the wrong dim",
                  "broadcast along the wrong dim", "concat halves swapped (off by one tile)",
                  "running max with plain sums", "running max replaced by each tile's max"]
EQUIVALENT = ["tiled matmul", "tiled matmul, 2-d grid", "tiled matmul, one block, 4 iterations",
              "split-K in two kernels", "row sums in tiles", "row max in tiles",
              "matmul chain reassociated", "matmul through transposes", "concat of two kernels",
              "online softmax", "split-KV softmax, different row tiles", "rms_norm op vs its formula"]


@pytest.mark.parametrize("name", NOT_EQUIVALENT)
def test_wrong_schedules_are_not_proved(name):
    spec, candidate = _pair(name)
    assert not oracle_equivalent(spec, candidate), "the pair must really differ"
    result = prove_equivalent(spec, candidate)
    assert not result.proved and "not proved" in result.detail


@pytest.mark.parametrize("name", EQUIVALENT)
def test_equivalent_schedules_are_proved(name):
    spec, candidate = _pair(name)
    assert oracle_equivalent(spec, candidate), "the pair must really agree"
    result = prove_equivalent(spec, candidate)
    assert result.proved, result.detail


def test_a_timeout_is_not_proved():
    result = prove_equivalent(_softmax_spec(), _split_kv_softmax(), seconds=0.0)
    assert not result.proved and "timeout" in result.detail


# ---- random schedules of a matmul ----------------------------------------------------------------------
DIMS = st.sampled_from([None, 0, 1])


@settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
       st.tuples(DIMS, DIMS), st.sampled_from([None, 0, 1]), st.tuples(DIMS, DIMS),
       st.sampled_from([None, 0, 1]), st.tuples(DIMS, DIMS))
def test_random_matmul_schedules_are_proved_only_when_equivalent(gx, gy, forloop, a_imap, a_fmap,
                                                                 b_imap, b_fmap, omap):
    try:
        candidate = tiled_matmul(grid=(gx, gy, 1), forloop=forloop, a=(a_imap, a_fmap),
                                 b=(b_imap, b_fmap), omap=omap, shapes=(8, 8, 8))
    except MugraphError:
        assume(False)
    spec = matmul_spec((8, 8, 8))
    proved = prove_equivalent(spec, candidate).proved
    assert not proved or oracle_equivalent(spec, candidate)
