"""What the launchers build for the GPU present: the generator's code path for its compute capability (sm_80's for
8.x, sm_90a's TMA + wgmma for 9.0, the cp.async + mma.sync code for newer majors, whose tensor-core instructions
Hopper's wgmma is not), the arch its CUBIN is built for (the generator's where that CUBIN runs on the device, else
the device's own, built by NVRTC; the driver's PTX JIT where NVRTC cannot), and the shared memory a block may use.
Both launchers (CuPy, ``codegen.runtime_cupy``; XLA FFI, ``mugraph.jax_ffi``) take these decisions from here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from mugraph.codegen.compile import SMEM_OPTIN_KB, TARGETS, UNLISTED_SMEM_KB, capability_of, supported_archs
from mugraph.ir.errors import InvalidInput, NoDevice, ResourceError

MIN_CAPABILITY = (8, 0)  # cp.async, bf16 mma.sync


@dataclass(frozen=True)
class DeviceArch:
    """One GPU's build decisions. ``codegen``: the generator's arch (an ArchSpec name); ``binary``: the arch NVRTC
    builds the CUBIN for; ``jit``: NVRTC cannot build for this GPU, so the launcher loads ``binary``'s PTX and the
    driver compiles it at load; ``smem_limit``: dynamic shared memory one block may opt in to (bytes)."""

    capability: tuple
    codegen: str
    binary: str
    smem_limit: int
    jit: bool = False

    def note(self) -> str:
        """How the binary gets onto this GPU, in words (a launcher's loader line)."""
        cc = "%d.%d" % self.capability
        if self.jit:
            return (f"compute capability {cc}: NVRTC builds no CUBIN for it (it supports "
                    f"{', '.join(f'sm_{n}' for n in supported_archs())}); the driver JIT-compiles {self.binary}'s "
                    "PTX at load")
        return f"compute capability {cc}: {self.codegen} code, {self.binary} CUBIN"


def parse_capability(capability) -> tuple[int, int]:
    """(major, minor) from "9.0", "90", 90, (9, 0) or an arch name ("sm_90a")."""
    if isinstance(capability, tuple) and len(capability) == 2:
        return int(capability[0]), int(capability[1])
    text = str(capability).strip()
    if text.startswith("sm_"):
        return capability_of(text)
    if "." in text:
        major, _, minor = text.partition(".")
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    elif text.isdigit() and len(text) >= 2:
        return int(text[:-1]), int(text[-1])
    raise InvalidInput(f"compute capability {capability!r} is not MAJOR.MINOR", hint='e.g. "9.0" or (12, 0)')


def codegen_arch(capability) -> str:
    """The generator's arch for a GPU: sm_80 for 8.x, sm_90a for 9.0, sm_90 (cp.async + mma.sync) for newer ones.
    NoDevice before 8.0."""
    cc = parse_capability(capability)
    if cc < MIN_CAPABILITY:
        raise NoDevice(f"the GPU has compute capability {cc[0]}.{cc[1]}; mugraph's kernels need 8.0 or newer "
                       "(cp.async, mma.sync with bf16)",
                       hint="backend='harness' and Kernel.run_on_cpu run the generated CUDA on the CPU harness")
    if cc[0] == 8:
        return "sm_80"
    return "sm_90a" if cc == (9, 0) else "sm_90"


def cubin_runs(cubin_arch: str, capability) -> bool:
    """Whether a CUBIN built for ``cubin_arch`` runs on a GPU of ``capability``: same major and a minor no newer
    (CUDA's binary compatibility); an arch-specific one (``sm_90a``) on exactly its own capability."""
    major, minor = capability_of(cubin_arch)
    cc = parse_capability(capability)
    if cubin_arch.endswith("a"):
        return cc == (major, minor)
    return cc[0] == major and cc[1] >= minor


def for_device(capability, smem_limit: int | None = None) -> DeviceArch:
    """The build decisions for a GPU of ``capability``; ``smem_limit`` is the device's own opt-in limit where the
    caller read it (else the compute capability's, from compile.SMEM_OPTIN_KB)."""
    cc = parse_capability(capability)
    codegen = codegen_arch(cc)
    exact = f"sm_{cc[0]}{cc[1]}"
    limit = smem_limit if smem_limit is not None else _table_limit(cc)
    if cubin_runs(codegen, cc):
        return DeviceArch(cc, codegen, codegen, limit)
    if 10 * cc[0] + cc[1] in supported_archs():
        return DeviceArch(cc, codegen, exact, limit)
    return DeviceArch(cc, codegen, codegen, limit, jit=True)


def _table_limit(capability: tuple) -> int:
    """The compute capability's per-block limit (compile.SMEM_OPTIN_KB; 48 KB, what every GPU allows without
    opting in, for one the table does not list)."""
    return SMEM_OPTIN_KB.get(capability, UNLISTED_SMEM_KB) * 1024


def codegen_spec(device: DeviceArch):
    """The ArchSpec the generator plans with for ``device``: its code path's, with the shared-memory limit lowered
    to the device's where that is smaller (the schedule then keeps fewer stages in flight)."""
    from mugraph.codegen.arch import get_arch
    spec = get_arch(device.codegen)
    return spec if device.smem_limit >= spec.smem_limit else replace(spec, smem_limit=device.smem_limit)


def generate_for(graph, device: DeviceArch):
    """``graph``'s module for ``device`` (``codegen_spec``); ResourceError naming each kernel that does not fit
    the device's shared memory even with fewer stages: its bytes as planned for the code path, and the limit."""
    from mugraph.codegen.generate import generate
    spec = codegen_spec(device)
    try:
        return generate(graph, spec)
    except ResourceError as e:
        if spec.smem_limit == TARGETS[device.codegen].max_smem_per_block:
            raise
        planned = generate(graph, device.codegen).plan
        raise _too_big(planned, device, str(e)) from e


def _too_big(plan, device: DeviceArch, why: str) -> ResourceError:
    over = [k for k in plan.kernels if k.kind == "custom" and k.smem_bytes > device.smem_limit]
    names = "; ".join(f"kernel {k.name!r} plans {k.smem_bytes} bytes of dynamic shared memory per block" for k in over)
    return ResourceError(f"{names or 'a kernel does not fit'} (for {device.codegen}); this GPU (compute capability "
                         f"{device.capability[0]}.{device.capability[1]}) allows {device.smem_limit} per block, and "
                         f"fewer pipeline stages do not fit either: {why.splitlines()[0]}",
                         hint="search again for this GPU's limit (a smaller tile: a larger grid or forloop), or run "
                              "on a GPU with more shared memory per block")


def check_shared_memory(dynamic: Mapping[str, int], static: Mapping[str, int], limit: int, where: str) -> None:
    """ResourceError naming the first kernel whose static + dynamic shared memory exceeds ``limit`` on ``where``
    (the GPU, in words): what a launcher checks at load, before any launch could fail on it."""
    for name, smem in dynamic.items():
        total = int(static.get(name, 0)) + int(smem)
        if total > limit:
            raise ResourceError(f"kernel {name!r} needs {static.get(name, 0)} + {smem} = {total} bytes of shared "
                                f"memory per block (static + dynamic); {where} allows {limit}",
                                hint="search again for this GPU (a smaller tile), or run on a GPU with more shared "
                                     "memory per block")
