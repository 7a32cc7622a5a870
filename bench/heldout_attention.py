"""A held-out program, written as a user would (not one of the workloads the search was tuned
on): fp16 attention with 1/sqrt(d) and a max-subtracted softmax, batch 2, at prefill and decode
shapes. For each: whether the search fuses it, the speedup against the XLA-like baseline, the
verdict at the real shapes, and why every rejected structure was rejected (counts by reason).

    .venv/bin/python bench/heldout_attention.py [--states 30000] [--shapes 256x1024x64,16x4096x128]

A state budget (not a time budget) keeps the result independent of the machine's load: the
winner's structure is found after about 25k states at 256x1024x64 and 40k at 16x4096x128.
"""
from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp

from mugraph import ir
from mugraph.search import SearchConfig, search


def attention_of(d: int):
    def attention(q, k, v):
        s = (q @ jnp.swapaxes(k, -1, -2)) / math.sqrt(d)
        s = s - jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s)
        return (p / jnp.sum(p, axis=-1, keepdims=True)) @ v
    return attention


def run(queries: int, keys: int, d: int, states: int) -> None:
    shapes = [(2, queries, d), (2, keys, d), (2, keys, d)]
    spec = ir.from_jax(attention_of(d), *(jax.ShapeDtypeStruct(s, jnp.float16) for s in shapes),
                       input_names=["q", "k", "v"])
    start = time.perf_counter()
    result = search(spec, SearchConfig(budget_states=states, budget_seconds=1200),
                    progress=lambda *a: None)
    report = result.report
    fused = bool(result.best.custom_ops())
    verdict = getattr(report.verification, "verdict", "none needed (the spec)")
    print(f"attention q{list(shapes[0])} k/v{list(shapes[1])}: {time.perf_counter() - start:.0f} s, "
          f"{report.structures_found} found, {report.verified} verified, {report.rejected} rejected; "
          f"{'fused' if fused else 'NOT fused'}, {result.speedup:.2f}x the XLA-like baseline; "
          f"verdict at the real shapes: {verdict}")
    for where, why, count, example in report.rejections:
        print(f"  rejected at {where}: {count} {why}; e.g. {example}")
    for error in report.verifier_errors[:3]:
        print(f"  verifier error: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=30_000)
    parser.add_argument("--shapes", default="256x1024x64,16x4096x128",
                        help="queries x keys x head dim, comma-separated")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        queries, keys, d = (int(x) for x in shape.split("x"))
        run(queries, keys, d, args.states if d == 64 else max(args.states, 45_000))


if __name__ == "__main__":
    main()
