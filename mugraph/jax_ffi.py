"""The GPU side of the JAX integration: custom kernels launched from their NVRTC CUBIN by an XLA FFI
handler (`ffi/mugraph_launch.cc`) on XLA's own stream, with no copies through CuPy.

What is built for the GPU is `codegen.device`'s decision: sm_90a code (TMA, wgmma) on 9.0, sm_80 code
on 8.x, sm_90's on newer majors, each CUBIN built by NVRTC for an arch that runs on the GPU (its own
where the generator's does not), planned within the GPU's shared memory per block. A launch passes
the plan's block (a TMA pipeline's producer warpgroup included), its cluster, and a compact
description of each TMA tensor map (`tma.TensorMapSpec.record`), which the handler encodes with
`cuTensorMapEncodeTiled` for the buffer XLA hands over and passes by value after the pointers.

The handler is built with g++ against jaxlib's FFI headers (no CUDA toolkit needed), cached by
content like the CPU-harness builds, and registered with JAX once per process. A custom call names
its module by content (SHA-256 of CUBIN and PTX), so an executable from the persistent compilation
cache or a serialized one means the same code in every process; a process that has not registered
the module loads it from the on-disk registry (`registry_dir()`) or fails saying so. A plan's
workspace (split partials, counters) is the handler's, per call, zeroed where the plan says so
(`codegen.plan.Buffer`); it is never an XLA value.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import threading
import warnings
from pathlib import Path

import jax
import numpy as np

from mugraph.ir.errors import CompileError, InvalidInput, NoDevice

TARGET = "mugraph_launch"             # plans without workspace: command-buffer compatible
WORKSPACE_TARGET = "mugraph_launch_ws"  # plans with workspace: XLA's scratch allocator, per call
TARGETS = {TARGET: ("MugraphInitialize", "MugraphLaunch"),
           WORKSPACE_TARGET: ("MugraphInitializeWorkspace", "MugraphLaunchWorkspace")}
EVENT_TARGET = "mugraph_record_event"   # a timing mark on XLA's stream (bench/gpu.py)
# On the CPU: what a launch target would launch, decoded by the same handler code (see describe_launch)
DESCRIBE_TARGETS = {TARGET: ("mugraph_describe", "MugraphDescribe"),
                    WORKSPACE_TARGET: ("mugraph_describe_ws", "MugraphDescribeWorkspace")}
_EXPORTS = ("MugraphRecordEvent", "mg_find_module", "mg_tensor_map_args", "mg_encode_tensor_map",
            "mg_device_smem_optin", "mg_driver_abi")
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
        lib = ctypes.CDLL(str(so))
        for symbol in (*(name for pair in TARGETS.values() for name in pair),
                       *(symbol for _, symbol in DESCRIBE_TARGETS.values()), *_EXPORTS):
            getattr(lib, symbol)
        return True
    except (OSError, AttributeError):
        so.unlink(missing_ok=True)
        return False


@functools.cache
def handler_library() -> ctypes.CDLL:
    """The loaded handler, registered with JAX for CUDA as `mugraph_launch` (plans without
    workspace; command-buffer compatible) and `mugraph_launch_ws` (plans with workspace), each
    with an initialize stage that loads the module outside any command-buffer capture. A process
    that runs a serialized executable holding mugraph calls calls this first."""
    lib = ctypes.CDLL(str(build_handler()))
    lib.mg_register_module.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
                                       ctypes.c_char_p, ctypes.c_int64]
    lib.mg_register_module.restype = ctypes.c_int64
    lib.mg_set_registry.argtypes = [ctypes.c_char_p]
    lib.mg_find_module.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
    lib.mg_find_module.restype = ctypes.c_int64
    lib.mg_module_count.restype = ctypes.c_int64
    words, text = ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p
    lib.mg_tensor_map_args.argtypes = [words, ctypes.c_int64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64),
                                       ctypes.c_int64, text, ctypes.c_int64]
    lib.mg_tensor_map_args.restype = ctypes.c_int64
    lib.mg_encode_tensor_map.argtypes = [words, ctypes.c_int64, ctypes.c_uint64, ctypes.c_char_p, text,
                                         ctypes.c_int64]
    lib.mg_encode_tensor_map.restype = ctypes.c_int64
    lib.mg_device_smem_optin.argtypes = [ctypes.c_int64]
    lib.mg_device_smem_optin.restype = ctypes.c_int64
    lib.mg_driver_abi.argtypes = [words, ctypes.c_int64]
    lib.mg_driver_abi.restype = ctypes.c_int64
    lib.mg_set_registry(str(registry_dir()).encode())
    for target, (initialize, execute) in TARGETS.items():
        jax.ffi.register_ffi_target(target, {"initialize": jax.ffi.pycapsule(getattr(lib, initialize)),
                                             "execute": jax.ffi.pycapsule(getattr(lib, execute))},
                                    platform="CUDA")
    jax.ffi.register_ffi_target(EVENT_TARGET, jax.ffi.pycapsule(lib.MugraphRecordEvent), platform="CUDA")
    for name, symbol in DESCRIBE_TARGETS.values():
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return lib


register_handler = handler_library


# ---- modules, named by content -----------------------------------------------------------------------
def registry_dir() -> Path:
    """Where registered modules live on disk (`<hash>.cubin`, `<hash>.ptx`) for other processes."""
    from mugraph.ir.cache_dir import usable_dir
    from mugraph.ir.settings import settings
    return usable_dir(Path(settings.cache_dir) / "ffi-modules", "XLA FFI modules")


def module_name(cubin: bytes, ptx: str) -> str:
    """The content hash a custom call names its module by: SHA-256 of the CUBIN, NUL, the PTX."""
    return hashlib.sha256(cubin + b"\0" + ptx.encode()).hexdigest()


def is_cubin(blob: bytes) -> bool:
    """A 64-bit ELF for EM_CUDA (190): what NVRTC and nvcc write as a CUBIN."""
    return len(blob) >= 20 and blob[:4] == b"\x7fELF" and blob[4] == 2 and \
        int.from_bytes(blob[18:20], "little") == _EM_CUDA


_EM_CUDA = 190


def register_module(cubin: bytes, ptx: str = "") -> str:
    """Register `cubin` (and its PTX, which the handler JIT-compiles for a GPU the CUBIN does not
    run on) with the handler and in the on-disk registry; returns its content hash, the name the
    custom call carries. InvalidInput when `cubin` is not a CUBIN."""
    if not isinstance(cubin, (bytes, bytearray)) or not is_cubin(bytes(cubin)):
        head = bytes(cubin[:8]) if isinstance(cubin, (bytes, bytearray)) else type(cubin).__name__
        raise InvalidInput(f"the module to register is not a CUBIN (a 64-bit ELF for EM_CUDA); it "
                           f"starts {head!r}",
                           hint="pass CompiledKernel.cubin from mugraph.codegen.compile_cuda")
    cubin, name = bytes(cubin), module_name(bytes(cubin), ptx)
    with _LOCK:
        if name not in _REGISTERED:
            _write_registry(name, cubin, ptx)
            code = handler_library().mg_register_module(name.encode(), cubin, len(cubin),
                                                        ptx.encode(), len(ptx.encode()))
            if code != 0:
                raise InvalidInput(f"the XLA FFI handler refused module {name[:16]} (code {code})",
                                   hint="rebuild the handler: delete the ffi folder of the cache")
            _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def _write_registry(name: str, cubin: bytes, ptx: str) -> None:
    folder = registry_dir()
    for suffix, data in ((".cubin", cubin), (".ptx", ptx.encode())):
        path = folder / f"{name}{suffix}"
        if path.is_file() and path.read_bytes() == data:
            continue
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def find_module(name: str) -> str | None:
    """None when the handler of this process has module `name` or loads it from the registry;
    else the handler's own message saying why not."""
    why = ctypes.create_string_buffer(1024)
    return None if handler_library().mg_find_module(name.encode(), why, len(why)) else \
        why.value.decode()


