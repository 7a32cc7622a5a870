"""`mugraph bench models`: every layer of the model suite (`mugraph.models`) compiled as a
program of regions, with what limits it.

Per layer: equations lifted (of those that are not constant-only), regions, fused regions,
regions kept as JAX and why, steps only JAX runs, the estimated end-to-end time of the stitched
program against the XLA-like baseline of the whole program (`search.baseline`, at its launch
cost) and against the unfused program, the ceiling (the baseline over the lifted program's
roofline plus the JAX-only steps: no stitched program is estimated faster), the verdict of the whole-program check, the cold compile
time (a fresh cache folder unless --cache is given) and the warm one (the same call again: every
region from the cache, re-verified). `--stack N` also compiles N identical layers in sequence
(each with its own parameters; a decode step also with its own KV caches) after the single
layer, with the same cache.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass


@dataclass
class Row:
    layer: str
    dims: str
    lifted: str = ""
    regions: int = 0
    fused: int = 0
    kept_jax: int = 0
    jax_steps: int = 0
    stitched_us: float | None = None
    xla_us: float | None = None
    speedup: float | None = None
    ceiling: float | None = None
    vs_unfused: float | None = None
    check: str = ""
    cold_s: float | None = None
    warm_s: float | None = None
    stack: str = ""
    why_jax: str = ""
    error: str = ""


def measure(layer, dims: str, config, cache_dir: str, stack: int = 0) -> Row:
    """Compile one layer cold then warm (and a stack of it), and read its report."""
    import mugraph
    from mugraph.ir.errors import MugraphError
    inst = layer.at(dims)
    row = Row(layer.name, dims)
    try:
        started = time.perf_counter()
        program = mugraph.superoptimize(inst.fn, *inst.example_args, config=config,
                                        cache=cache_dir, progress=False)
        row.cold_s = time.perf_counter() - started
        started = time.perf_counter()
        mugraph.superoptimize(inst.fn, *inst.example_args, config=config, cache=cache_dir,
                              progress=False)
        row.warm_s = time.perf_counter() - started
        if stack > 1:
            many = stack_layers(inst, stack)
            started = time.perf_counter()
            mugraph.superoptimize(many.fn, *many.example_args, config=config, cache=cache_dir,
                                  progress=False)
            row.stack = f"{stack} layers: {time.perf_counter() - started:.1f} s"
    except MugraphError as e:
        row.error = f"{type(e).__name__}: {e.message.splitlines()[0]}"
        return row
    _fill(row, program)
    return row


def stack_layers(inst, layers: int):
    """`layers` copies of `inst` in sequence, each with its own parameters: `models.stack` for a
    layer of one activation; for a layer that also returns state (a decode step returns its
    updated K/V caches, arguments 2, 3, ... of the same types), each copy gets its own state and
    the stack returns the last activation and every copy's state."""
    import jax
    from dataclasses import replace
    from mugraph.models import stack
    out = jax.eval_shape(inst.fn, *inst.example_args)
    if not isinstance(out, tuple):
        return stack(inst, layers)
    states = len(out) - 1
    fn = inst.fn

    def stacked(params_list, x, state_list, *rest):
        new = []
        for params, state in zip(params_list, state_list):
            x, *updated = fn(params, x, *state, *rest)
            new.append(tuple(updated))
        return x, new

    ex = inst.example_args
    example = ([ex[0]] * layers, ex[1], [tuple(ex[2:2 + states])] * layers, *ex[2 + states:])
    return replace(inst, name=f"{inst.name}_x{layers}", fn=stacked, example_args=example)


