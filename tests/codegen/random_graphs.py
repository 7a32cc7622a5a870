"""Seeded random μGraphs for fuzzing the generator: a product and elementwise work per loop iteration, random
accumulators, an epilogue that mixes them, with odd sizes, several block sizes and both 16-bit dtypes."""
from __future__ import annotations

import numpy as np

from mugraph import ir

UNARY = ["exp", "tanh", "sigmoid", "silu", "relu", "__neg__", "square"]
BINARY = ["__add__", "__sub__", "__mul__", "maximum", "minimum"]
ACCS = ["acc_sum", "acc_sum_last", "acc_rms_last", "acc_max", "acc_max_last"]


def random_graph(seed: int):
    """(KernelGraph, input arrays) for ``seed``."""
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    dtype = pick(["float16", "bfloat16"])
    m, k, n = pick([8, 16, 24, 32, 48]), pick([16, 24, 32, 64]), pick([8, 16, 24, 40, 64])
    forloop, gx, threads = pick([1, 2, 3]), pick([1, 2]), pick([64, 128, 256])
    batch = pick([None, None, 2])
    lead = (batch,) if batch else ()
    X = ir.input("X", lead + (m, k * forloop), dtype)
    W = ir.input("W", lead + (k * forloop, n * gx), dtype)
    b = ir.BlockBuilder(grid=(gx, 1, 1), forloop=forloop, threads=threads)
    x = b.input(X, imap=None, fmap=len(lead) + 1)
    w = b.input(W, imap=(len(lead) + 1,), fmap=len(lead))
    p = x @ w
    loop_values = [p, getattr(p, pick(UNARY))() if rng.random() < 0.7 else p * 0.5,
                   (x * x + 1.0).log() if rng.random() < 0.5 else x.tanh()]
    if rng.random() < 0.5:
        loop_values.append(p - p.amax(len(lead) + 1))
    accs = []
    for v in loop_values:
        kind = pick(ACCS)
        if rng.random() < 0.3 and v.shape == p.shape:
            m_acc = v.acc_max_last()
            accs.append(((v - m_acc).exp()).acc_sum_rescale(m_acc) if rng.random() < 0.5 else
                        ((v - m_acc).exp()).acc_sum_last_rescale(m_acc))
        else:
            accs.append(getattr(v, kind)())
    full = [a for a in accs if a.shape == p.shape]
    rows = [a for a in accs if a.shape == p.shape[:-1] + (1,)]
    out = full[0] if full else accs[0]
    for a in full[1:] + rows:
        out = getattr(out, pick(BINARY))(a)
    if rng.random() < 0.5:
        out = getattr(out, pick(["sigmoid", "tanh", "relu"]))()
    omap = (len(lead) + 1,) if out.shape[-1] == n else (None,)
    if omap == (None,) and gx > 1:
        out = out + full[0] * 0.0 if full else out  # keep the grid's tiles apart
        omap = (len(lead) + 1,) if out.shape[-1] == n else (None,)
    outs = [(out, omap, "float32")]
    if rows and gx == 1:
        outs.append((rows[0], (None,), dtype))
    if gx > 1 and omap == (None,):
        return random_graph(seed + 1000)
    graph = ir.KernelGraph(b.finish(outs), [X, W])
    arrays = [(rng.standard_normal(X.shape) * 0.5).astype(X.dtype.numpy),
              (rng.standard_normal(W.shape) * 0.5).astype(W.dtype.numpy)]
    return graph, arrays
