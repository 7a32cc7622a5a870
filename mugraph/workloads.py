"""The benchmark suite: Mirage's workloads as JAX functions, with hand-written fused μGraphs.

Each `Workload` has its JAX function (`.fn`), input shapes and dtypes (`.inputs`), the lifted
kernel graph (`.spec()`), a hand-written μGraph of the known fused kernel (`.reference()`) and
the same workload at reduced shapes (`.small()`), with the same structure (at least two tiles
along every split). Shapes are Mirage's (notes/MIRAGE.md §6), fp16.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from mugraph import ir
from mugraph.ir import DType, KernelGraph
from mugraph.ir.errors import InvalidInput

EPS = float(np.float32(1e-6))  # the value JAX's float32 literal carries; specs and references share it
TILE = 64                      # the tile edge every reference uses along split and looped dims


@dataclass(frozen=True)
class Workload:
    """One benchmark: a JAX function at concrete shapes, plus its hand-written fused μGraph."""

    name: str
    description: str
    fn: Callable
    shapes: dict                      # input name -> shape, in argument order
    build_reference: Callable         # shapes dict -> KernelGraph
    small_shapes: dict
    input_scale: float = 1.0          # inputs ~ N(0, 1) * scale keep exp-heavy workloads finite
    dtype: DType = DType.FLOAT16
    tags: tuple = field(default=())

    @property
    def inputs(self) -> list[tuple[str, tuple, DType]]:
        return [(name, tuple(shape), self.dtype) for name, shape in self.shapes.items()]

    def example_args(self) -> list:
        import jax
        return [jax.ShapeDtypeStruct(shape, self.dtype.numpy) for shape in self.shapes.values()]

    def spec(self) -> KernelGraph:
        """The program as mugraph sees it: `fn` traced by JAX and lifted into a kernel graph."""
        return ir.from_jax(self.fn, *self.example_args(), input_names=list(self.shapes))

    def reference(self) -> KernelGraph:
        """The known fused kernel, written by hand as a μGraph."""
        return self.build_reference(self.shapes)

    def small(self) -> "Workload":
        return replace(self, shapes=dict(self.small_shapes), name=self.name)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [(rng.standard_normal(shape) * self.input_scale).astype(self.dtype.numpy)
                for shape in self.shapes.values()]

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}{list(s)}" for n, s in self.shapes.items())
        return f"Workload({self.name}: {dims})"


# ---- the JAX programs ----------------------------------------------------------------------------
def _rms_norm(x, axis=-1):
    import jax
    import jax.numpy as jnp
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=axis, keepdims=True)
    return (xf * jax.lax.rsqrt(ms + EPS)).astype(x.dtype)


def rmsnorm_linear_fn(X, W):
    return _rms_norm(X) @ W


def gated_mlp_fn(X, W1, W2):
    import jax
    return jax.nn.silu(X @ W1) * (X @ W2)


def lora_fn(X, W, A, B):
    return X @ W + (X @ A) @ B


def _softmax_nomax(s):
    e = np.exp(s) if isinstance(s, np.ndarray) else __import__("jax").numpy.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def gqa_fn(Q, K, V):
    """Attention of 256 query rows (query heads × tokens) per KV head, softmax without max-shift."""
    return _softmax_nomax(Q @ K) @ V


def gqa_safe_fn(Q, K, V):
    import jax.numpy as jnp
    import jax
    s = Q @ K
    e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
    return (e / e.sum(axis=-1, keepdims=True)) @ V


def qknorm_gqa_fn(Q, K, V):
    """QK-norm attention: RMSNorm of Q and K over the head dim, scores scaled by 1/sqrt(64)."""
    s = (_rms_norm(Q, axis=-1) @ _rms_norm(K, axis=1)) * 0.125
    return _softmax_nomax(s) @ V


def ntrans_fn(H, X, alpha):
    """nGPT's normalised residual: rms_norm(X + alpha * (rms_norm(H) + X))."""
    return _rms_norm(X + alpha * (_rms_norm(H) + X))


# ---- the hand-written fused μGraphs --------------------------------------------------------------
def _inputs(shapes) -> list:
    return [ir.input(name, shape, "float16") for name, shape in shapes.items()]