def _fill(row: Row, program) -> None:
    from mugraph.api import Kernel
    if isinstance(program, Kernel):    # the layer lifted whole as one region
        row.lifted, row.regions, row.fused = "100%", 1, int(bool(program.graph.custom_ops()))
        row.speedup = program.speedup
        row.stitched_us = program.result.best_candidate.seconds * 1e6
        row.xla_us = program.result.xla_estimate.seconds * 1e6
        row.vs_unfused = program.result.speedup_vs_unfused
        bound = program.result.report.roofline
        if bound is not None and bound.seconds:
            row.ceiling = program.result.xla_estimate.seconds / bound.seconds
        row.check = "EQUIVALENT" if program.report.verification.equivalent else "?"
        return
    report = program.report
    lifted, jax_steps, _ = report.equations
    row.lifted = f"{lifted}/{lifted + jax_steps} ({100 * report.lifted_fraction:.0f}%)"
    row.regions, row.fused = len(program.outcomes), len(program.fused)
    row.kept_jax = len(report.kept_as_jax)
    row.jax_steps = len(program.partition.jax_steps())
    e = program.estimates
    row.stitched_us = None if e.stitched is None else e.stitched * 1e6
    row.xla_us = None if e.baseline is None else e.baseline * 1e6
    row.speedup, row.vs_unfused = e.speedup, e.speedup_vs_unfused
    row.ceiling = e.ceiling
    row.check = program.check.status if program.check is not None else ""
    reasons: dict = {}
    for _, why in report.kept_as_jax:
        key = why.split("(")[0].strip()
        reasons[key] = reasons.get(key, 0) + 1
    row.why_jax = "; ".join(f"{n}x {k}" for k, n in reasons.items())


COLUMNS = [("layer", 18, "{}"), ("dims", 5, "{}"), ("lifted", 13, "{}"), ("regions", 7, "{}"),
           ("fused", 5, "{}"), ("kept_jax", 8, "{}"), ("jax_steps", 9, "{}"),
           ("stitched_us", 11, "{:.2f}"), ("xla_us", 9, "{:.2f}"), ("speedup", 7, "{:.2f}x"),
           ("ceiling", 7, "{:.2f}x"),
           ("vs_unfused", 10, "{:.2f}x"), ("check", 14, "{}"), ("cold_s", 7, "{:.1f}"),
           ("warm_s", 7, "{:.1f}")]


def table(rows: list[Row]) -> str:
    return "\n".join([*_head()] + [line for r in rows for line in _row_lines(r)])


def _head() -> list[str]:
    head = " ".join(f"{name:>{w}}" for name, w, _ in COLUMNS)
    return [head, "-" * len(head)]


def _row_lines(r: Row) -> list[str]:
    cells = []
    for name, w, fmt in COLUMNS:
        value = getattr(r, name)
        cells.append(f"{'-' if value in (None, '') else fmt.format(value):>{w}}")
    extras = (r.error, r.why_jax and f"kept as JAX: {r.why_jax}", r.stack)
    return [" ".join(cells)] + [f"    {r.layer}: {x}" for x in extras if x]


def main(argv=None) -> int:
    from mugraph import models
    from mugraph.ir.errors import InvalidInput
    from mugraph.search.config import SearchConfig
    parser = argparse.ArgumentParser(prog="mugraph bench models", description=__doc__)
    parser.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    parser.add_argument("--dims", choices=("small", "full"), default="small")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="search seconds per layer, split among its regions (default 120)")
    parser.add_argument("--workers", type=int, default=1, help="regions searched at a time")
    parser.add_argument("--stack", type=int, default=0,
                        help="also compile a stack of N identical layers (e.g. 32)")
    parser.add_argument("--cache", default=None, help="result cache folder (default: a fresh one)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    config = SearchConfig(budget_seconds=args.budget, workers=args.workers)
    names = args.layers.split(",") if args.layers else models.names()
    unknown = [n for n in names if n not in models.names()]
    if unknown:
        raise InvalidInput(f"unknown layers {unknown} in --layers",
                           hint=f"one of {', '.join(models.names())}")
    cache = args.cache or tempfile.mkdtemp(prefix="mugraph-bench-models-")
    rows = []
    print("\n".join(_head()), flush=True)
    for name in names:
        layer = models.get(name)
        if not layer.available():
            rows.append(Row(name, args.dims, error=f"needs the {layer.extra} package"))
            continue
        rows.append(measure(layer, args.dims, config, cache, args.stack))
        print("\n".join(_row_lines(rows[-1])), flush=True)
    print()
    print(f"mugraph bench models --dims {args.dims} --budget {args.budget:g} "
          f"(estimates on {config.target}; cache {cache})")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0
