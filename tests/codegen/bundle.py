"""Build many kernel graphs' generated kernels as one source (one g++ or NVRTC run instead of one per graph)."""
from __future__ import annotations

import re

import numpy as np

from mugraph.codegen import generate
from mugraph.codegen.cpu import build_cpu
from mugraph.codegen.generate import assemble_source
from mugraph.codegen.run_cpu import run_plan


def prefix_of(name: str) -> str:
    return re.sub(r"\W", "_", name) + "_k"


def generate_all(graphs: dict, arch: str = "sm_80") -> dict:
    """name -> GeneratedModule, kernels named after the graph's name."""
    return {name: generate(g, arch, prefix=prefix_of(name)) for name, g in graphs.items()}


def bundle_source(modules: dict, arch: str = "sm_80") -> str:
    return assemble_source([k for m in modules.values() for k in m.kernel_sources], arch)


def custom_names(modules: dict) -> list[str]:
    return [k.name for m in modules.values() for k in m.plan.kernels if k.kind == "custom"]


def build_bundle(modules: dict, defines=()):
    """One CPU module with every custom kernel of ``modules`` (None if there is none)."""
    names = custom_names(modules)
    arch = next(iter(modules.values())).arch if modules else "sm_80"
    return build_cpu(bundle_source(modules, arch), names, defines=list(defines)) if names else None


def max_rel_error(outs, refs) -> float:
    """max |out - ref| / max |ref| over all outputs (inf when an output holds NaN the reference lacks)."""
    worst = 0.0
    for o, r in zip(outs, refs):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if np.isnan(o).any() and not np.isnan(r).any():
            return float("inf")
        worst = max(worst, float(np.max(np.abs(o - r)) / max(np.max(np.abs(r)), 1e-30)))
    return worst


def run_bundled(module, cpu, arrays, **launch) -> list:
    return run_plan(module, cpu, arrays, **launch)
