"""Regenerate the committed kernels, ``kernels_generated/<workload>/{graph.json, kernel.cu, report.md}`` and an
index, or check that the committed files are exactly what the generator produces today.

Only deterministic facts go into the files (launch plan, registers, shared memory, spills, HMMA count in the
SASS, the CPU-harness check at small shapes); compile times vary from run to run, so they go to ``log`` only.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from mugraph import ir
from mugraph.codegen.compile import CompiledKernel, compile_cuda
from mugraph.ir.errors import CompileError, MugraphError
from mugraph.ir.settings import settings

ARCHS = ("sm_80", "sm_90")
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "kernels_generated"
CPU_TOLERANCE = 1e-2  # fp16 outputs: max error relative to the output's largest magnitude
_HMMA_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?HMMA\b", re.MULTILINE)
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class GraphSource:
    """Where each workload's committed graph comes from: a label for the reports and a builder. ``build`` may
    return None for a shape it has no graph for (the small-shape CPU check is then skipped)."""

    label: str
    build: Callable  # Workload -> KernelGraph | None


REFERENCE = GraphSource("the hand-written fused μGraph (`Workload.reference()`)", lambda w: w.reference())


def regenerate(root: str | Path | None = None, workloads: Iterable[str] | None = None,
               archs: Sequence[str] = ARCHS, check: bool = False, *, source: GraphSource = REFERENCE,
               log: Callable[[str], None] | None = None) -> list[Path]:
    """Write every workload's folder (and, for the whole suite, the index) under ``root``; returns the files.

    ``root`` defaults to the repository's ``kernels_generated``. With ``check=True`` nothing is written and the
    result is the stale files: different, missing, or no longer produced.
    """
    from mugraph import workloads as suite
    root = Path(root) if root is not None else DEFAULT_ROOT
    names = list(workloads) if workloads is not None else suite.names()
    files: dict[Path, str] = {}
    summaries = []
    for name in names:
        folder, summary = render_workload(suite.get(name), tuple(archs), source, log or (lambda line: None))
        files |= {root / name / file: text for file, text in folder.items()}
        summaries.append(summary)
    if workloads is None:  # the index covers the whole suite, so only a full run writes it
        files[root / "README.md"] = render_index(summaries, tuple(archs), source)
    return stale_files(files, root, names, whole_suite=workloads is None) if check else write_files(files)


# ---- one workload --------------------------------------------------------------------------------------------------

@dataclass
class ArchFacts:
    """What the compiler says about one arch's build of a workload."""

    arch: str
    kernels: dict = field(default_factory=dict)  # entry name -> (registers, static smem, spills, stack)
    hmma: dict = field(default_factory=dict)     # entry name -> HMMA count, or None when SASS tools are missing
    toolchain: str = ""


@dataclass
class Summary:
    name: str
    description: str
    launches: int
    facts: dict   # arch -> ArchFacts
    cpu_check: str


def render_workload(w, archs: tuple, source: GraphSource, log) -> tuple[dict[str, str], Summary]:
    """The files of ``w``'s folder (name -> text) and its line in the index."""
    from mugraph.codegen import generate
    graph = source.build(w)
    modules = {arch: generate(graph, arch=arch) for arch in archs}
    facts = {arch: compile_facts(w.name, module, log) for arch, module in modules.items()}
    cpu_check = cpu_harness_check(w, source, log)
    files = {"graph.json": ir.to_json(graph) + "\n", **kernel_files(modules)}
    files["report.md"] = render_report(w, source, modules, facts, cpu_check, files)
    summary = Summary(w.name, w.description, len(modules[archs[0]].plan.kernels), facts, cpu_check)
    return files, summary


def kernel_files(modules: dict) -> dict[str, str]:
    """``kernel.cu`` for the first arch; ``kernel.<arch>.cu`` for each later arch whose source differs."""
    first, *later = modules
    files = {"kernel.cu": modules[first].source}
    files |= {f"kernel.{arch}.cu": modules[arch].source for arch in later
              if modules[arch].source != modules[first].source}
    return files


