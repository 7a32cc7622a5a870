"""The committed kernels' folders, rendered from kernel cases: per case ``graph.json``, ``kernel.cu`` (plus
``kernel.<arch>.cu`` where an arch's source differs) and ``report.md``; an index over them; and the check that the
committed files are exactly what the generator produces today. The workloads that make the cases are driven by
``mugraph.regen`` (nothing here imports the suite).

Only deterministic facts go into the files (launch plan, registers, shared memory, spills, HMMA count in the
SASS, the CPU-harness check); compile times vary from run to run, so they go to ``log`` only.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from mugraph import ir
from mugraph.codegen.compile import CompiledKernel, compile_cuda
from mugraph.ir.errors import CompileError
from mugraph.ir.settings import settings

ARCHS = ("sm_80", "sm_90")
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "kernels_generated"
CPU_TOLERANCE = 1e-2  # fp16 outputs: max error relative to the output's largest magnitude
_HMMA_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?HMMA\b", re.MULTILINE)
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class KernelCase:
    """One folder's worth: a graph, where it came from (``label``), the inputs it was made for, the CPU-harness
    check to run on its generated CUDA (a callable giving the verdict line) and extra report sections."""

    name: str
    description: str
    inputs: tuple          # (name, shape, DType) per graph input
    graph: object          # KernelGraph
    label: str
    cpu_check: Callable[[Callable[[str], None]], str]
    extra: tuple = ()      # markdown lines appended to the report
    kept: tuple = ()       # files of the folder that the case reads (name, text): written back unchanged


def regenerate_cases(root: str | Path | None, cases: dict, archs: Sequence[str] = ARCHS, check: bool = False,
                     *, whole_suite: bool, index_label: str = "", log: Callable[[str], None] | None = None
                     ) -> list[Path]:
    """Write (or with ``check`` list the stale files of) every case's folder under ``root``: ``cases`` maps a
    folder (relative to ``root``) to its KernelCase. The index is written only for the ``whole_suite``."""
    root = Path(root) if root is not None else DEFAULT_ROOT
    files: dict[Path, str] = {}
    summaries = []
    for folder, case in cases.items():
        texts, summary = render_case(case, tuple(archs), log or (lambda line: None))
        files |= {root / folder / file: text for file, text in texts.items()}
        summaries.append((folder, summary))
    if whole_suite:
        files[root / "README.md"] = render_index(summaries, tuple(archs), index_label)
    folders = [root / f for f in cases]
    return stale_files(files, root, folders, whole_suite=whole_suite) if check else write_files(files)


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


def render_case(case: KernelCase, archs: tuple, log) -> tuple[dict[str, str], "Summary"]:
    """The files of ``case``'s folder (name -> text) and its line in the index."""
    from mugraph.codegen import generate
    modules = {arch: generate(case.graph, arch=arch) for arch in archs}
    ident = re.sub(r"\W+", "_", case.name).strip("_") or "kernel"
    facts = {arch: compile_facts(ident, module, log) for arch, module in modules.items()}
    cpu_check = case.cpu_check(log)
    files = {"graph.json": ir.to_json(case.graph) + "\n", **kernel_files(modules), **dict(case.kept)}
    files["report.md"] = render_report(case, modules, facts, cpu_check, files)
    summary = Summary(case.name, case.description, len(modules[archs[0]].plan.kernels), facts, cpu_check)
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


def render_report(case: KernelCase, modules: dict, facts: dict, cpu_check: str, files: dict) -> str:
    inputs = ", ".join(_shape(n, s, d) for n, s, d in case.inputs)
    sources = [f"`{f}`" for f in files if f.endswith(".cu")]
    same = f" (the same for {', '.join(modules)})" if len(sources) == 1 and len(modules) > 1 else ""
    lines = [f"# {case.name}: {case.description}", "", f"Inputs: {inputs}. Graph: {case.label}, in `graph.json`.",
             f"Generated CUDA: {', '.join(sources)}{same}.", ""]
    plans = {arch: m.plan for arch, m in modules.items()}
    first = next(iter(plans))
    if all(p == plans[first] for p in plans.values()):
        lines += [f"## Launch plan ({', '.join(plans)})", "", *render_plan(plans[first]), ""]
    else:
        for arch, plan in plans.items():
            lines += [f"## Launch plan ({arch})", "", *render_plan(plan), ""]
    lines += ["## Resources", "", *render_resources(facts), ""]
    lines += ["## CPU harness", "", f"{cpu_check}.", "", *case.extra]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_index(summaries: list, archs: tuple, label: str) -> str:
    head = " / ".join(archs)
    lines = ["# Generated kernels", "", label, "",
             "Written by `mugraph regen` (`mugraph.regen.regenerate`); `tests/test_kernels_generated.py` "
             "fails when these files differ from what the generator produces today. Compile times vary from run "
             "to run and are printed by `mugraph regen`, not recorded here.", "",
             f"| kernel | what | launches | max registers ({head}) | spills ({head}) | HMMA ({head}) | "
             "CPU harness |", "|---|---|---|---|---|---|---|"]
    for folder, s in summaries:
        regs = " / ".join(str(max((k[0] for k in s.facts[a].kernels.values()), default=0)) for a in archs)
        spills = " / ".join(str(sum(k[2] for k in s.facts[a].kernels.values())) for a in archs)
        hmma = " / ".join(_total(s.facts[a].hmma) for a in archs)
        lines.append(f"| [{folder}]({folder}/report.md) | {s.description} | {s.launches} | {regs} | {spills} | "
                     f"{hmma} | {_verdict(s.cpu_check)} |")
    return "\n".join(lines) + "\n"


def _verdict(line: str) -> str:
    """pass, FAIL or not run: the verdict of a CPU-harness line."""
    return next((v for v in ("FAIL", "pass", "not run") if f": {v}" in line), "?")


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


def stale_files(files: dict[Path, str], root: Path, folders: list[Path], *, whole_suite: bool) -> list[Path]:
    """Files that differ from ``files``, are missing, or sit in a case folder the generator no longer fills."""
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    folders = list(folders)
    if whole_suite and root.is_dir():
        top = {f.relative_to(root).parts[0] for f in folders}
        folders += [d for d in root.iterdir() if d.is_dir() and d.name not in top and d.name != "__pycache__"]
    extra = [p for d in folders if d.is_dir() for p in d.iterdir() if p.is_file() and p not in files]
    return sorted(stale + extra)
