"""Programs of regions: a whole layer compiled as fused kernels for the regions the search wins
and JAX for the rest, run as one `jax.jit` program (DESIGN.md §8).

The pipeline, one line per step:

    trace once (search.flatten) -> classify each step (search.classify) -> schedule and cut into
    regions (search.partition) -> search each distinct region, in parallel, through the cache,
    cutting again the regions that find no fused kernel (search.regions.search_program) ->
    keep a region fused only where it beats jax.jit's estimate ->
    never slower as a whole (search.regions.never_slower) -> check the stitched program against
    jax.jit(fn) (mugraph.whole_check) -> a `Program`

`Program` keeps `Kernel`'s surface: `.report`, `.show()`, `.speedup`, `run_reference`,
`run_on_cpu`, `as_jax(backend)`; the functions take and return what `fn` does (pytrees).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from mugraph.ir.errors import InvalidInput, UnsupportedOp
from mugraph.stitch import Plan, as_jax_program, check_arguments, host_program


@dataclass(frozen=True)
class Prepared:
    """A traced, classified and cut program, before any search."""

    fn: object
    partition: object              # search.partition.Partition

    @property
    def program(self):
        return self.partition.program

    def single_region(self) -> bool:
        """Whether the whole program lifts and is at most one region (then it is one plain
        Kernel: an identity or a constant is one too)."""
        p = self.partition
        return not p.jax_steps() and len(p.regions) <= 1 and all(r.lifted for r in p.regions)

    def liftable(self) -> bool:
        return any(r.spec is not None for r in self.partition.regions)


def prepare(fn, example_args, limits=None, target: str = "h100") -> Prepared:
    """Trace `fn` once at `example_args` and cut it into regions (no search yet). Call it outside
    `jax.ensure_compile_time_eval()`: there a mask built inside `fn` would arrive folded."""
    from mugraph.search.flatten import flatten_program
    from mugraph.search.partition import partition
    program = flatten_program(fn, example_args)
    return Prepared(fn, partition(program, limits, target))


def no_region_error(prepared: Prepared) -> UnsupportedOp:
    """The one-line error of superoptimize on a program with nothing to lift."""
    c = prepared.partition.classification
    first = next(iter(c.reasons.values()), "it computes nothing")
    name = getattr(prepared.fn, "__name__", "the function")
    return UnsupportedOp(f"no part of {name} lifts into a region mugraph can search: {first}",
                         primitive="program",
                         hint="mugraph.jit runs such a program as JAX; superoptimize needs "
                              "float tensor math (matmuls, reductions, elementwise ops)")


def compile_program(prepared: Prepared, config, *, cache=None, executor=None,
                    progress=None) -> "Program":
    """Search the regions of `prepared` and build the Program (see the module docstring);
    `progress` is each region search's display (superoptimize's)."""
    from mugraph.search.regions import never_slower, search_program
    from mugraph.whole_check import check_whole
    partition, outcomes, rounds = search_program(prepared.partition, config, cache=cache,
                                                 executor=executor, progress=progress)
    prepared = Prepared(prepared.fn, partition)
    outcomes, estimates = never_slower(partition, outcomes, config.target)
    program = Program(prepared, outcomes, estimates, config, cache)
    program.rounds = rounds
    check = check_whole(program)
    if check.failed:
        program = program.all_jax(f"the stitched program disagreed with jax.jit(fn): "
                                  f"{check.text}")
        check = check_whole(program)
    program.check = check
    return program


class Program:
    """A compiled program of regions (see the module docstring)."""

    def __init__(self, prepared: Prepared, outcomes: list, estimates, config, store=None):
        self.prepared = prepared
        self.outcomes = list(outcomes)
        self.estimates = estimates
        self.config = config           # the SearchConfig the regions were searched under
        self.target = config.target
        self.check = None              # whole_check.WholeCheck, set by compile_program
        self.rounds = ()               # search.regions.Round per round of region searches
        self._store = store
        self._kernels: dict | None = None
        self._jax: dict = {}
        self._host: dict = {}

    # -- what it is --
    @property
    def fn(self):
        return self.prepared.fn

    @property
    def partition(self):
        return self.prepared.partition

    @property
    def regions(self) -> list:
        """An Outcome per region (fused or JAX, why, the numbers)."""
        return self.outcomes

    @property
    def fused(self) -> list:
        return [o for o in self.outcomes if o.fused]

    @property
    def plan(self) -> Plan:
        return Plan(self.partition, {o.region.index: o for o in self.fused})

    @property
    def kernels(self) -> dict:
        """region index -> the Kernel of each fused region."""
        if self._kernels is None:
            from mugraph.api import Kernel
            self._kernels = {}
            for o in self.fused:
                answer = o.answer
                self._kernels[o.region.index] = Kernel(
                    answer.result.best, o.region.spec, answer.result, self.target,
                    origin=answer.note, cache_key=answer.key, store=self._store)
        return self._kernels

    @property
    def speedup(self) -> float | None:
        """Estimated end-to-end speedup over the XLA-like baseline of the whole program."""
        return self.estimates.speedup

    @property
    def report(self):
        from mugraph.program_report import ProgramReport
        return ProgramReport(self)

    @property
    def cuda_source(self) -> str:
        """The generated CUDA of every distinct fused region, one after another."""
        seen, parts = set(), []
        for index, kernel in self.kernels.items():
            if kernel.graph not in seen:
                seen.add(kernel.graph)
                parts.append(f"// ---- region R{index} ----\n{kernel.cuda_source}")
        return "\n".join(parts)

    def all_jax(self, why: str) -> "Program":
        """This program with every region kept as JAX (`why` given for the fused ones)."""
        from mugraph.search.regions import Outcome, whole_estimates
        outcomes = [Outcome(o.region, False, why, o.answer, o.kernel_s, o.xla_s, o.same_as)
                    if o.fused else o for o in self.outcomes]
        est = whole_estimates(self.partition, outcomes, self.target)
        program = Program(self.prepared, outcomes, est, self.config, self._store)
        program.rounds = self.rounds
        return program

    # -- running it --
    def as_jax(self, backend: str = "auto"):
        """A JAX-traceable function of `fn`'s arguments returning `fn`'s results: the fused
        regions as their kernels' custom calls (`backend` as `Kernel.as_jax`), the rest as JAX
        ops, in one program; under `jax.grad` its backward is JAX's VJP of `fn`, under
        `jax.vmap` each fused region runs once per batch element. With nothing fused it is
        `jax.jit(fn)`."""
        from mugraph.jax_integration import resolve_backend
        backend = resolve_backend(backend)
        if backend not in self._jax:
            if not self.fused:
                self._jax[backend] = jax.jit(self.fn)
            else:
                fns = {i: k.as_jax(backend) for i, k in self.kernels.items()}
                self._jax[backend] = as_jax_program(self.plan, fns, self.fn)
        return self._jax[backend]

    def __call__(self, *args):
        """Run on the GPU (backend "cuda"); NoDevice where JAX sees none."""
        return self.as_jax("cuda")(*args)

    def run_reference(self, *args):
        """`fn`'s results with each fused region run by the reference interpreter (float64,
        rounded to the value's dtype at the region's edge) and the rest by JAX, anywhere."""
        from mugraph import ir
        return self._run("reference", args,
                         lambda o, ins: ir.interpret(self.kernels[o.region.index].graph, ins))

    def run_on_cpu(self, *args):
        """`fn`'s results with each fused region's generated CUDA run on the CPU harness."""
        from mugraph.codegen import run_on_cpu
        return self._run("cpu", args,
                         lambda o, ins: run_on_cpu(self.kernels[o.region.index].graph, ins))

    def _run(self, how: str, args, run_region):
        leaves = check_arguments(self.partition.program, args)
        if how not in self._host:       # one XLA compile per way of running the regions
            self._host[how] = host_program(self.plan, run_region)
        outs = self._host[how](*leaves)
        outs = [np.asarray(o) for o in outs]
        return jax.tree_util.tree_unflatten(self.partition.program.out_tree, outs)

    # -- pictures --
    def show(self, format: str = "text", path=None) -> str:
        """"text" (the regions, what became of each and why, the estimates, the whole check, each
        fused kernel's μGraph; printed), "svg" (the program: regions and JAX steps in order, each
        fused region with its kernel graph) or "html" (both). `path` also writes it."""
        if format not in ("text", "svg", "html"):
            raise InvalidInput(f"unknown picture format {format!r}", hint="text, svg or html")
        from mugraph.api import _write
        from mugraph.ir.picture import program_html, program_svg
        text = self.report.text(kernels=True)
        picture = {"text": lambda: text, "svg": lambda: program_svg(self.picture_rows()),
                   "html": lambda: program_html(self.picture_rows(), text)}[format]()
        if path is not None:
            _write(path, picture)
        if format == "text":
            print(text)
        return picture

    def picture_rows(self) -> list:
        from mugraph.program_report import picture_rows
        return picture_rows(self)

    def _repr_svg_(self) -> str:
        from mugraph.ir.picture import program_svg
        return program_svg(self.picture_rows())

    def __repr__(self) -> str:
        fused = len(self.fused)
        return (f"Program({getattr(self.fn, '__name__', 'fn')}: {len(self.outcomes)} regions, "
                f"{fused} fused, {len(self.partition.jax_steps())} JAX steps)")