def compile_facts(name: str, module, log) -> ArchFacts:
    facts = ArchFacts(module.arch)
    if not any(k.kind == "custom" for k in module.plan.kernels):
        return facts
    start = time.perf_counter()
    compiled = compile_cuda(module.source, module.arch, name=name, cache_dir=Path(settings.cache_dir) / "nvrtc")
    log(f"{name} {module.arch}: compiled by {compiled.backend} in {time.perf_counter() - start:.2f}s")
    facts.toolchain = toolchain_name(compiled.backend)
    facts.kernels = {k: (r.registers, r.shared_bytes, r.spills, r.stack_bytes)
                     for k, r in sorted(compiled.kernels.items())}
    facts.hmma = hmma_counts(compiled)
    return facts


def toolchain_name(backend: str) -> str:
    """``NVRTC 13.0`` or nvcc's version line: register counts can change with it."""
    from mugraph.codegen.compile import _nvrtc_version, _toolchain_version
    if backend == "nvrtc":
        return "NVRTC {}.{}".format(*_nvrtc_version())
    return _toolchain_version(backend)


def hmma_counts(compiled: CompiledKernel) -> dict:
    """HMMA instructions per entry function in the SASS (cached on disk by CUBIN); None per entry without
    cuobjdump/nvdisasm."""
    path = Path(settings.cache_dir) / "sass" / f"{hashlib.sha256(compiled.cubin).hexdigest()[:32]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    try:
        sass = compiled.sass()
    except CompileError:
        return {k: None for k in compiled.kernels}
    parts = _FUNCTION.split(sass)  # [preamble, name, body, name, body, ...]
    counts = {name: len(_HMMA_LINE.findall(body)) for name, body in zip(parts[1::2], parts[2::2])}
    counts = {k: counts.get(k, 0) for k in sorted(compiled.kernels)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(counts))
    return counts


def cpu_harness_check(w, source: GraphSource, log) -> str:
    """The generated CUDA of the small-shape graph on the CPU harness against the spec in float64."""
    from mugraph.codegen import run_on_cpu
    small = w.small()
    graph = source.build(small)
    if graph is None:
        return "not run: no graph at the small shapes"
    arrays = small.random_inputs(seed=0)
    start = time.perf_counter()
    try:
        got = run_on_cpu(graph, arrays)
    except MugraphError as e:
        return f"FAIL: {type(e).__name__}: {str(e).splitlines()[0]}"
    log(f"{w.name}: CPU harness {time.perf_counter() - start:.2f}s")
    error = max_relative_error(got, ir.interpret(small.spec(), arrays))
    verdict = "pass" if error <= CPU_TOLERANCE else "FAIL"
    return f"{verdict}: max error {error:.1e} of the output scale (tolerance {CPU_TOLERANCE:.0e})"


