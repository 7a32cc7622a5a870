"""Run a kernel graph's generated CUDA on the CPU harness: custom kernels through g++ and the CUDA CPU shim,
library launches through NumPy with the interpreter's own-dtype meaning (``codegen.library_ops``)."""
from __future__ import annotations

import numpy as np

from mugraph.codegen.cpu import CHECK_DEFINE, CpuModule, build_cpu
from mugraph.codegen.generate import GeneratedModule, generate
from mugraph.codegen.library_ops import library_op
from mugraph.ir.interpret import bind_inputs

ALIGN = 256  # like cudaMalloc: cp.async needs 16-byte aligned tensors


def aligned_empty(shape, dtype) -> np.ndarray:
    """A C-contiguous array whose data starts on an ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + n].view(dtype).reshape(shape)


def run_on_cpu(graph, arrays, *, schedule: str = "rr", seed: int = 0, arch: str = "sm_80",
               workers: int | None = None, check: bool = False) -> list[np.ndarray]:
    """Outputs of ``graph`` on ``arrays`` (a list in input order or a dict by name), computed by the generated
    kernels on the CPU shim; ``schedule`` and ``seed`` pick the shim's thread interleaving. ``check``: the
    checking build -- a shared-memory race between barriers or an out-of-bounds global access raises
    KernelFault (whatever the schedule)."""
    module = generate(graph, arch)
    customs = [k.name for k in module.plan.kernels if k.kind == "custom"]
    defines = [CHECK_DEFINE] if check else []
    cpu = build_cpu(module.source, list(dict.fromkeys(customs)), defines=defines) if customs else None
    return run_plan(module, cpu, bind_inputs(graph, arrays), schedule=schedule, seed=seed, workers=workers)


def run_plan(module: GeneratedModule, cpu: CpuModule | None, arrays, *, schedule: str = "rr", seed: int = 0,
             workers: int | None = None) -> list[np.ndarray]:
    """Execute ``module.plan`` with its custom kernels from ``cpu`` (a build of ``module.source`` or of any
    source holding the same kernels). Buffers start as NaN, so an element no launch writes shows up."""
    plan = module.plan
    specs = {b.name: b for b in plan.buffers}
    buffers = {}
    for name, array in zip(plan.inputs, arrays):
        buf = aligned_empty(specs[name].shape, specs[name].dtype.numpy)
        buf[...] = np.asarray(array).astype(specs[name].dtype.numpy)
        buffers[name] = buf
    for b in plan.buffers:
        if b.name not in buffers:
            buffers[b.name] = aligned_empty(b.shape, b.dtype.numpy)
            buffers[b.name][...] = 0 if b.zero_init else np.nan
    for launch in plan.kernels:
        args = [buffers[a] for a in launch.args]
        if launch.kind == "custom":
            maps = [m.encode_cpu(buffers[m.buffer].ctypes.data) for m in launch.tensor_maps]  # sm_90a: TMA
            cpu.run(launch.name, args + maps, launch.grid, launch.block, launch.smem_bytes, schedule=schedule,
                    seed=seed, workers=workers, cluster=launch.cluster)
        else:
            *srcs, out = args
            library_op(launch.library_op.op)(np, launch.library_op, srcs, out)
    return [buffers[name].copy() for name in plan.outputs]
