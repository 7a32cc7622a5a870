"""The host memory one call may use, and what evaluating a graph takes against it.

The limit is `settings.memory_limit` (MUGRAPH_MEMORY_LIMIT; by default half the memory this
process can still take). Checks, sizing and reference runs that would go past it are cut down
(a sampled check, with the bound it states) or refused with a ResourceError that names the size
and the fix: never left to the OOM killer or to a raw MemoryError from NumPy.
"""
from __future__ import annotations

import math
import os
import resource

from mugraph.ir.errors import ResourceError

FALLBACK = 8 * 2**30      # what to assume where the system says nothing (no /proc, no sysconf)
FLOOR = 64 * 2**20        # always allowed: reading the limit costs ~0.3 ms, small work is common
UNLIMITED = 2**60         # cgroup v1 writes "no limit" as a number near 2^63


def available_bytes() -> int:
    """Memory this process can still take: the least of the system's available memory, the
    room left under its cgroup's limit and under its address-space limit (RLIMIT_AS)."""
    found = [b for b in (_system_available(), _cgroup_room(), _address_space_room()) if b is not None]
    return max(0, min(found)) if found else FALLBACK


def _system_available() -> int | None:
    kib = _field("/proc/meminfo", "MemAvailable:")
    if kib is not None:
        return kib * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_room() -> int | None:
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _number(limit), _number(usage)
        if cap is not None and cap < UNLIMITED:
            return cap - (used or 0)
    return None


def _address_space_room() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _field("/proc/self/status", "VmSize:")
    return soft - (used or 0) * 1024


def _field(path: str, name: str) -> int | None:
    """The number after `name` on its line of a /proc file (kB), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _number(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def limit() -> int:
    """The bytes one call may allocate for checks, sizing and reference runs (at least FLOOR)."""
    from mugraph.ir.settings import settings
    return max(FLOOR, settings.memory_limit)


# ---- what an evaluation takes --------------------------------------------------------------------
def graph_elements(graph) -> int:
    """Elements the reference interpreter holds to evaluate `graph` once: every kernel tensor,
    and each custom kernel's block values for all its blocks at once (as the interpreter runs
    them), plus room for the temporaries of the largest single op (twice its result)."""
    from mugraph.ir.ops import KOp
    total, largest, seen = 0, 0, set()
    for node in graph.nodes:
        size = math.prod(node.shape)
        total, largest = total + size, max(largest, size)
        if node.op is KOp.CUSTOM and (node.arg[0], node.srcs) not in seen:
            seen.add((node.arg[0], node.srcs))
            blocks = _block_elements(node.arg[0])
            total, largest = total + blocks, max(largest, blocks)
    return total + 2 * largest


def _block_elements(bg) -> int:
    return bg.num_blocks * sum(math.prod(n.shape) for n in bg.nodes)


def evaluation_bytes(graphs, itemsize: int) -> int:
    """Bytes to evaluate each of `graphs` once at `itemsize` bytes per element, all results kept."""
    return itemsize * sum(graph_elements(g) for g in graphs)


def fits(nbytes: int) -> bool:
    return nbytes <= FLOOR or nbytes <= limit()


def require(nbytes: int, what: str, fix: str) -> None:
    """A ResourceError naming `what`, its size and the limit when `nbytes` is above the limit."""
    if fits(nbytes):
        return
    cap = limit()
    if nbytes > cap:
        raise ResourceError(f"{what} needs about {gigabytes(nbytes)} of host memory, above "
                            f"mugraph's limit of {gigabytes(cap)}",
                            hint=f"{fix}, or raise the limit with MUGRAPH_MEMORY_LIMIT (e.g. "
                                 f"MUGRAPH_MEMORY_LIMIT=80%, or =64GB; the default is half the "
                                 f"memory available)")


def describe(graph) -> str:
    """"the program of x:f16[16384,16384], w:f16[16384,16384]", for messages."""
    inputs = ", ".join(f"{n.arg[0]}:{n.dtype.short}[{','.join(map(str, n.shape))}]"
                       for n in graph.inputs)
    return f"the program of {inputs}"


def gigabytes(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