# ---- tensor maps, as the handler encodes them --------------------------------------------------------------
def tensor_map_args(record, address: int) -> tuple:
    """The arguments the handler passes `cuTensorMapEncodeTiled` for one `tensor_maps` record (buffer kind and
    index, then `TensorMapSpec.record()`) at `address`, in `DriverArgs.flat()`'s order (needs no GPU).
    InvalidInput with the handler's message when it refuses the record."""
    values, out, why = _words(record), (ctypes.c_uint64 * 64)(), ctypes.create_string_buffer(512)
    n = handler_library().mg_tensor_map_args(values, len(record), address, out, len(out), why, len(why))
    if n < 0:
        raise InvalidInput(f"the FFI handler refuses the tensor map record: {why.value.decode()}")
    return tuple(out[:n])


def encode_tensor_map(record, address: int) -> bytes:
    """The 128-byte CUtensorMap the handler encodes for one record at device `address` (needs the driver)."""
    out, why = ctypes.create_string_buffer(128), ctypes.create_string_buffer(512)
    if handler_library().mg_encode_tensor_map(_words(record), len(record), address, out, why, len(why)) != 0:
        raise NoDevice(f"the FFI handler could not encode the tensor map: {why.value.decode()}")
    return out.raw


def _words(record):
    return (ctypes.c_int64 * max(1, len(record)))(*[int(v) for v in record])


