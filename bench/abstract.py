"""Abstract-expression benchmark: the search's pruning question and the formal check, timed.

For hand-built RMSNorm+matmul and attention (safe softmax, online-softmax kernel): a positive and
a negative `is_subexpression` (cold, memoised, and a negative sent on to Z3), and
`prove_equivalent`. Then every workload's spec against its reference, at full and small shapes
(proof time, cold caches), and how many of the reference's tensors and tiles pass the pruning
question. Then the formal check against mutants of every reference (small shapes): how many of
the non-equivalent ones it proves (must be 0), how many of those float64 cannot separate
(discarded by the generator as equivalent) it proves, and the proof time per mutant.

    .venv/bin/python bench/abstract.py [--no-workloads] [--no-mutants]
"""
from __future__ import annotations

import argparse
import statistics
import time

from mugraph import ir
from mugraph.ir.settings import settings
from mugraph.verify.abstract import (block_expressions, clear_caches, expressions,
                                     is_subexpression, prove_equivalent)
from mugraph.verify.abstract import expr as E
from mugraph.verify.abstract.query import output_expressions


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms"


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


# ---- the hand-built cases ----------------------------------------------------------------------------
def rmsnorm_case(m=16, k=4096, n=6144, tile=64, eps=1e-6):
    X, W = ir.input("X", (m, k)), ir.input("W", (k, n))
    spec = ir.KernelGraph([(X * ((X * X).sum(-1) / float(k) + eps).rsqrt()) @ W])
    b = ir.BlockBuilder(grid=(n // tile, 1, 1), forloop=k // tile)
    x, w = b.input(X, imap=None, fmap=1), b.input(W, imap=(1,), fmap=0)
    out = (x @ w).acc_sum() * (((x * x).acc_sum_last() / float(k)) + eps).rsqrt()
    fused = ir.KernelGraph(b.finish([(out, (1,))]), [X, W])
    vx, vw = E.var("X", (m, k)), E.var("W", (k, n))
    positive = E.reduce_sum(tile, vx * vw)                 # one iteration's tile of x @ w
    negatives = [E.reduce_sum(k, vx * vx * vw * E.const(c)) for c in range(2, 202)]
    return "rmsnorm+matmul", spec, fused, positive, negatives


def attention_case(sq=256, d=64, sk=4096, bq=64, bk=64):
    Q, K, V = ir.input("Q", (sq, d)), ir.input("K", (d, sk)), ir.input("V", (sk, d))
    s = Q @ K
    e = (s - s.amax(-1)).exp()
    spec = ir.KernelGraph([(e / e.sum(-1)) @ V])
    b = ir.BlockBuilder(grid=(sq // bq, 1, 1), forloop=sk // bk)
    q = b.input(Q, imap=(0,), fmap=None)
    k, v = b.input(K, imap=None, fmap=1), b.input(V, imap=None, fmap=0)
    st = q @ k
    m = st.acc_max_last()
    et = (st - m).exp()
    out = (et @ v).acc_sum_rescale(m) / et.acc_sum_last_rescale(m)
    fused = ir.KernelGraph(b.finish([(out, (0,))]), [Q, K, V])
    vq, vk, vv = E.var("Q", (sq, d)), E.var("K", (d, sk)), E.var("V", (sk, d))
    vs = E.reduce_sum(d, vq * vk)
    positive = E.reduce_sum(bk, E.exp(vs - E.reduce_max(sk, vs)) * vv)
    negatives = [E.exp(vq * vv * E.const(c)) for c in range(2, 202)]
    return "attention (online softmax)", spec, fused, positive, negatives


def bench_case(name, spec, fused, positive, negatives) -> None:
    clear_caches()
    outputs = output_expressions(spec)
    _, index = _timed(is_subexpression, E.const(1.0), outputs)      # builds the spec's index
    pos, t_pos = _timed(is_subexpression, positive, outputs)
    _, t_memo = _timed(is_subexpression, positive, outputs)
    neg_times = [_timed(is_subexpression, e, outputs)[1] for e in negatives]
    assert pos and not any(is_subexpression(e, outputs) for e in negatives)
    _, t_z3 = _timed(is_subexpression, negatives[0], outputs, z3_fallback=True)
    proof, t_prove = _timed(prove_equivalent, spec, fused)
    print(f"\n{name}")
    print(f"  spec index (once per spec)      {_ms(index)}")
    print(f"  positive query                  {_ms(t_pos)}   (memoised: {t_memo * 1e6:.1f} us)")
    print(f"  negative query, median of {len(neg_times)}   {_ms(statistics.median(neg_times))}"
          f"   (max {_ms(max(neg_times)).strip()})")
    print(f"  negative sent on to Z3          {_ms(t_z3)}   (rlimit {settings.z3_rlimit})")
    print(f"  prove_equivalent                {_ms(t_prove)}   proved={proof.proved} "
          f"({proof.method})")


# ---- the workload suite --------------------------------------------------------------------------------
def _tiles(graph) -> dict:
    exprs = expressions(graph)
    found = dict(exprs)
    for bg, srcs in graph.custom_ops():
        found.update(block_expressions(bg, [exprs[s] for s in srcs]))
    return found


def bench_workloads() -> None:
    try:
        from mugraph import workloads
    except ImportError:
        print("\n(mugraph.workloads is not available)")
        return
    print(f"\n{'workload':16s} {'shapes':6s} {'proved':7s} {'method':11s} {'prove':>11s}   "
          f"pruning (reference tensors+tiles outside the spec)")
    for name in workloads.names():
        for label, w in (("full", workloads.get(name)), ("small", workloads.get(name).small())):
            clear_caches()
            spec, ref = w.spec(), w.reference()
            proof, seconds = _timed(prove_equivalent, spec, ref)
            outputs = output_expressions(spec)
            tiles = _tiles(ref)
            outside = [n for n, e in tiles.items() if not is_subexpression(e, outputs)]
            ops = ", ".join(sorted({n.op.value for n in outside})) or "-"
            print(f"{name:16s} {label:6s} {str(proof.proved):7s} {proof.method:11s} {_ms(seconds)}"
                  f"   {len(outside)}/{len(tiles)} ({ops})")


# ---- the formal check against mutants --------------------------------------------------------------------
def _float_equivalent_mutants(graph, scale: float) -> list:
    """The one-change variants the mutant generator discards because float64 cannot separate them.

    Reads the generator's edit list (a private of `verify.mutate`); empty if it is not there.
    """
    from mugraph.ir.errors import InvalidGraph
    from mugraph.verify import mutate
    edits = getattr(mutate, "_kernel_edits", None)
    if edits is None:
        return []
    reference = [mutate._outputs(graph, s, scale) for s in (0, 1)]
    found = {}
    for _, _, make in edits(graph):
        try:
            g = make()
        except InvalidGraph:
            continue
        if g is not graph and mutate._interface(g) == mutate._interface(graph) and \
                mutate._equivalent(reference, g, 0, scale):
            found[g] = None
    return list(found)


def bench_mutants() -> None:
    from mugraph import workloads
    from mugraph.verify import generate_mutants
    print(f"\n{'workload':16s} {'mutants':>8s} {'proved':>7s} {'per mutant':>11s}   "
          f"float-equivalent variants proved")
    for name in workloads.names():
        w = workloads.get(name).small()
        reference = w.reference()
        found = generate_mutants(reference, seed=0, scale=w.input_scale).mutants
        clear_caches()
        proofs, seconds = _timed(lambda: [prove_equivalent(reference, m.graph) for m in found])
        same = _float_equivalent_mutants(reference, w.input_scale)
        same_proved = sum(prove_equivalent(reference, g).proved for g in same)
        print(f"{name:16s} {len(found):8d} {sum(p.proved for p in proofs):7d} "
              f"{_ms(seconds / max(1, len(found)))}   {same_proved}/{len(same)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-workloads", action="store_true")
    parser.add_argument("--no-mutants", action="store_true")
    args = parser.parse_args()
    for case in (rmsnorm_case(), attention_case()):
        bench_case(*case)
    if not args.no_workloads:
        bench_workloads()
    if not args.no_mutants:
        bench_mutants()


if __name__ == "__main__":
    main()
