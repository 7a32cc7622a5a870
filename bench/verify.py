"""Verifier benchmark: per workload at full shape, `check` of the hand-written kernel against the
spec — the time of each method, the finite-field bound and what it is made of, the special-value
cases the float test tried — then `check` with sampled finite-field tiles, the search's
subexpression queries, and every method's kill rate on mutants at the workload's small shapes.
The aim is `check` at full shape in at most 1 s per workload; each line says whether it is met.
Times are wall-clock; the CPU time of this process is printed beside `check`'s, since on a shared
machine the difference is time spent waiting for a core (the load average is printed first).

    .venv/bin/python bench/verify.py [--workloads rmsnorm_linear,gqa] [--no-mutants] [--seed 0]
                                     [--sample-blocks 2] [--mutants 40]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

from mugraph import workloads
from mugraph.verify import check, generate_mutants
from mugraph.verify.abstract import clear_caches, expressions, is_subexpression
from mugraph.verify.abstract import expr as E
from mugraph.verify.finite_field import clear_caches as clear_field_caches
from mugraph.verify.float_diff import clear_cache as clear_float_cache
from mugraph.verify.mutate import kill_rates

AIM_SECONDS = 1.0


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def _power(x: float) -> str:
    return f"2^{math.log2(x):.1f}" if x > 0 else "0"


def subexpression_queries(spec) -> tuple[tuple[bool, float], tuple[bool, float]]:
    """A positive query (a spec intermediate) and a negative one (exp of a spec input)."""
    exprs = expressions(spec)
    outputs = [exprs[o] for o in spec.outputs]
    inner = next(n for n in reversed(spec.nodes) if n.srcs and n not in spec.outputs)
    clear_caches()
    positive = _timed(is_subexpression, exprs[inner], outputs)
    negative = _timed(is_subexpression, E.exp(exprs[spec.inputs[0]]), outputs)
    return positive, negative


def field_lines(ff, label: str) -> list[str]:
    if ff is None:
        return [f"  {label:14}: could not run"]
    state = "passed" if ff.passed else "FAILED"
    if ff.passed and not ff.established:
        state = "passed, NOT ESTABLISHED"
    parts = dict(ff.terms)
    zero = parts.pop("zero divisors", 0.0)
    terms = " + ".join(f"{k} {v:.2g}" for k, v in parts.items() if v)
    terms += f", / (1 - {zero:.2g} zero-divisor draws)" if zero else ""
    lines = [f"  {label:14}: {ff.seconds:7.2f}s  {state}; {ff.tests} tests, bound "
             f"{_power(ff.error_bound)} (per test <= {ff.per_test:.3g}: {terms})"]
    if ff.sampled:
        lines.append(f"  {'':14}  sampled: {ff.sampled}")
    return lines


def float_lines(fl) -> list[str]:
    lines = []
    for mode, label in (("float64", "float64"), ("own", "own precision")):
        ran = [m for m in fl.modes if m.mode == mode]
        state = "ok" if all(m.passed for m in ran) else "FAILED"
        against = f" against {fl.reference}" if mode == "own" else ""
        lines.append(f"  {label:14}: {sum(m.seconds for m in ran):7.2f}s  {state}{against} "
                     f"over {len(ran)} cases")
    cases = [c for c in fl.cases if c.case != "random"]
    tried = ", ".join(f"{c.case} ({min(m.compared for m in c.modes)} compared)"
                      for c in cases if c.ran) or "none"
    not_run = "; ".join(f"{c.case}: {c.not_run}" for c in cases if c.not_run)
    lines.append(f"  {'special values':14}: ran {tried}" + (f" (not run: {not_run})" if not_run
                                                              else ""))
    return lines


def bench_check(name: str, seed: int, sample_blocks: int) -> list[str]:
    w = workloads.get(name)
    spec, reference = w.spec(), w.reference()
    clear_field_caches()  # time check() as a first call, not from the spec-output cache
    clear_float_cache()
    cpu = time.process_time()
    report = check(spec, reference, seed=seed, scale=w.input_scale)
    cpu = time.process_time() - cpu
    clear_field_caches()
    sampled = check(spec, reference, seed=seed, scale=w.input_scale, sample_blocks=sample_blocks)
    (pos, t_pos), (neg, t_neg) = subexpression_queries(spec)
    lines = [f"{name} {dict(w.shapes)}",
             f"  check         : {report.seconds:7.2f}s  {report.verdict}  "
             f"[aim {AIM_SECONDS:g}s: {_aim(report.seconds)}; {cpu:.2f}s CPU]"]
    lines += field_lines(report.finite_field, "finite field")
    lines += float_lines(report.float)
    formal = report.formal
    lines.append(f"  {'formal':14}: {formal.seconds if formal else 0:7.2f}s  "
                 f"{report.formal_status}" + (f" ({formal.method})" if formal else ""))
    lines.append(f"  check, sampled: {sampled.seconds:7.2f}s  {sampled.verdict}  "
                 f"[aim {AIM_SECONDS:g}s: {_aim(sampled.seconds)}]")
    lines += field_lines(sampled.finite_field, "finite field")
    lines.append(f"  is_subexpr +  : {t_pos * 1e3:7.2f}ms -> {pos}")
    lines.append(f"  is_subexpr -  : {t_neg * 1e3:7.2f}ms -> {neg}")
    return lines


def _aim(seconds: float) -> str:
    return "met" if seconds <= AIM_SECONDS else f"MISSED by {seconds - AIM_SECONDS:.2f}s"


def bench_mutants(name: str, seed: int, limit: int) -> list[str]:
    """Every method's kill rate on mutants the oracle separates (small shapes)."""
    small = workloads.get(name).small()
    reference = small.reference()
    start = time.perf_counter()
    found = generate_mutants(reference, seed=seed, limit=limit, scale=small.input_scale)
    rates = kill_rates(reference, found.mutants, seed=seed, scale=small.input_scale)
    rates_text = "; ".join(rates.line(m) for m in rates.killed)
    return [f"  mutants       : {len(found.mutants)} separated by the oracle ({found.equivalent} "
            f"equivalent, {found.undecided} undecided, {found.invalid} invalid discarded), "
            f"{time.perf_counter() - start:.1f}s at {dict(small.shapes)}",
            f"  killed alone  : {rates_text}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(workloads.names()))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-blocks", type=int, default=2)
    parser.add_argument("--mutants", type=int, default=40, help="mutants per workload")
    parser.add_argument("--no-mutants", action="store_true")
    args = parser.parse_args(argv)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)
    for name in args.workloads.split(","):
        lines = bench_check(name.strip(), args.seed, args.sample_blocks)
        if not args.no_mutants:
            lines += bench_mutants(name.strip(), args.seed, args.mutants)
        print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