# ---- the GPU's architecture ----------------------------------------------------------------------------
def device_build():
    """What to generate and build for JAX's first GPU (`codegen.device.for_device`), with the GPU's own
    shared-memory limit where the driver tells it."""
    from mugraph.codegen import device as dev
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise NoDevice("JAX sees no GPU", hint="backend='harness' runs on the CPU harness")
    limit = handler_library().mg_device_smem_optin(int(getattr(gpus[0], "local_hardware_id", 0) or 0))
    return dev.for_device(str(getattr(gpus[0], "compute_capability", "9.0")), limit if limit > 0 else None)


def arch_for(compute_capability: str) -> str:
    """The generator's arch for a GPU of `compute_capability` ("9.0"): sm_80 for 8.x (an sm_80
    CUBIN runs on every 8.x GPU), sm_90a for 9.0 (TMA, wgmma), sm_90's cp.async + mma.sync code for
    every newer major (built by NVRTC for the GPU's own arch: `codegen.device`). NoDevice before 8.0
    (no cp.async / bf16 mma.sync)."""
    from mugraph.codegen.device import codegen_arch
    return codegen_arch(compute_capability)


def target_build(target: str):
    """The build decisions for the cost model's GPU `target` ("h100": sm_90a), for tracing and lowering
    `backend="cuda"` on a machine without that GPU."""
    from mugraph.codegen.compile import capability_of
    from mugraph.codegen.device import for_device
    from mugraph.search.targets import get_target
    return for_device(capability_of(get_target(target).arch))


# ---- the launcher ---------------------------------------------------------------------------------------
class CudaLauncher:
    """Custom kernels as `mugraph_launch` / `mugraph_launch_ws` custom calls naming their module
    by content; the CUBIN is compiled (NVRTC, cached, for `device.binary`) and registered on first
    use."""

    def __init__(self, module, device=None):
        from mugraph.codegen.compile import capability_of
        from mugraph.codegen.device import for_device
        self.module = module
        self.device = device if device is not None else for_device(capability_of(module.arch))
        self._name = None

    def module_name(self, register: bool = True) -> str:
        """The module's content hash; `register=False` computes it without the handler (tracing
        and lowering on a machine without a GPU)."""
        if self._name is None or (register and self._name not in _REGISTERED):
            from mugraph.codegen.compile import compile_cuda
            from mugraph.ir.settings import settings
            if self.device.jit:
                warnings.warn(f"mugraph: {self.device.note()}", RuntimeWarning, stacklevel=3)
            compiled = compile_cuda(self.module.source, self.device.binary, name="mugraph_kernel",
                                    cache_dir=Path(settings.cache_dir) / "nvrtc")
            self._name = register_module(compiled.cubin, compiled.ptx) if register else \
                module_name(compiled.cubin, compiled.ptx)
        return self._name

    def __call__(self, step, inputs, results):
        from mugraph.jax_integration import jax_has_gpu
        target, attributes = call_attributes(step, self.module_name(register=jax_has_gpu()))
        call = jax.ffi.ffi_call(target, results, vmap_method="sequential")
        return call(*inputs, **attributes)


OPERAND, RESULT, WORKSPACE = 0, 1, 2  # what a kernel parameter is, in the custom call's param_kind


