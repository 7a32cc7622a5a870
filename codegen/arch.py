"""Per-architecture data for the code generator: the limits a kernel must fit and the few knobs that differ.

sm_80 and sm_90 run the same generated logic (cp.async, ldmatrix, mma.sync); only these numbers change.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from mugraph.codegen.compile import TARGETS
from mugraph.ir.errors import InvalidInput

DEFAULT_DYNAMIC_SMEM = 48 * 1024  # above this a launcher must raise the kernel's max-dynamic-smem attribute


@dataclass(frozen=True)
class ArchSpec:
    """What the generator needs to know about one target architecture."""

    name: str
    smem_limit: int          # dynamic shared memory one block may opt in to (bytes)
    max_threads: int         # threads per block
    max_stages: int          # buffers per loop-walked input tile, at most (cp.async pipeline depth)
    stage_budget: int        # deeper than 2 stages only while the kernel's shared memory stays below this
    smem_align: int = 128    # every shared buffer starts on a 128-byte line (swizzles assume it)
    fp32_matmul: str = "bf16x3"  # fp32 x fp32 block matmuls: "bf16x3" (tensor cores) or "simt" (exact fp32)


# With one block per SM (the fused kernels' grids are about one wave), the bytes a block keeps in flight set its
# share of HBM bandwidth: Hopper's larger shared memory affords a deeper pipeline. The budgets keep two or more
# blocks per SM possible (A100: 164 KiB per SM, H100: 228 KiB). Two stages always remain (the search's cost
# model assumes two), so a deeper pipeline never makes a candidate fail.
_PIPELINE = {"sm_80": (3, 80 * 1024), "sm_90": (4, 112 * 1024), "sm_90a": (4, 112 * 1024)}

ARCHS: Mapping[str, ArchSpec] = MappingProxyType({
    name: ArchSpec(name, smem_limit=t.max_smem_per_block, max_threads=t.max_threads_per_block,
                   max_stages=_PIPELINE.get(name, (2, 0))[0], stage_budget=_PIPELINE.get(name, (2, 0))[1])
    for name, t in TARGETS.items()
})


def get_arch(arch) -> ArchSpec:
    """The spec of ``arch`` (a name, or an ArchSpec, e.g. a variant made with dataclasses.replace)."""
    if isinstance(arch, ArchSpec):
        return arch
    spec = ARCHS.get(arch)
    if spec is None:
        raise InvalidInput(f"unsupported arch {arch!r}", hint=f"one of: {', '.join(ARCHS)}")
    return spec
