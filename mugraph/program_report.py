"""What a compiled program of regions says about itself: each region and what became of it (fused
or kept as JAX, and why), the steps only JAX runs (and why), the end-to-end estimates with their
baselines named, how the budget was split, and the verdict for the whole."""
from __future__ import annotations

from mugraph.ir.picture import ProgramRow
from mugraph.search.classify import Kind
from mugraph.search.partition import describe_region


class ProgramReport:
    """The report of a `mugraph.program.Program` (str() is its text)."""

    def __init__(self, program):
        self.program = program

    # -- numbers --
    @property
    def equations(self) -> tuple[int, int, int]:
        """(lifted, JAX, constant-only) steps of the traced program."""
        kinds = self.program.partition.classification.kinds
        return (sum(k is Kind.LIFT for k in kinds), sum(k is Kind.JAX for k in kinds),
                sum(k is Kind.CONST for k in kinds))

    @property
    def lifted_fraction(self) -> float:
        lifted, jax_steps, _ = self.equations
        return lifted / (lifted + jax_steps) if lifted + jax_steps else 0.0

    @property
    def kept_as_jax(self) -> list[tuple[int, str]]:
        """(region index, why) of every region that stays JAX."""
        return [(o.region.index, o.reason) for o in self.program.outcomes if not o.fused]

    @property
    def jax_steps(self) -> list[tuple[str, str]]:
        """(primitive, why) of every step only JAX runs."""
        c = self.program.partition.classification
        return [(s.primitive, c.reasons.get(s.index, "")) for s in
                self.program.partition.jax_steps()]

    @property
    def searched(self) -> int:
        """Distinct region specs searched (identical regions share one search)."""
        return len({o.region.spec for o in self.program.outcomes if o.answer is not None})

    # -- text --
    def text(self, kernels: bool = False) -> str:
        p = self.program
        lines = [self._headline(), ""]
        lines += _rows(p)
        lines += ["", self._estimate_line(), self._search_line(),
                  f"whole-program check: {p.check}" if p.check is not None else ""]
        if kernels:
            for index, kernel in p.kernels.items():
                if p.outcomes[index].same_as is None:
                    lines += ["", f"---- R{index}: fused kernel ----", str(kernel.graph)]
        return "\n".join(line for line in lines if line is not None)

    def _headline(self) -> str:
        p = self.program
        lifted, jax_steps, const = self.equations
        fused = len(p.fused)
        name = getattr(p.fn, "__name__", "fn")
        return (f"program of regions {name}: {len(p.outcomes)} regions ({fused} fused, "
                f"{len(p.outcomes) - fused} kept as JAX), {len(p.partition.jax_steps())} steps "
                f"only JAX runs; {lifted} of {lifted + jax_steps} equations lifted "
                f"({100 * self.lifted_fraction:.0f}%; {const} constant-only besides)")

    def _estimate_line(self) -> str:
        e, target = self.program.estimates, self.program.target
        if e.stitched is None or e.baseline is None:
            return f"estimated end to end on {target}: not available ({e.note})"
        unfused = f"; {e.speedup_vs_unfused:.2f}x against the unfused program " \
                  f"({e.unfused * 1e6:.2f} us, one launch per op)" if e.speedup_vs_unfused else ""
        return (f"estimated end to end on {target}: {e.stitched * 1e6:.2f} us against the "
                f"XLA-like baseline of the whole program {e.baseline * 1e6:.2f} us (what jax.jit "
                f"would launch, fusing across the regions' edges; both sides charged the launches jax.jit "
                f"pays: from C++, command buffers for runs of {_runs(target)}+ kernels): "
                f"{e.speedup:.2f}x{unfused}; "
                f"steps only JAX runs are charged {e.jax_only * 1e6:.2f} us on both sides"
                + (f"; no stitched program can be estimated above {e.ceiling:.2f}x (the lifted "
                   f"program's roofline, {(e.floor - e.jax_only) * 1e6:.2f} us, plus those steps)"
                   if e.ceiling else ""))

    def _search_line(self) -> str:
        p = self.program
        if not p.rounds:
            return "search: no region was searched"
        shared = sum(o.same_as is not None for o in p.outcomes)
        rounds = "; ".join(f"round {k + 1}: {r.searched} searched, {r.seconds_each:.1f} s each on average"
                           + (f", {r.split} regions that found no fused kernel cut again"
                              if r.split else "")
                           for k, r in enumerate(p.rounds))
        workers = min(p.config.workers, max(r.searched for r in p.rounds) or 1)
        return (f"search (budget {p.config.budget_seconds:g} s, {workers} at a time, shared among "
                f"regions by their ops; identical regions share one search, {shared} shared here; "
                f"regions of one op are not searched): {rounds}")

    def __str__(self) -> str:
        return self.text()


