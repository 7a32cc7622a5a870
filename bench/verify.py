"""Verifier benchmark: per workload at full shape, the time of each verification method and of the
search's subexpression queries; the mutation kill rate at small shapes.

    .venv/bin/python bench/verify.py [--workloads rmsnorm_linear,gqa] [--no-mutants] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
import time

from mugraph import workloads
from mugraph.verify import check, finite_field_test, float_diff, generate_mutants
from mugraph.verify.abstract import (clear_caches, expressions, is_subexpression,
                                     prove_equivalent)
from mugraph.verify.abstract import expr as E
from mugraph.verify.finite_field import clear_caches as clear_field_caches


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def subexpression_queries(spec) -> tuple[tuple[bool, float], tuple[bool, float]]:
    """A positive query (a spec intermediate) and a negative one (exp of a spec input)."""
    exprs = expressions(spec)
    outputs = [exprs[o] for o in spec.outputs]
    inner = next(n for n in reversed(spec.nodes) if n.srcs and n not in spec.outputs)
    clear_caches()
    positive = _timed(is_subexpression, exprs[inner], outputs)
    negative = _timed(is_subexpression, E.exp(exprs[spec.inputs[0]]), outputs)
    return positive, negative


def kill_rate(workload, seed: int) -> tuple[int, int, int, float]:
    """(killed, mutants, discarded as equivalent, seconds) at the workload's small shapes."""
    small = workload.small()
    reference = small.reference()
    start = time.perf_counter()
    found = generate_mutants(reference, seed=seed, scale=small.input_scale)
    killed = sum(not check(reference, m.graph, seed=seed, formal=False,
                           scale=small.input_scale).equivalent for m in found.mutants)
    return killed, len(found.mutants), found.equivalent, time.perf_counter() - start


def bench(name: str, seed: int, mutants: bool) -> list[str]:
    w = workloads.get(name)
    spec, reference = w.spec(), w.reference()
    ff, t_ff = _timed(finite_field_test, spec, reference, seed=seed)
    fl = float_diff(spec, reference, seed=seed, scale=w.input_scale)
    proof = prove_equivalent(spec, reference)
    (pos, t_pos), (neg, t_neg) = subexpression_queries(spec)
    clear_field_caches()  # time check() as a first call, not from the spec-output cache
    report = check(spec, reference, seed=seed, scale=w.input_scale)
    verdict = "EQUIVALENT" if report.equivalent else "REJECTED"
    lines = [f"{name} {dict(w.shapes)}: check -> {verdict} in {report.seconds:.2f}s",
             f"  finite field : {t_ff:7.2f}s  {ff.tests} tests, d = {ff.degree}, "
             f"bound 2^{ff.log2_bound:.1f}, {'passed' if ff.passed else 'FAILED'}",
             f"  float64      : {fl.mode('float64').seconds:7.2f}s  rel. error "
             f"{fl.mode('float64').worst.error:.2e}",
             f"  own dtype    : {fl.mode('own').seconds:7.2f}s  rel. error "
             f"{fl.mode('own').worst.error:.2e}",
             f"  formal       : {proof.seconds:7.2f}s  {'proved' if proof.proved else 'not proved'}"
             f" ({proof.method})",
             f"  is_subexpr + : {t_pos * 1e3:7.2f}ms -> {pos}",
             f"  is_subexpr - : {t_neg * 1e3:7.2f}ms -> {neg}"]
    if mutants:
        killed, total, equivalent, seconds = kill_rate(w, seed)
        rate = 100 * killed / max(total, 1)
        lines.append(f"  mutants      : {killed}/{total} killed ({rate:.0f}%), {equivalent} "
                     f"equivalent discarded, {seconds:.1f}s (small shapes)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-mutants", action="store_true")
    args = parser.parse_args(argv)
    for name in args.workloads.split(","):
        print("\n".join(bench(name.strip(), args.seed, not args.no_mutants)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
