"""Small kernel graphs that exercise one code-generation construct each, for the CPU-harness tests.

Each case is a function returning (KernelGraph, list of input arrays); `CASES` maps a name to it.
"""
from __future__ import annotations

import numpy as np

from mugraph import ir

EPS = 1e-6


def _rand(rng, shape, dtype="float16", scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(ir.DType.parse(dtype).numpy)


def _graph(outs, inputs):
    return ir.KernelGraph(outs, inputs)


# ---- accumulators ---------------------------------------------------------------------------------------------

def acc_on_products(kind: str):
    """Each accumulator kind fed by a tensor-core product (registers: Frag / Rows layouts)."""
    def build(seed=0):
        rng = np.random.default_rng(seed)
        X = ir.input("X", (32, 128), "float16")
        W = ir.input("W", (128, 64), "float16")
        b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
        x = b.input(X, imap=None, fmap=1)
        w = b.input(W, imap=(1,), fmap=0)
        s = x @ w
        if kind in ("acc_sum_rescale", "acc_sum_last_rescale"):
            m = s.acc_max_last()
            e = (s - m).exp()
            acc = getattr(e, kind)(m)
            outs = [(acc, (1,)), (m, (1,), "float32")]
        else:
            outs = [(getattr(s, kind)(), (1,), "float32")]
        return _graph(b.finish(outs), [X, W]), [_rand(rng, X.shape, scale=0.3), _rand(rng, W.shape, scale=0.3)]
    return build


def acc_on_tiles(kind: str):
    """Each accumulator kind fed by elementwise ops on input tiles (Spread layouts, shuffle reductions)."""
    def build(seed=0):
        rng = np.random.default_rng(seed)
        X = ir.input("X", (16, 256), "float16")
        Y = ir.input("Y", (16, 256), "float16")
        b = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
        x = b.input(X, imap=(0,), fmap=1)
        y = b.input(Y, imap=(0,), fmap=1)
        v = (x * y + 0.5).tanh()
        if kind in ("acc_sum_rescale", "acc_sum_last_rescale"):
            m = v.acc_max() if kind == "acc_sum_rescale" else v.acc_max_last()
            acc = getattr((v - m).exp(), kind)(m)
            outs = [(acc, (0,), "float32"), (m, (0,), "float32")]
        else:
            outs = [(getattr(v, kind)(), (0,), "float32")]
        return _graph(b.finish(outs), [X, Y]), [_rand(rng, X.shape), _rand(rng, Y.shape)]
    return build


ACC_KINDS = ["acc_sum", "acc_sum_last", "acc_rms_last", "acc_max", "acc_max_last", "acc_sum_rescale",
             "acc_sum_last_rescale"]

# ---- reductions ---------------------------------------------------------------------------------------------


def reduce_dim(dim: int, op: str = "sum", source: str = "tile"):
    """A reduction along `dim` of a 3-D tile: of an input tile, or of a product in registers."""
    def build(seed=0):
        rng = np.random.default_rng(seed)
        A = ir.input("A", (2, 32, 64), "float16")
        B = ir.input("B", (2, 64, 48), "float16")
        b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
        a = b.input(A, imap=(0,))
        if source == "tile":
            v = a * 2.0
        else:
            v = a @ b.input(B, imap=(0,))
        r = v.sum(dim) if op == "sum" else v.amax(dim)
        inputs = [A] + ([B] if source != "tile" else [])
        arrays = [_rand(rng, A.shape)] + ([_rand(rng, B.shape)] if source != "tile" else [])
        return _graph(b.finish([(r.acc_sum(), (0,), "float32")]), inputs), arrays
    return build


def rms_norm_dims(dim: int):
    def build(seed=0):
        rng = np.random.default_rng(seed)
        A = ir.input("A", (4, 16, 64), "float16")
        b = ir.BlockBuilder(grid=(4, 1, 1), forloop=1)
        a = b.input(A, imap=(0,))
        return _graph(b.finish([(a.rms_norm(dim, EPS).acc_sum(), (0,))]), [A]), [_rand(rng, A.shape)]
    return build


def rms_norm_of_product(seed=0):
    rng = np.random.default_rng(seed)
    X = ir.input("X", (16, 64), "float16")
    W = ir.input("W", (64, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    p = b.input(X) @ b.input(W)
    return _graph(b.finish([(p.rms_norm(1, EPS).acc_sum(), None)]), [X, W]), \
        [_rand(rng, X.shape), _rand(rng, W.shape)]


def cross_warp_rows(seed=0):
    """A row sum of a product whose columns are split over 4 warps (partials meet in shared memory)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (16, 128), "float16")
    W = ir.input("W", (128, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    p = b.input(X, fmap=1) @ b.input(W, fmap=0)
    acc = p.acc_sum()
    out = acc / acc.sum(1)
    return _graph(b.finish([(out, None, "float32"), (p.acc_max_last(), None, "float32")]), [X, W]), \
        [_rand(rng, X.shape), _rand(rng, W.shape)]


# ---- matmuls ------------------------------------------------------------------------------------------------------

def matmul_m8(seed=0):
    """M = 8: the A tile is half an m16 tile (ldmatrix rows clamped, half the fragment rows padding)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (8, 128), "float16")
    W = ir.input("W", (128, 128), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    out = (b.input(X, fmap=1) @ b.input(W, imap=(1,), fmap=0)).acc_sum().gelu()
    return _graph(b.finish([(out, (1,))]), [X, W]), [_rand(rng, X.shape, scale=0.5), _rand(rng, W.shape, scale=0.5)]


def matmul_f32_operands(seed=0):
    """Products with fp32 operands: a computed fp32 tile against an f16 tile (rounded to f16 when staged) and
    fp32 x fp32 (exact, SIMT), and an fp32 accumulator times an input in the epilogue."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (16, 64), "float16")
    W = ir.input("W", (64, 32), "float16")
    V = ir.input("V", (32, 16), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    x, w, v = b.input(X), b.input(W), b.input(V)
    p = (x.exp() @ w).acc_sum()            # fp32 x f16 -> f16 mma
    q = ((x * 0.5) @ (w * 2.0)).acc_sum()   # fp32 x fp32 -> SIMT
    r = p @ v                                # epilogue: fp32 x fp32
    return _graph(b.finish([(p + q, None, "float32"), (r, None, "float32")]), [X, W, V]), \
        [_rand(rng, X.shape, scale=0.5), _rand(rng, W.shape, scale=0.5), _rand(rng, V.shape, "float32")]


def matmul_bf16(seed=0):
    rng = np.random.default_rng(seed)
    X = ir.input("X", (32, 128), "bfloat16")
    W = ir.input("W", (128, 64), "bfloat16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    s = (b.input(X, imap=(0,), fmap=1) @ b.input(W, fmap=0)).acc_sum()
    e = s.silu()
    return _graph(b.finish([(e, (0,)), ((e @ b.input(ir.input("V", (64, 16), "bfloat16"))), (0,), "float32")]),
                  None), [_rand(rng, X.shape, "bfloat16", 0.3), _rand(rng, W.shape, "bfloat16", 0.3),
                          _rand(rng, (64, 16), "bfloat16", 0.3)]


def matmul_odd_sizes(seed=0):
    """K = 24 (zero-padded to 32), N = 12 (staged, padded to 16), rows of 24 halves (48 bytes: 16-byte chunks
    but not a power of two: padded layout)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (20, 24), "float16")
    W = ir.input("W", (24, 12), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    out = (b.input(X) @ b.input(W)).acc_sum()
    return _graph(b.finish([(out, None)]), [X, W]), [_rand(rng, X.shape), _rand(rng, W.shape)]


def matmul_batched(seed=0):
    """3-D tiles: [2, 32, 64] @ [2, 64, 32], and a [1, 32, 32] tile broadcast against a [2, 32, 16] batch."""
    rng = np.random.default_rng(seed)
    A = ir.input("A", (4, 32, 64), "float16")
    B = ir.input("B", (4, 64, 32), "float16")
    C = ir.input("C", (1, 32, 32), "float16")
    D = ir.input("D", (4, 32, 16), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    a, bb = b.input(A, imap=(0,)), b.input(B, imap=(0,))
    c, d = b.input(C), b.input(D, imap=(0,))
    p = (a @ bb).acc_sum()
    q = (c @ d).acc_sum()
    return _graph(b.finish([(p, (0,)), (q, (0,), "float32")]), [A, B, C, D]), \
        [_rand(rng, A.shape, scale=0.5), _rand(rng, B.shape, scale=0.5), _rand(rng, C.shape), _rand(rng, D.shape)]


def chained_products(seed=0):
    """exp(Q K) V with the scores' C fragments reused as the A fragments of the second product (registers)."""
    rng = np.random.default_rng(seed)
    Q = ir.input("Q", (64, 64), "float16")
    K = ir.input("K", (64, 256), "float16")
    V = ir.input("V", (256, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    q, k, v = b.input(Q), b.input(K, fmap=1), b.input(V, fmap=0)
    e = (q @ k * 0.125).exp()
    out = (e @ v).acc_sum() / e.acc_sum_last()
    return _graph(b.finish([(out, None)]), [Q, K, V]), \
        [_rand(rng, Q.shape, scale=0.5), _rand(rng, K.shape, scale=0.5), _rand(rng, V.shape)]


def decode_attention(kind: str):
    """One-launch decode attention, every query row of a KV head in one block (GQA-packed): the loop over keys
    is split over CTAs by the schedule, each publishing fp32 partials the last one combines; ``kind`` "plain"
    (no max shift), "online" (running max, rescaled sums: one max per row in the partial state) or "qknorm"
    (fp32 normalised operands: three bf16 products)."""
    def build(seed=0):
        rng = np.random.default_rng(seed)
        Q = ir.input("Q", (2, 64, 64), "float16")
        K = ir.input("K", (2, 64, 1024), "float16")
        V = ir.input("V", (2, 1024, 64), "float16")
        b = ir.BlockBuilder(grid=(2, 1, 1), forloop=16)
        q = b.input(Q, imap=(0, None, None))
        k = b.input(K, imap=(0, None, None), fmap=2)
        v = b.input(V, imap=(0, None, None), fmap=1)
        if kind == "qknorm":
            s = (q.rms_norm(2, EPS) @ k.rms_norm(1, EPS)) * 0.125
        else:
            s = q @ k
        if kind == "online":
            m = s.acc_max_last()
            e = (s - m).exp()
            out = (e @ v).acc_sum_rescale(m) / e.acc_sum_last_rescale(m)
        else:
            e = s.exp()
            out = (e @ v).acc_sum() / e.acc_sum_last()
        scale = 1.0 if kind == "qknorm" else 0.3
        return _graph(b.finish([(out, (0, None, None))]), [Q, K, V]), \
            [_rand(rng, Q.shape, scale=scale), _rand(rng, K.shape, scale=scale), _rand(rng, V.shape)]
    return build


# ---- layouts and schedules ------------------------------------------------------------------------------------


def transpose_fed(seed=0):
    """A custom op reading X^T (strided loads into a swizzled tile) and a broadcast row."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (64, 32), "float16")
    W = ir.input("W", (64, 64), "float16")
    R = ir.input("R", (1, 64), "float16")
    xt = X.T
    rb = R.broadcast_to((32, 64))
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=2)
    x = b.input(xt, imap=(0,), fmap=1)
    w = b.input(W, fmap=0)
    r = b.input(rb, imap=(0,))
    out = (x @ w).acc_sum() + r
    return _graph(b.finish([(out, (0,))]), [X, W, R]), [_rand(rng, X.shape), _rand(rng, W.shape),
                                                          _rand(rng, R.shape)]


def multiple_outputs(seed=0):
    rng = np.random.default_rng(seed)
    X = ir.input("X", (64, 128), "float16")
    b = ir.BlockBuilder(grid=(4, 2, 1), forloop=2)
    x = b.input(X, imap=(0, 1), fmap=1)
    s = x.acc_sum()
    outs = b.finish([(s, (0, 1)), (x.acc_max_last(), (0, 1), "float32"), ((s * s).relu(), (0, 1), "bfloat16")])
    return _graph(outs, [X]), [_rand(rng, X.shape)]


def split_partials(seed=0):
    """An omap that lays per-split partials side by side (split-KV kernel 1) and a second kernel combining
    them, plus library ops between the kernels."""
    rng = np.random.default_rng(seed)
    Q = ir.input("Q", (2, 32, 64), "float16")
    K = ir.input("K", (2, 64, 256), "float16")
    b = ir.BlockBuilder(grid=(2, 4, 1), forloop=2)
    q = b.input(Q, imap=(0, None, None))
    k = b.input(K, imap=(0, 2, None), fmap=2)
    s = (q @ k)
    part, = b.finish([(s.acc_max_last(), (0, 2, None), "float32")])      # [2, 32, 4]
    c = ir.BlockBuilder(grid=(2, 1, 1), forloop=4)
    m = c.input(part, imap=(0,), fmap=2).acc_max()
    out, = c.finish([(m, (0,), "float32")])
    return _graph([out, part.sum(2), (part * 2.0).transpose((0, 2, 1))], [Q, K]), \
        [_rand(rng, Q.shape), _rand(rng, K.shape)]


def elementwise_only(seed=0):
    """Every unary and binary op, with broadcasting, on tiles whose rows are 40 bytes (scalar loads)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (8, 20), "float16")
    Y = ir.input("Y", (1, 20), "float32")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    x = b.input(X, imap=(0,))
    y = b.input(Y)
    pos = x.square() + 0.5
    v = (pos.log() + pos.sqrt() - pos.rsqrt() + x.silu() * x.gelu() + x.relu() - x.sigmoid() + x.tanh()
         + x.erf() - (-x).exp() + x.clamp(-0.5, 0.5) + (pos ** y) / pos + x.maximum(y) - x.minimum(y))
    return _graph(b.finish([(v.acc_sum(), (0,), "float32")]), [X, Y]), \
        [_rand(rng, X.shape), _rand(rng, Y.shape, "float32")]


def invariant_accumulation(seed=0):
    """An accumulator of a loop-invariant value over 3 iterations and a 256-thread block."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (16, 64), "float16")
    W = ir.input("W", (64, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=3, threads=256)
    p = b.input(X) @ b.input(W)
    out = p.acc_sum() + (b.input(X) * 2.0).acc_sum_last()
    return _graph(b.finish([(out, None)]), [X, W]), [_rand(rng, X.shape), _rand(rng, W.shape)]


CASES = {
    **{f"{k}_products": acc_on_products(k) for k in ACC_KINDS},
    **{f"{k}_tiles": acc_on_tiles(k) for k in ACC_KINDS},
    **{f"reduce_{op}_dim{d}_{src}": reduce_dim(d, op, src) for d in range(3) for op in ("sum", "max")
       for src in ("tile", "product")},
    **{f"rms_norm_dim{d}": rms_norm_dims(d) for d in range(3)},
    "rms_norm_of_product": rms_norm_of_product,
    "cross_warp_rows": cross_warp_rows,
    "matmul_m8": matmul_m8,
    "matmul_f32_operands": matmul_f32_operands,
    "matmul_bf16": matmul_bf16,
    "matmul_odd_sizes": matmul_odd_sizes,
    "matmul_batched": matmul_batched,
    "chained_products": chained_products,
    "transpose_fed": transpose_fed,
    "multiple_outputs": multiple_outputs,
    "split_partials": split_partials,
    "elementwise_only": elementwise_only,
    "invariant_accumulation": invariant_accumulation,
    **{f"decode_attention_{k}": decode_attention(k) for k in ("plain", "online", "qknorm")},
}


def rank4_and_rank1(seed=0):
    """Rank-4 batched tiles (two batch dims, one split over the grid) and a rank-1 bias tile."""
    rng = np.random.default_rng(seed)
    A = ir.input("A", (2, 2, 16, 32), "float16")
    B = ir.input("B", (2, 2, 32, 32), "float16")
    C = ir.input("C", (32,), "float16")
    b = ir.BlockBuilder(grid=(2, 1, 1), forloop=1)
    a, bb, c = b.input(A, imap=(0,)), b.input(B, imap=(0,)), b.input(C)
    out = ((a @ bb) + c).acc_sum()
    return _graph(b.finish([(out, (0,))]), [A, B, C]), [_rand(rng, A.shape), _rand(rng, B.shape), _rand(rng, C.shape)]


def library_only(seed=0):
    """No custom op: every launch is a library op (matmul, reduction, norm, layout ops, concat, constant)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (8, 16), "float16")
    W = ir.input("W", (16, 8), "float16")
    y = (X @ W).rms_norm(1, EPS)
    z = ir.concat([y, y.T.reshape((8, 8)) * 2.0], 1).amax(0)
    return _graph([z, X], [X, W]), [_rand(rng, X.shape), _rand(rng, W.shape)]


CASES.update({"rank4_and_rank1": rank4_and_rank1, "library_only": library_only})


def degenerate_products(seed=0):
    """K = 1 (an outer product of a row reduction and a row), M = 1 (a GEMV row) and N = 1 (a column)."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (16, 64), "float16")
    R = ir.input("R", (1, 48), "float16")
    W = ir.input("W", (64, 40), "float16")
    C = ir.input("C", (64, 1), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    x, r, w, c = b.input(X), b.input(R), b.input(W), b.input(C)
    outer = (x.sum(1) @ r).acc_sum()                    # [16,1] @ [1,48]
    gemv = (r @ b.input(ir.input("Y", (48, 40), "float16"))).acc_sum()  # [1,48] @ [48,40]
    column = (x @ c).acc_sum()                          # [16,64] @ [64,1]
    return _graph(b.finish([(outer, None, "float32"), (gemv, None, "float32"), (column, None, "float32"),
                            ((x @ w).acc_sum(), None)]), None), \
        [_rand(rng, X.shape), _rand(rng, R.shape), _rand(rng, W.shape), _rand(rng, C.shape),
         _rand(rng, (48, 40))]


CASES["degenerate_products"] = degenerate_products


def large_elementwise_state(seed=0):
    """Accumulators of 64 values per thread keep their state in shared memory (sum, running max read in the
    loop, rescaled sum) and the epilogue reads it by address."""
    rng = np.random.default_rng(seed)
    X = ir.input("X", (64, 512), "float16")
    M = ir.input("M", (64, 512), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=4)
    x, m = b.input(X, fmap=1), b.input(M, fmap=1)
    s = (x * 0.5).exp().acc_sum()
    mx = x.acc_max()
    r = (m - mx).acc_sum()
    out = (s / (r.square() + 1.0)).tanh()
    return _graph(b.finish([(out, None, "float32"), (mx, None)]), [X, M]), \
        [_rand(rng, X.shape), _rand(rng, M.shape)]


CASES["large_elementwise_state"] = large_elementwise_state