def _runs(target) -> int:
    from mugraph.search.targets import get_target
    return get_target(target).command_buffer_min_kernels


def _rows(p) -> list[str]:
    lines = []
    for row in _grouped(p):
        if row[0] == "jax":
            steps = row[1]
            c = p.partition.classification
            reasons = list(dict.fromkeys(c.reasons.get(s.index, "") for s in steps))
            prims = list(dict.fromkeys(s.primitive for s in steps))
            lines.append(f"  JAX  {len(steps)} steps ({', '.join(prims)}): {'; '.join(reasons)}")
            continue
        o = p.outcomes[row[1]]
        lines.append(f"  R{o.region.index:<3} {_status(o)}  [{_shape(p, o)}] {_detail(o)}")
    return lines


def _status(o) -> str:
    return "fused" if o.fused else "JAX  "


def _shape(p, o) -> str:
    r = o.region
    what = describe_region(r)
    if r.spec is None:
        return what
    return f"{what}; {r.matmuls} matmuls, {r.ops} ops, {len(r.inputs)} in, {len(r.outputs)} out"


def _detail(o) -> str:
    timing = ""
    if o.kernel_s is not None and o.xla_s:
        best = "kernel" if o.fused else "best candidate"
        timing = f"{best} {o.kernel_s * 1e6:.2f} us vs jax.jit {o.xla_s * 1e6:.2f} us; "
    shared = f"same structure as R{o.same_as} (searched once); " if o.same_as is not None else ""
    where = "" if o.answer is None or isinstance(o.answer, str) else o.answer.note
    why = o.reason if not o.fused else ""
    parts = [x for x in (timing + shared + (why or where)).split("\n") if x]
    return " ".join(parts)


def _grouped(p) -> list:
    """("region", index) and ("jax", [steps]) rows in run order, consecutive JAX steps together."""
    rows = []
    for kind, x in p.partition.items:
        if kind == "jax":
            if rows and rows[-1][0] == "jax":
                rows[-1][1].append(x)
            else:
                rows.append(("jax", [x]))
        else:
            rows.append(("region", x))
    return rows


def picture_rows(p) -> list[ProgramRow]:
    """The program for `ir.picture.program_svg`: one row per region or stretch of JAX steps."""
    made, rows = {}, []
    for k, row in enumerate(_grouped(p)):
        key = f"row{k}"
        if row[0] == "jax":
            steps = row[1]
            prims = ", ".join(dict.fromkeys(s.primitive for s in steps))
            lines = [f"JAX: {len(steps)} steps", prims[:80]]
            reads = {made[v] for s in steps for v in s.value_ins() if v in made}
            outs = [v for s in steps for v in s.outs]
            rows.append(ProgramRow(key, "jax", tuple(lines), None, tuple(sorted(reads))))
        else:
            o = p.outcomes[row[1]]
            r = o.region
            head = f"R{r.index} fused" if o.fused else f"R{r.index} kept as JAX"
            lines = [head, describe_region(r)[:80]]
            if not o.fused:
                lines.append(o.reason[:100])
            graph = p.kernels[r.index].graph if o.fused else None
            reads = {made[v] for s in r.steps for v in s.value_ins() if v in made}
            outs = [v for s in r.steps for v in s.outs]
            rows.append(ProgramRow(key, "custom" if o.fused else "jax", tuple(lines), graph,
                                   tuple(sorted(reads))))
        made.update((v, key) for v in outs)
    return rows