def call_attributes(step, module: str) -> tuple[str, dict]:
    """The custom call target and attributes of one custom-kernel launch: the module (content hash),
    kernel, grid, block, dynamic shared memory, parameter slots, tensor maps (records after each one's
    buffer slot), cluster, and for a plan with workspace its sizes and which start zeroed."""
    launch = step.launch
    kinds, indices = param_slots(step)
    attributes = dict(module=module, kernel=launch.name, grid=np.asarray(launch.grid, np.int64),
                      block=np.asarray(launch.block, np.int64), smem=np.int64(launch.smem_bytes),
                      param_kind=kinds, param_index=indices, tensor_maps=tensor_map_records(step),
                      cluster=np.asarray(launch.cluster, np.int64))
    if not step.workspace:
        return TARGET, attributes
    attributes.update(workspace_bytes=np.asarray([b.nbytes for b in step.workspace], np.int64),
                      workspace_zero=np.asarray([int(b.zero_init) for b in step.workspace], np.int64))
    return WORKSPACE_TARGET, attributes


def param_slots(step) -> tuple[np.ndarray, np.ndarray]:
    """(kind, index) of each kernel parameter: operand i, result i or workspace i of the call."""
    slots = _slots(step)
    pairs = [slots[a] for a in step.launch.args]
    return (np.asarray([k for k, _ in pairs], np.int64), np.asarray([i for _, i in pairs], np.int64))


def _slots(step) -> dict:
    slots = {name: (OPERAND, i) for i, name in enumerate(step.reads)}
    slots.update({name: (RESULT, i) for i, name in enumerate(step.writes)})
    slots.update({b.name: (WORKSPACE, i) for i, b in enumerate(step.workspace)})
    return slots


def tensor_map_records(step) -> np.ndarray:
    """The launch's tensor maps as one flat int64 array: per map, the (kind, index) of the buffer it
    views, then `TensorMapSpec.record()` (the handler's `kMapFields` values each)."""
    slots = _slots(step)
    records = [(*slots[m.buffer], *m.record()) for m in step.launch.tensor_maps]
    return np.asarray([v for r in records for v in r], np.int64)


def describe_launch(step, inputs, results, module: str = "0" * 64, size: int = 4096):
    """On the CPU: what the CUDA handler would launch for `step` on `inputs` (a JAX computation; the
    kernel is not run): the call's attributes (`call_attributes`) decoded by the handler's own code,
    as uint64 words (see `Describe` in ffi/mugraph_launch.cc). `results` stand for the kernel's."""
    handler_library()
    target, attributes = call_attributes(step, module)
    name = DESCRIBE_TARGETS[target][0]
    shapes = [*results, jax.ShapeDtypeStruct((size,), np.uint8)]
    outs = jax.ffi.ffi_call(name, shapes, vmap_method="sequential")(*inputs, **attributes)
    return outs[-1]


# ---- timing marks ----------------------------------------------------------------------------------------
def record_event(event: int, *arrays):
    """`arrays` unchanged, after recording the CUDA event `event` (a CUevent handle, e.g. a CuPy
    Event's `.ptr`, in the context XLA uses) on XLA's stream when they are ready: the results alias
    the operands, so no data moves. `record_event(start, *fn(*record_event(end...)))`-style
    brackets time exactly the device work of the program between them."""
    if not arrays:
        raise InvalidInput("record_event needs at least one array to order the mark against")
    handler_library()
    results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    call = jax.ffi.ffi_call(EVENT_TARGET, results, vmap_method="sequential",
                            input_output_aliases={i: i for i in range(len(arrays))})
    return tuple(call(*arrays, event=np.int64(event)))


def bracketed(fn, start_event: int, end_event: int):
    """`fn` (arrays -> array or tuple of arrays) with `start_event` recorded once its inputs are
    ready and `end_event` once its outputs are: under `jax.jit` the two events time `fn`'s own
    device work on XLA's stream (the caller reads `cuEventElapsedTime`)."""
    def timed(*arrays):
        out = fn(*record_event(start_event, *arrays))
        single = not isinstance(out, (tuple, list))
        marked = record_event(end_event, *([out] if single else out))
        return marked[0] if single else marked
    return timed