def max_relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    worst = 0.0
    for g, r in zip(got, want, strict=True):
        r = np.asarray(r, np.float64)
        error = np.abs(np.asarray(g, np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30)
        worst = max(worst, float(error) if np.isfinite(error) else float("inf"))
    return worst


# ---- text ----------------------------------------------------------------------------------------------------------

def _dims(values) -> str:
    return "(" + ", ".join(str(v) for v in values) + ")"


def _shape(name: str, shape, dtype) -> str:
    return f"{name}{list(shape)} {dtype.short}"


def render_plan(plan) -> list[str]:
    lines = ["| # | launch | kind | grid | block | dynamic smem (bytes) | args |", "|---|---|---|---|---|---|---|"]
    for i, k in enumerate(plan.kernels):
        kind = k.kind if k.kind == "custom" else f"{k.kind} ({k.library_op.op.value})"
        lines.append(f"| {i} | `{k.name}` | {kind} | {_dims(k.grid)} | {_dims(k.block)} | {k.smem_bytes} | "
                     f"{', '.join(k.args)} |")
    lines += ["", "| buffer | shape | dtype | role |", "|---|---|---|---|"]
    lines += [f"| {b.name} | {_dims(b.shape)} | {b.dtype.short} | {b.role} |" for b in plan.buffers]
    return lines


def render_resources(facts: dict) -> list[str]:
    lines = ["| arch | kernel | registers | static smem (bytes) | spills (bytes) | stack (bytes) | HMMA in SASS |",
             "|---|---|---|---|---|---|---|"]
    for arch, f in facts.items():
        for kernel, (registers, smem, spills, stack) in f.kernels.items():
            hmma = f.hmma.get(kernel)
            lines.append(f"| {arch} | `{kernel}` | {registers} | {smem} | {spills} | {stack} | "
                         f"{'n/a (no cuobjdump)' if hmma is None else hmma} |")
    if len(lines) == 2:
        lines.append("| - | (no custom kernels) | | | | | |")
    toolchains = sorted({f.toolchain for f in facts.values() if f.toolchain})
    return lines + ["", f"Compiled with {', '.join(toolchains) or 'nothing (library launches only)'}."]


def render_report(w, source: GraphSource, modules: dict, facts: dict, cpu_check: str, files: dict) -> str:
    inputs = ", ".join(_shape(n, s, d) for n, s, d in w.inputs)
    small = ", ".join(_shape(n, s, d) for n, s, d in w.small().inputs)
    sources = [f"`{f}`" for f in files if f.endswith(".cu")]
    same = f" (the same for {', '.join(modules)})" if len(sources) == 1 and len(modules) > 1 else ""
    lines = [f"# {w.name}: {w.description}", "", f"Inputs: {inputs}. Graph: {source.label}, in `graph.json`.",
             f"Generated CUDA: {', '.join(sources)}{same}.", ""]
    plans = {arch: m.plan for arch, m in modules.items()}
    first = next(iter(plans))
    if all(p == plans[first] for p in plans.values()):
        lines += [f"## Launch plan ({', '.join(plans)})", "", *render_plan(plans[first]), ""]
    else:
        for arch, plan in plans.items():
            lines += [f"## Launch plan ({arch})", "", *render_plan(plan), ""]
    lines += ["## Resources", "", *render_resources(facts), ""]
    lines += ["## CPU harness", "", f"The generated CUDA at the small shapes ({small}), random inputs (seed 0), "
              f"against the spec in float64: {cpu_check}.", ""]
    return "\n".join(lines)


def render_index(summaries: list, archs: tuple, source: GraphSource) -> str:
    head = " / ".join(archs)
    lines = ["# Generated kernels", "",
             f"One folder per workload: its graph as `graph.json` (from {source.label}), its generated CUDA "
             "(`kernel.cu`, plus `kernel.<arch>.cu` where an arch's source differs) and `report.md` (launch plan, "
             "compiler resources, CPU-harness check).", "",
             "Written by `mugraph regen` (`mugraph.codegen.regen.regenerate`); `tests/test_kernels_generated.py` "
             "fails when these files differ from what the generator produces today. Compile times vary from run "
             "to run and are printed by `mugraph regen`, not recorded here.", "",
             f"| workload | what | launches | max registers ({head}) | spills ({head}) | HMMA ({head}) | "
             "CPU harness (small shapes) |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        regs = " / ".join(str(max((k[0] for k in s.facts[a].kernels.values()), default=0)) for a in archs)
        spills = " / ".join(str(sum(k[2] for k in s.facts[a].kernels.values())) for a in archs)
        hmma = " / ".join(_total(s.facts[a].hmma) for a in archs)
        lines.append(f"| [{s.name}]({s.name}/report.md) | {s.description} | {s.launches} | {regs} | {spills} | "
                     f"{hmma} | {s.cpu_check.split(':')[0]} |")
    return "\n".join(lines) + "\n"


def _total(counts: dict) -> str:
    values = list(counts.values())
    return "n/a" if any(v is None for v in values) else str(sum(values))


# ---- writing and checking ------------------------------------------------------------------------------------------

def write_files(files: dict[Path, str]) -> list[Path]:
    """Write each file whose text changed; returns every file of the set, sorted."""
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8", newline="\n")
    return sorted(files)


def stale_files(files: dict[Path, str], root: Path, names: list[str], *, whole_suite: bool) -> list[Path]:
    """Files that differ from ``files``, are missing, or sit in a workload folder the generator no longer fills."""
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    folders = [root / n for n in names]
    if whole_suite and root.is_dir():
        folders += [d for d in root.iterdir() if d.is_dir() and d.name not in names and d.name != "__pycache__"]
    extra = [p for d in folders if d.is_dir() for p in d.iterdir() if p.is_file() and p not in files]
    return sorted(stale + extra)