def rmsnorm_linear_reference(shapes) -> KernelGraph:
    """One kernel: X read once serves the norm and the GEMM, (x/rms(x))·W = (x·W)/rms(x)."""
    X, W = _inputs(shapes)
    k, n = X.shape[1], W.shape[1]
    b = ir.BlockBuilder(grid=(n // TILE, 1, 1), forloop=k // TILE)
    x = b.input(X, imap=None, fmap=1)
    w = b.input(W, imap=(1,), fmap=0)
    xw = (x @ w).acc_sum()
    ss = (x * x).acc_sum_last()
    out = xw * (ss / float(k) + EPS).rsqrt()
    return ir.KernelGraph(b.finish([(out, (1,))]), [X, W])


def gated_mlp_reference(shapes) -> KernelGraph:
    """One kernel: both GEMMs share X's tiles; silu and the product run in the epilogue."""
    X, W1, W2 = _inputs(shapes)
    k, n = W1.shape
    b = ir.BlockBuilder(grid=(n // TILE, 1, 1), forloop=k // TILE)
    x = b.input(X, imap=None, fmap=1)
    w1 = b.input(W1, imap=(1,), fmap=0)
    w2 = b.input(W2, imap=(1,), fmap=0)
    out = (x @ w1).acc_sum().silu() * (x @ w2).acc_sum()
    return ir.KernelGraph(b.finish([(out, (1,))]), [X, W1, W2])


def lora_reference(shapes) -> KernelGraph:
    """One kernel: X·W and X·A accumulate together; (X·A)·B joins in the epilogue."""
    X, W, A, B = _inputs(shapes)
    k, n = W.shape
    b = ir.BlockBuilder(grid=(n // TILE, 1, 1), forloop=k // TILE)
    x = b.input(X, imap=None, fmap=1)
    w = b.input(W, imap=(1,), fmap=0)
    a = b.input(A, imap=None, fmap=0)
    bb = b.input(B, imap=(1,), fmap=None)
    out = (x @ w).acc_sum() + (x @ a).acc_sum() @ bb
    return ir.KernelGraph(b.finish([(out, (1,))]), [X, W, A, B])


@dataclass(frozen=True)
class DecodeTiling:
    """How a one-launch decode-attention reference tiles its work: query rows and value columns per block (the
    grid: batch x row tiles x column tiles) and keys per loop trip. Codegen splits the loop over keys across CTAs
    (enough for every SM) and the last CTA of each block combines their fp32 partials in the same launch."""

    rows: int
    cols: int
    keys: int

    def threads(self, rows: int) -> int:
        """16 query rows per warp (each warp holds whole rows: row sums stay in its registers), 4 warps at most."""
        return 32 * max(1, min(4, rows // 16))


# Chosen by the cost model (h200, CUDA-graph launches) among rows 16-128, a half or quarter of the value columns
# or all, 32-128 keys per trip, and the two-launch FlashDecoding form; tests/test_workloads.py checks it is
# still the model's choice. Packing all 256 query rows of a KV head into one block does not pay at these shapes:
# its fp32 partial O (256 x 64 x 4 B = 64 KB per split) outweighs the K/V bytes it saves, and splitting the
# value columns (recomputing Q K on each half) halves the partial state the last CTA reads.
ATTENTION_TILING = DecodeTiling(rows=64, cols=32, keys=128)


def decode_attention(shapes, scores, online: bool, tiling: DecodeTiling = ATTENTION_TILING) -> KernelGraph:
    """One launch: grid (batch, row tiles, column tiles), a loop over key tiles with Q's tile held (its mma
    fragments stay in registers), exp of the scores (shifted by the running max when ``online``), P @ V and the
    row sums accumulated in fp32, the quotient in the epilogue."""
    Q, K, V = _inputs(shapes)
    (batch, m, d), n = Q.shape, K.shape[2]
    rows, cols, keys = min(tiling.rows, m), min(tiling.cols, d), min(tiling.keys, n)
    b = ir.BlockBuilder(grid=(batch, m // rows, d // cols), forloop=n // keys, threads=tiling.threads(rows))
    q = b.input(Q, imap=(0, 1, None), fmap=None)
    k = b.input(K, imap=(0, None, None), fmap=2)
    v = b.input(V, imap=(0, None, 2), fmap=1)
    s = scores(q, k)
    if online:
        mx = s.acc_max_last()
        e = (s - mx).exp()
        out = (e @ v).acc_sum_rescale(mx) / e.acc_sum_last_rescale(mx)
    else:
        e = s.exp()
        out = (e @ v).acc_sum() / e.acc_sum_last()
    return ir.KernelGraph(b.finish([(out, (0, 1, 2))]), [Q, K, V])


def split_kv_two_launches(shapes, scores, online: bool) -> KernelGraph:
    """FlashDecoding's two launches, for comparison: kernel 1 on grid (batch, KV splits, query-row tiles) writes
    per-split fp32 partials (P·V, row sums, and the row max when ``online``); kernel 2 combines them."""
    Q, K, V = _inputs(shapes)
    q_rows, seq = Q.shape[1], K.shape[2]
    splits = max(2, seq // (4 * TILE))
    b = ir.BlockBuilder(grid=(Q.shape[0], splits, q_rows // TILE), forloop=seq // (splits * TILE))
    q = b.input(Q, imap=(0, None, 1), fmap=None)
    k = b.input(K, imap=(0, 2, None), fmap=2)
    v = b.input(V, imap=(0, 1, None), fmap=1)
    s = scores(q, k)
    rows = 4 if q_rows % 4 == 0 else q_rows  # few rows per combine block: its small reads spread over every SM
    c = ir.BlockBuilder(grid=(Q.shape[0], q_rows // rows, 1), forloop=splits)
    if not online:
        e = s.exp()
        parts = b.finish([((e @ v).acc_sum(), (0, 2, 1), "float32"), (e.acc_sum_last(), (0, 2, 1), "float32")])
        o, l_ = (c.input(p, imap=(0, 1, None), fmap=2).acc_sum() for p in parts)
        return ir.KernelGraph(c.finish([(o / l_, (0, 1, None), "float16")]), [Q, K, V])
    mx = s.acc_max_last()
    e = (s - mx).exp()
    parts = b.finish([((e @ v).acc_sum_rescale(mx), (0, 2, 1), "float32"),
                      (e.acc_sum_last_rescale(mx), (0, 2, 1), "float32"), (mx, (0, 2, 1), "float32")])
    o_t, l_t, m_t = (c.input(p, imap=(0, 1, None), fmap=2) for p in parts)
    mm = m_t.acc_max()
    w = (m_t - mm).exp()
    out = (o_t * w).acc_sum_rescale(mm) / (l_t * w).acc_sum_rescale(mm)
    return ir.KernelGraph(c.finish([(out, (0, 1, None), "float16")]), [Q, K, V])


def _plain_scores(q, k):
    return q @ k


def _qknorm_scores(q, k):
    """Both RMSNorms fused (Q's hoisted out of the loop), the normalised Q and K rounded to fp16 where the program
    rounds them: one fp16 MMA."""
    return (q.rms_norm(2, EPS).cast("float16") @ k.rms_norm(1, EPS).cast("float16")) * 0.125


def gqa_reference(shapes) -> KernelGraph:
    """One-launch split-KV decode attention (``decode_attention``), softmax without max shift."""
    return decode_attention(shapes, _plain_scores, online=False)


def qknorm_gqa_reference(shapes) -> KernelGraph:
    """One-launch split-KV decode attention of the normalised, fp16-rounded Q and K."""
    return decode_attention(shapes, _qknorm_scores, online=False)


def gqa_safe_reference(shapes) -> KernelGraph:
    """One-launch split-KV decode attention with online softmax: running max, rescaled sums; the combine
    rescales each CTA's partials to the common max."""
    return decode_attention(shapes, _plain_scores, online=True)


def ntrans_reference(shapes) -> KernelGraph:
    """One kernel, one row per block: both norms and the residual update stay on chip."""
    H, X, A = _inputs(shapes)
    b = ir.BlockBuilder(grid=(H.shape[0], 1, 1), forloop=1)
    h, x, a = (b.input(t, imap=(0,), fmap=None) for t in (H, X, A))
    y = x + a * (h.rms_norm(1, EPS) + x)
    return ir.KernelGraph(b.finish([(y.rms_norm(1, EPS).acc_sum(), (0,))]), [H, X, A])


# ---- the suite ---------------------------------------------------------------------------------
_ATTN = dict(Q=(2, 256, 64), K=(2, 64, 4096), V=(2, 4096, 64))
_ATTN_SMALL = dict(Q=(2, 128, 64), K=(2, 64, 512), V=(2, 512, 64))

_SUITE = {w.name: w for w in [
    Workload("rmsnorm_linear", "RMSNorm(X) @ W", rmsnorm_linear_fn,
             dict(X=(16, 4096), W=(4096, 6144)), rmsnorm_linear_reference,
             dict(X=(16, 256), W=(256, 384)), tags=("mlp",)),
    Workload("gated_mlp", "silu(X @ W1) * (X @ W2)", gated_mlp_fn,
             dict(X=(8, 4096), W1=(4096, 4096), W2=(4096, 4096)), gated_mlp_reference,
             dict(X=(8, 256), W1=(256, 256), W2=(256, 256)), input_scale=0.5, tags=("mlp",)),
    Workload("lora", "X @ W + (X @ A) @ B", lora_fn,
             dict(X=(16, 256), W=(256, 4096), A=(256, 16), B=(16, 4096)), lora_reference,
             dict(X=(16, 128), W=(128, 256), A=(128, 16), B=(16, 256)), input_scale=0.5,
             tags=("mlp",)),
    Workload("gqa", "softmax(Q @ K) @ V, no max-subtraction (as Mirage)", gqa_fn, _ATTN,
             gqa_reference, _ATTN_SMALL, input_scale=0.3, tags=("attention",)),
    Workload("gqa_safe", "softmax(Q @ K - max) @ V", gqa_safe_fn, _ATTN, gqa_safe_reference,
             _ATTN_SMALL, input_scale=0.3, tags=("attention",)),
    Workload("qknorm_gqa", "softmax(rms(Q) @ rms(K) / 8) @ V", qknorm_gqa_fn, _ATTN,
             qknorm_gqa_reference, _ATTN_SMALL, tags=("attention",)),
    Workload("ntrans", "rms_norm(X + alpha * (rms_norm(H) + X))", ntrans_fn,
             dict(H=(8, 4096), X=(8, 4096), alpha=(8, 4096)), ntrans_reference,
             dict(H=(8, 256), X=(8, 256), alpha=(8, 256)), tags=("norm",)),
]}


def names() -> list[str]:
    return list(_SUITE)


def get(name: str) -> Workload:
    try:
        return _SUITE[name]
    except KeyError:
        raise InvalidInput(f"unknown workload {name!r}", hint=f"one of {', '.join(_SUITE)}") from None


def all_workloads() -> list[Workload]:
    return list(_SUITE.values())
