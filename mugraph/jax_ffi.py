"""The GPU side of the JAX integration: custom kernels launched from their NVRTC CUBIN by an XLA FFI
handler (`ffi/mugraph_launch.cc`) on XLA's own stream, with no copies through CuPy.

The handler is built with g++ against jaxlib's FFI headers (no CUDA toolkit needed), cached by
content like the CPU-harness builds, and registered with JAX once per process.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import threading
from pathlib import Path

import jax
import numpy as np

from mugraph.ir.errors import CompileError, NoDevice

TARGET = "mugraph_launch"
SOURCE = Path(__file__).resolve().parent / "ffi" / "mugraph_launch.cc"
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wno-return-type")
_LOCK = threading.Lock()


def build_handler(cache_dir: Path | None = None) -> Path:
    """The handler's shared object, built once per (source, jaxlib headers, compiler, flags)."""
    from mugraph.codegen.cpu import _compiler_version as compiler_version
    from mugraph.ir.cache_dir import usable_dir
    include = jax.ffi.include_dir()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), include, jax.__version__,
                                    compiler_version(), *_FLAGS]).encode()).hexdigest()[:32]
    folder = usable_dir(cache_dir or _default_dir(), "the XLA FFI handler build")
    so = folder / f"mugraph_launch-{key}.so"
    if _loads(so):
        return so
    tmp = so.with_name(f"{so.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = ["g++", *_FLAGS, f"-I{include}", str(SOURCE), "-o", str(tmp), "-ldl"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError("g++ not found; the XLA FFI handler is built with it",
                           hint="apt-get install g++") from None
    if proc.returncode != 0:
        raise CompileError("g++ failed to build the XLA FFI handler", log=proc.stderr.strip(),
                           repro=" ".join(cmd))
    os.replace(tmp, so)
    return so


def _default_dir() -> Path:
    from mugraph.ir.settings import settings
    return Path(settings.cache_dir) / "ffi"


def _loads(so: Path) -> bool:
    """True when `so` is a loadable handler build; a garbage or empty file is removed."""
    if not so.is_file():
        return False
    try:
        ctypes.CDLL(str(so)).MugraphLaunch
        return True
    except (OSError, AttributeError):
        so.unlink(missing_ok=True)
        return False


@functools.cache
def handler_library() -> ctypes.CDLL:
    """The loaded handler, registered with JAX as the CUDA target `mugraph_launch`."""
    lib = ctypes.CDLL(str(build_handler()))
    lib.mg_register_module.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.mg_register_module.restype = ctypes.c_int64
    lib.mg_module_count.restype = ctypes.c_int64
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.MugraphLaunch), platform="CUDA")
    return lib


def register_cubin(cubin: bytes) -> int:
    """The handler's id for `cubin` (each distinct CUBIN is registered once per process)."""
    with _LOCK:
        if cubin not in _MODULE_IDS:
            _MODULE_IDS[cubin] = handler_library().mg_register_module(cubin, len(cubin))
        return _MODULE_IDS[cubin]


_MODULE_IDS: dict[bytes, int] = {}


def device_arch() -> str:
    """The CUBIN arch for JAX's first GPU: sm_80 for compute capability 8.x, sm_90 for 9.x."""
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise NoDevice("JAX sees no GPU", hint="backend='harness' runs on the CPU harness")
    major = int(str(getattr(gpus[0], "compute_capability", "9.0")).split(".")[0])
    return {8: "sm_80"}.get(major, "sm_90")


class CudaLauncher:
    """Custom kernels as `mugraph_launch` custom calls; the CUBIN is compiled on first use."""

    def __init__(self, module):
        self.module = module
        self._module_id = None

    def module_id(self, register: bool = True) -> int:
        if self._module_id is None:
            if not register:
                return -1  # tracing and lowering only: no handler, no CUBIN needed
            from mugraph.codegen.compile import compile_cuda
            from mugraph.ir.settings import settings
            compiled = compile_cuda(self.module.source, self.module.arch, name="mugraph_kernel",
                                    cache_dir=Path(settings.cache_dir) / "nvrtc")
            self._module_id = register_cubin(compiled.cubin)
        return self._module_id

    def __call__(self, step, inputs, results):
        launch = step.launch
        slots = {name: i for i, name in enumerate(step.reads)}
        slots.update({name: -1 - i for i, name in enumerate(step.writes)})
        from mugraph.jax_integration import jax_has_gpu
        call = jax.ffi.ffi_call(TARGET, results, vmap_method="sequential")
        return call(*inputs, module=np.int64(self.module_id(register=jax_has_gpu())),
                    kernel=launch.name, grid=np.asarray(launch.grid, np.int64),
                    block=np.asarray(launch.block, np.int64), smem=np.int64(launch.smem_bytes),
                    params=np.asarray([slots[a] for a in launch.args], np.int64))
