"""Run a generated μGraph on a GPU through CuPy: compile its CUDA to a CUBIN with NVRTC, load it, bind arrays,
launch the plan's kernels in order on the current stream, and capture the whole plan as a CUDA graph.

What is generated and built follows the device (``codegen.device``): sm_80 code on 8.x, sm_90a's TMA + wgmma on
9.0, sm_90's on newer GPUs in a CUBIN NVRTC builds for the GPU's own arch (its PTX, JIT-compiled by the driver,
where NVRTC cannot), planned within the device's shared memory per block. Launches with TMA tensor maps (encoded
with the driver for the bound buffers' addresses, passed by value after the pointers) or thread-block clusters go
through ``cuLaunchKernelEx`` (cuda-bindings); the others through CuPy.

Arrays: CuPy arrays are used as they are, JAX (and other DLPack) GPU arrays without a copy, NumPy arrays are
copied to the device. Outputs, intermediates and the plan's workspace (split partials and counters,
``LaunchPlan.workspace``) live in buffers allocated once per kernel, device and stream, zeroed where the plan says
so: launches on different streams never share them, launches on one stream are ordered by it. The arrays a call
returns ARE that stream's buffers, so the next call on the same stream overwrites them (``copy=True`` returns
fresh ones). Threads may share a GpuKernel when each launches on its own stream.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mugraph.codegen import device as dev
from mugraph.codegen.compile import TARGETS, CompiledKernel, compile_cuda, compile_target
from mugraph.codegen.library_ops import library_op
from mugraph.ir.cache_dir import usable_dir
from mugraph.ir.errors import InvalidGraph, InvalidInput, NoDevice, ResourceError
from mugraph.ir.settings import settings

DEFAULT_SMEM_BYTES = 48 * 1024  # what a block may use before opting in to more dynamic shared memory
TARGET_ARCHS = {"a100": "sm_80", "h100": "sm_90a", "h200": "sm_90a"}  # the cost model's GPUs and their code
MAX_PORTABLE_CLUSTER = 8  # larger thread-block clusters need the kernel's non-portable-size attribute
_DLPACK_CPU = 1  # DLDeviceType kDLCPU
_WITHOUT_GPU = ("without a GPU, Kernel.run_reference(*arrays) runs the μGraph in the reference interpreter "
                "(float64), and mugraph.codegen.run_on_cpu(graph, arrays) runs the generated CUDA on the CPU "
                "harness")


# ---- the device ----------------------------------------------------------------------------------------------------

def gpu_available() -> bool:
    """True when CuPy imports and sees a CUDA device; never raises."""
    try:
        import cupy
        return bool(cupy.cuda.is_available())
    except Exception:  # ImportError, or a broken CUDA install raising from inside CuPy
        return False


def require_gpu() -> None:
    """Raise NoDevice, naming what runs without a GPU, unless CuPy sees a CUDA device."""
    try:
        import cupy  # noqa: F401
    except Exception as e:
        raise NoDevice(f"CuPy is not importable ({type(e).__name__}: {e}); running a generated kernel needs "
                       "CuPy and a CUDA GPU", hint=f"pip install 'mugraph[cuda]' on a GPU machine; {_WITHOUT_GPU}")
    if not gpu_available():
        raise NoDevice("no CUDA device (cupy.cuda.is_available() is False); running a generated kernel needs one",
                       hint=_WITHOUT_GPU)


def device_build(device_id: int | None = None) -> dev.DeviceArch:
    """What to generate and build for the device (``codegen.device.for_device``), with its own shared-memory
    limit."""
    import cupy
    device = cupy.cuda.Device(device_id)
    return dev.for_device(str(device.compute_capability), _smem_optin_limit(device.id))


def device_arch(device_id: int | None = None) -> str:
    """The generator's arch for the device: sm_80 for 8.x, sm_90a for 9.0, sm_90 for newer GPUs."""
    import cupy
    return dev.codegen_arch(str(cupy.cuda.Device(device_id).compute_capability))


def device_name(device_id: int | None = None) -> str:
    import cupy
    device = cupy.cuda.Device(device_id)
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _smem_optin_limit(device_id: int) -> int:
    import cupy
    device = cupy.cuda.Device(device_id)
    limit = device.attributes.get("MaxSharedMemoryPerBlockOptin")
    if limit is None:  # an old CuPy: the compute capability's table entry
        limit = dev.for_device(str(device.compute_capability)).smem_limit
    return int(limit)


# ---- loading -------------------------------------------------------------------------------------------------------

def load_kernel(graph, *, target: str | None = None, arch: str | None = None) -> "GpuKernel":
    """Generate, compile and load ``graph`` on the current device.

    ``arch`` defaults to the device's code path (``codegen.device``: sm_80 for 8.x, sm_90a for 9.0, sm_90 for newer
    GPUs, planned within the device's shared memory, built by NVRTC for the device's own arch where the
    generator's CUBIN does not run there); another arch must build a CUBIN that runs on the device. ``target``
    ("a100", "h100", "h200") names the cost model's GPU and is accepted for the Kernel API; the binary is always
    built for the device that is present.
    """
    require_gpu()
    if target is not None and target.lower() not in TARGET_ARCHS:
        raise InvalidInput(f"unknown target {target!r}", hint=f"one of: {', '.join(TARGET_ARCHS)}")
    device = device_build()
    if arch is None:
        kernel = GpuKernel(dev.generate_for(graph, device), graph=graph, binary_arch=device.binary)
    else:
        from mugraph.codegen import generate  # the renderer: imported only when a kernel is needed
        kernel = GpuKernel(generate(graph, arch=_choose_arch(arch, device)), graph=graph)
    kernel.load()
    return kernel


def _choose_arch(arch: str | None, device: dev.DeviceArch | None) -> str:
    """``arch`` (default: the device's code path) when the generator knows it and its CUBIN runs on ``device``."""
    if arch is None:
        return device.codegen if device is not None else "sm_90a"
    if arch not in TARGETS:
        raise InvalidInput(f"unsupported arch {arch!r}", hint=f"supported: {', '.join(TARGETS)}")
    if device is not None and not dev.cubin_runs(arch, device.capability):
        cc = "%d.%d" % device.capability
        raise InvalidInput(f"a {arch} binary cannot run on this compute capability {cc} device",
                           hint=f"leave arch unset to build for the device present ({device.codegen} code)")
    return arch


def cubin_path(cubin: bytes, suffix: str = ".cubin") -> Path:
    """A file holding ``cubin`` (or PTX, ``suffix=".ptx"``) in mugraph's cache, named by its content (CuPy loads
    modules from files)."""
    folder = usable_dir(Path(settings.cache_dir) / "cubin", "CUBIN files")
    path = folder / f"{hashlib.sha256(cubin).hexdigest()[:32]}{suffix}"
    if not path.is_file() or path.stat().st_size != len(cubin):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
    return path


def load_cubin(cubin: bytes, names: Sequence[str]) -> dict[str, Any]:
    """Load a CUBIN on the current device; returns a ``cupy.RawKernel`` per entry function name."""
    import cupy
    module = cupy.RawModule(path=str(cubin_path(cubin)))
    return {name: module.get_function(name) for name in names}


def load_ptx(ptx: str, names: Sequence[str]) -> dict[str, Any]:
    """Load PTX on the current device: the driver JIT-compiles it for the GPU (the fallback where NVRTC cannot
    build a CUBIN for it)."""
    import cupy
    module = cupy.RawModule(path=str(cubin_path(ptx.encode(), ".ptx")))
    return {name: module.get_function(name) for name in names}


# ---- arrays --------------------------------------------------------------------------------------------------------

def _dtype_of(x) -> np.dtype | None:
    try:
        return np.dtype(x.dtype)
    except TypeError:  # e.g. torch.float16
        try:
            return np.dtype(str(x.dtype).rpartition(".")[2])
        except TypeError:
            return None


def to_device(x, name: str, device_id: int):
    """``x`` as a C-contiguous, 16-byte-aligned CuPy array on ``device_id``, copying only when needed."""
    import cupy
    if isinstance(x, cupy.ndarray):
        array = x
    elif isinstance(x, (np.ndarray, np.generic)):
        array = cupy.asarray(x)
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        on_cpu = x.__dlpack_device__()[0] == _DLPACK_CPU
        array = cupy.asarray(np.asarray(x)) if on_cpu else cupy.from_dlpack(x)
    else:
        raise InvalidInput(f"input {name!r} is a {type(x).__name__}",
                           hint="pass CuPy, JAX (or any DLPack) or NumPy arrays")
    if array.device.id != device_id:
        raise InvalidInput(f"input {name!r} is on GPU {array.device.id}, the kernel runs on GPU {device_id}",
                           hint="call the kernel under `with cupy.cuda.Device(n):` for the inputs' device")
    # Kernels index densely from the base pointer and copy 16-byte chunks (cp.async): views get a fresh copy.
    if not array.flags.c_contiguous or array.data.ptr % 16:
        array = array.copy(order="C")
    return array


# ---- launches ------------------------------------------------------------------------------------------------------

def _custom_step(state: "_DeviceState", launch, buffers: Mapping[str, Any]) -> Callable:
    """One custom kernel's launch on the current stream: through CuPy, or through the driver where the launch
    takes tensor maps (encoded here, for the bound buffers' addresses) or a thread-block cluster."""
    function = state.functions[launch.name]
    args = tuple(buffers[a] for a in launch.args)
    grid, block, smem = tuple(launch.grid), tuple(launch.block), int(launch.smem_bytes)
    if not needs_driver_launch(launch):
        return lambda: function(grid, block, args, shared_mem=smem)
    import cupy
    maps = [m.encode_cuda(buffers[m.buffer].data.ptr) for m in launch.tensor_maps]
    params = KernelParams([a.data.ptr for a in args], maps)
    cluster = tuple(launch.cluster) if state.cluster_at_launch.get(launch.name) else (1, 1, 1)
    handle = function.kernel.ptr
    return lambda: driver_launch(handle, launch_config(launch, cupy.cuda.get_current_stream().ptr, cluster),
                                 params, launch.name)


# ---- launches CuPy cannot make: tensor maps by value, thread-block clusters -----------------------------------------

def needs_driver_launch(launch) -> bool:
    """A launch that passes tensor maps (128 bytes by value) or runs in thread-block clusters."""
    return bool(launch.tensor_maps) or tuple(launch.cluster) != (1, 1, 1)


class KernelParams:
    """A kernel's arguments as cuLaunchKernel(Ex) reads them: every pointer (8 bytes), then every tensor map (128
    bytes, 128-byte aligned like CUtensorMap), and the array of their addresses (``address``: ``kernelParams``).
    ``values()`` reads them back through that array."""

    def __init__(self, pointers: Sequence[int], maps: Sequence[bytes] = ()):
        from mugraph.codegen.tma import MAP_BYTES
        if any(len(m) != MAP_BYTES for m in maps):
            raise InvalidInput(f"a tensor map argument is {MAP_BYTES} bytes, got {[len(m) for m in maps]}")
        self._values = [ctypes.c_void_p(int(p)) for p in pointers] + [_aligned(m, 128) for m in maps]
        self._array = (ctypes.c_void_p * max(1, len(self._values)))(*[ctypes.addressof(v) for v in self._values])
        self.sizes = tuple([8] * len(pointers) + [len(m) for m in maps])

    @property
    def address(self) -> int:
        return ctypes.addressof(self._array)

    def values(self) -> list[bytes]:
        """Each argument's bytes, read through the address array the driver gets."""
        return [ctypes.string_at(self._array[i], n) for i, n in enumerate(self.sizes)]


def _aligned(data: bytes, align: int):
    raw = (ctypes.c_uint8 * (len(data) + align))()
    view = (ctypes.c_uint8 * len(data)).from_buffer(raw, -ctypes.addressof(raw) % align)  # keeps ``raw`` alive
    ctypes.memmove(view, data, len(data))
    return view


def launch_config(launch, stream: int, cluster=(1, 1, 1)):
    """cuLaunchKernelEx's CUlaunchConfig for ``launch`` on ``stream`` (a CUstream handle), with the cluster
    dimension attribute where ``cluster`` is not (1, 1, 1) (kernels without compiled ``__cluster_dims__``)."""
    from cuda.bindings import driver
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (int(n) for n in launch.grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = (int(n) for n in launch.block)
    config.sharedMemBytes = int(launch.smem_bytes)
    config.hStream = driver.CUstream(int(stream))
    attributes = []
    if tuple(cluster) != (1, 1, 1):
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dims = attribute.value.clusterDim
        dims.x, dims.y, dims.z = (int(n) for n in cluster)
        attributes.append(attribute)
    config.attrs = attributes
    config.numAttrs = len(attributes)
    return config


def driver_launch(function: int, config, params: KernelParams, name: str) -> None:
    """cuLaunchKernelEx of the CUfunction handle ``function``; a failure raises ResourceError naming the kernel."""
    from cuda.bindings import driver
    (err,) = driver.cuLaunchKernelEx(config, driver.CUfunction(int(function)), params.address, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise ResourceError(f"cuLaunchKernelEx({name}) failed: {err.name}",
                            hint="grid, block, cluster and shared memory as the plan says; see the launch plan")


def compiled_cluster(function: int) -> tuple:
    """The ``__cluster_dims__`` a kernel was compiled with, (0, 0, 0) if none (the launch then sets them)."""
    from cuda.bindings import driver
    attribute = driver.CUfunction_attribute
    dims = []
    for which in ("WIDTH", "HEIGHT", "DEPTH"):
        err, value = driver.cuFuncGetAttribute(getattr(attribute, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{which}"),
                                               driver.CUfunction(int(function)))
        dims.append(int(value) if err == driver.CUresult.CUDA_SUCCESS else 0)
    return tuple(dims)


def allow_large_clusters(function: int) -> None:
    """Clusters of more than MAX_PORTABLE_CLUSTER blocks (up to 16 on sm_90) need the kernel's opt-in."""
    from cuda.bindings import driver
    (err,) = driver.cuFuncSetAttribute(driver.CUfunction(int(function)),
                                       driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                       1)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise ResourceError(f"this GPU refuses clusters of more than {MAX_PORTABLE_CLUSTER} blocks ({err.name})")


def _library_step(state: "_DeviceState", launch, buffers: Mapping[str, Any]) -> Callable:
    import cupy
    node, rule = launch.library_op, library_op(launch.library_op.op)
    *srcs, out = (buffers[a] for a in launch.args)
    return lambda: rule(cupy, node, srcs, out)


STEP_BUILDERS = {"custom": _custom_step, "library": _library_step}


class BoundLaunch:
    """A kernel's launches with their argument arrays resolved: ``launch()`` issues them with no per-call work.

    ``buffers`` maps every buffer name to its array (inputs bound here, the rest from the workspace);
    ``outputs`` are the output arrays, in the graph's output order, overwritten by every launch.
    """

    def __init__(self, steps: Sequence[Callable], buffers: Mapping[str, Any], outputs: Sequence[Any],
                 device_id: int):
        self._steps = tuple(steps)
        self.buffers = dict(buffers)
        self.outputs = list(outputs)
        self.device_id = device_id

    def launch(self) -> list:
        for step in self._steps:
            step()
        return self.outputs


@dataclass(eq=False)
class CapturedGraph:
    """A CUDA graph of ``launches`` bound launches. Replays read the arrays bound at capture and write the same
    outputs; to feed new data, write it into the bound input arrays (``bound[i].buffers``)."""

    graph: Any  # cupy.cuda.graph.Graph
    launches: int
    bound: tuple
    outputs: list
    _pool: Any = field(repr=False)  # the private memory pool whose blocks the graph's library temporaries use

    def replay(self, stream=None) -> None:
        """Launch the graph on ``stream`` (default: the current stream); asynchronous like any launch."""
        self.graph.launch(stream)


def capture(bound: Sequence[BoundLaunch], repeat: int = 1, stream=None) -> CapturedGraph:
    """Record ``repeat`` rounds of the bound launches (each in order) as one CUDA graph, on ``stream`` (default:
    a new one). The graph writes the bound launches' buffers: bind them on the capture stream (as
    ``GpuKernel.capture_graph`` does) so that no launch on another stream shares them."""
    import cupy
    if not bound or repeat < 1:
        raise InvalidInput("capture needs at least one bound launch and repeat >= 1")
    stream, pool = stream or cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
    cupy.cuda.Device().synchronize()  # the inputs' producers (on other streams) have finished
    # Library ops allocate temporaries. Inside capture they come from a pool nobody else uses, so the addresses
    # the graph recorded stay reserved for it; the warm-up round fills that pool and loads modules and handles.
    with stream, cupy.cuda.using_allocator(pool.malloc):
        for b in bound:
            b.launch()
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(repeat):
                for b in bound:
                    b.launch()
        finally:
            graph = stream.end_capture()
    return CapturedGraph(graph, launches=repeat * len(bound), bound=tuple(bound), outputs=bound[-1].outputs,
                         _pool=pool)


# ---- the kernel ----------------------------------------------------------------------------------------------------

@dataclass
class _DeviceState:
    device_id: int
    functions: Mapping[str, Any]   # cupy.RawKernel per custom kernel name
    loader: str                    # "cubin", "nvrtc sm_XY (why)" or "ptx-jit (why)": see GpuKernel.loader
    cluster_at_launch: Mapping[str, bool] = field(default_factory=dict)  # kernel -> its cluster is a launch attribute
    streams: dict = field(default_factory=dict)  # stream handle -> _StreamState


@dataclass
class _StreamState:
    """One stream's buffers: every plan buffer but the inputs, allocated on first use on that stream. The
    state holds the stream object, so its handle (the key) is not reused while the buffers live."""

    stream: Any                    # cupy.cuda.Stream (or the null stream)
    buffers: Mapping[str, Any]     # outputs, intermediates and workspace
    last: tuple | None = None      # (input pointers, BoundLaunch) of the previous call on this stream


def allocate_buffers(plan) -> dict:
    """Every non-input buffer of ``plan`` on the current device and stream: outputs and intermediates zeroed (no
    output ever shows garbage), ``zero_init`` workspace zeroed before its first launch (its kernels reset it after
    each launch, so once per stream is enough), other workspace as allocated (written before it is read)."""
    import cupy

    def allocate(b):
        empty = b.workspace and not b.zero_init
        return (cupy.empty if empty else cupy.zeros)(tuple(b.shape), b.dtype.numpy)
    return {b.name: allocate(b) for b in plan.buffers if b.role != "input"}


class GpuKernel:
    """A generated module (CUDA source + launch plan) ready to run on GPUs.

    Built without a GPU it only compiles and checks its plan; ``load()`` / calls need one. ``graph`` (optional)
    names the inputs in error messages. ``binary_arch``: the arch its CUBIN is built for (default: the module's;
    ``codegen.device`` picks the device's own where the module's CUBIN does not run there); a device the CUBIN
    does not run on gets one built by NVRTC for its own arch at load, else the PTX (``loader()`` says which).
    """

    def __init__(self, module, *, graph=None, compiled: CompiledKernel | None = None, binary_arch: str | None = None):
        self.module, self.graph = module, graph
        self.plan, self.source, self.arch = module.plan, module.source, module.arch
        self.binary_arch = binary_arch or (compiled.arch if compiled is not None else module.arch)
        self._buffers = {b.name: b for b in self.plan.buffers}
        self._custom = sorted({k.name for k in self.plan.kernels if k.kind == "custom"})
        self.compiled = compiled if compiled is not None else self._compile(self.binary_arch)
        self._input_names = tuple(graph.input_names) if graph is not None else tuple(self.plan.inputs)
        check_plan(self.plan, self.compiled, self.binary_arch)
        self._states: dict[int, _DeviceState] = {}
        self._lock = threading.Lock()  # guards the creation of device and stream states

    def _compile(self, arch: str) -> CompiledKernel | None:
        if not self._custom:
            return None
        return compile_cuda(self.source, arch, name="mugraph_kernel", cache_dir=Path(settings.cache_dir) / "nvrtc")

    # -- inputs --
    def check_inputs(self, arrays: Sequence) -> None:
        """InvalidInput unless ``arrays`` match the plan's inputs in count, shape and dtype (needs no GPU)."""
        if len(arrays) != len(self.plan.inputs):
            raise InvalidInput(f"the kernel takes {len(self.plan.inputs)} inputs {list(self._input_names)}, "
                               f"got {len(arrays)} arrays")
        for name, buffer_name, x in zip(self._input_names, self.plan.inputs, arrays):
            expected = self._buffers[buffer_name]
            want = f"{tuple(expected.shape)} {expected.dtype.value}"
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise InvalidInput(f"input {name!r} is a {type(x).__name__}, the kernel expects a {want} array",
                                   hint="pass CuPy, JAX (or any DLPack) or NumPy arrays")
            shape, dtype = tuple(x.shape), _dtype_of(x)
            if shape != tuple(expected.shape):
                raise InvalidInput(f"input {name!r} has shape {shape}, the kernel expects {want}",
                                   hint="the kernel was generated for these shapes; superoptimize again for others")
            if dtype != expected.dtype.numpy:
                raise InvalidInput(f"input {name!r} has dtype {dtype}, the kernel expects {want}",
                                   hint=f"convert it first, e.g. x.astype('{expected.dtype.value}')")

    # -- devices --
    def load(self) -> None:
        """Load the module on the current device and allocate the current stream's buffers (done by the first call
        otherwise)."""
        self._stream_state(self._state())

    def _state(self) -> _DeviceState:
        require_gpu()
        import cupy
        device_id = cupy.cuda.Device().id
        with self._lock:
            if device_id not in self._states:
                self._states[device_id] = self._load(device_id)
            return self._states[device_id]

    def _stream_state(self, state: _DeviceState) -> _StreamState:
        """The current stream's buffers on ``state``'s device, allocated (on that stream) on first use."""
        import cupy
        stream = cupy.cuda.get_current_stream()
        with self._lock:
            if stream.ptr not in state.streams:
                state.streams[stream.ptr] = _StreamState(stream, allocate_buffers(self.plan))
            return state.streams[stream.ptr]

    def streams(self, device_id: int | None = None) -> int:
        """How many streams have their own buffers for this kernel on a device (default: the current one)."""
        if device_id is None:
            import cupy
            device_id = cupy.cuda.Device().id
        state = self._states.get(device_id)
        return len(state.streams) if state else 0

    def _load(self, device_id: int) -> _DeviceState:
        device = device_build(device_id)
        functions, loader = self._load_functions(device)
        self._check_device_limits(device_id, device, functions)
        for name, smem in self._dynamic_smem().items():
            if smem > DEFAULT_SMEM_BYTES:
                functions[name].max_dynamic_shared_size_bytes = smem
        return _DeviceState(device_id, functions, loader, self._clusters(functions))

    def _load_functions(self, device: dev.DeviceArch) -> tuple[dict, str]:
        """The CUBIN where it runs on the device; else one NVRTC builds for the device's own arch; else the PTX,
        compiled by the driver's JIT (with a warning saying why)."""
        if not self._custom:
            return {}, "none"
        cc = "%d.%d" % device.capability
        if self.compiled is not None and dev.cubin_runs(self.compiled.arch, device.capability):
            try:
                return load_cubin(self.compiled.cubin, self._custom), "cubin"
            except Exception as e:  # a driver older than the NVRTC that built the CUBIN, say
                reason = f"the {self.compiled.arch} CUBIN did not load ({type(e).__name__}: {e})"
        else:
            reason = f"a {self.binary_arch} CUBIN does not run on compute capability {cc}"
        if not device.jit and device.binary != self.binary_arch:
            built = self._compile(device.binary)
            return load_cubin(built.cubin, self._custom), f"nvrtc {device.binary} ({reason})"
        ptx = self.compiled.ptx if self.compiled is not None else ""
        warnings.warn(f"mugraph: {reason}; loading its PTX ({device.note()})", RuntimeWarning, stacklevel=3)
        return load_ptx(ptx, self._custom), f"ptx-jit ({reason}; {device.note()})"

    def _dynamic_smem(self) -> dict[str, int]:
        smem: dict[str, int] = {}
        for k in self.plan.kernels:
            if k.kind == "custom":
                smem[k.name] = max(smem.get(k.name, 0), int(k.smem_bytes))
        return smem

    def _check_device_limits(self, device_id: int, device: dev.DeviceArch, functions) -> None:
        static = {name: int(functions[name].shared_size_bytes) for name in self._custom}
        dev.check_shared_memory(self._dynamic_smem(), static, device.smem_limit,
                                f"GPU {device_id} (compute capability {device.capability[0]}.{device.capability[1]})")

    def _clusters(self, functions) -> dict[str, bool]:
        """Per clustered kernel: whether the launch sets its cluster (True) or the kernel was compiled with it
        (``__cluster_dims__``, which must then match the plan's, as the CPU harness runs the plan's)."""
        at_launch = {}
        for k in self.plan.kernels:
            if k.kind != "custom" or tuple(k.cluster) == (1, 1, 1):
                continue
            handle = functions[k.name].kernel.ptr
            compiled = compiled_cluster(handle)
            if any(compiled) and compiled != tuple(k.cluster):
                raise InvalidGraph(f"kernel {k.name!r} was compiled for clusters of {compiled} blocks, the plan "
                                   f"launches {tuple(k.cluster)}", field="plan.kernels.cluster")
            if np.prod(k.cluster) > MAX_PORTABLE_CLUSTER:
                allow_large_clusters(handle)
            at_launch[k.name] = not any(compiled)
        return at_launch

    # -- launching --
    def bind(self, *arrays) -> BoundLaunch:
        """Check and place ``arrays`` on the current device and resolve every launch's arguments, on the current
        stream's buffers."""
        state = self._state()
        return self._bind(state, self._stream_state(state), arrays)

    def _bind(self, state: _DeviceState, mine: _StreamState, arrays) -> BoundLaunch:
        self.check_inputs(arrays)
        inputs = [to_device(x, name, state.device_id) for name, x in zip(self._input_names, arrays)]
        key = tuple(a.data.ptr for a in inputs)
        if mine.last is not None and mine.last[0] == key:
            return mine.last[1]  # same memory as this stream's previous call: its resolved launches still hold
        buffers = {**mine.buffers, **dict(zip(self.plan.inputs, inputs))}
        steps = [STEP_BUILDERS[k.kind](state, k, buffers) for k in self.plan.kernels]
        bound = BoundLaunch(steps, buffers, [buffers[name] for name in self.plan.outputs], state.device_id)
        mine.last = (key, bound)
        return bound

    def __call__(self, *arrays, copy: bool = False) -> list:
        """Launch on the current stream; returns the outputs as CuPy arrays (asynchronously computed).

        The returned arrays are this stream's buffers: the next call on the same stream overwrites them.
        ``copy=True`` returns copies instead. ``jax.dlpack.from_dlpack(out)`` turns one into a JAX array without a
        copy.
        """
        outputs = self.bind(*arrays).launch()
        return [o.copy() for o in outputs] if copy else list(outputs)

    def capture_graph(self, *arrays, repeat: int = 1) -> CapturedGraph:
        """A CUDA graph of ``repeat`` back-to-back runs on ``arrays`` (see ``capture``), with buffers of its own:
        no call of the kernel on any stream shares them (they live as long as the graph)."""
        import cupy
        state, stream = self._state(), cupy.cuda.Stream(non_blocking=True)
        with stream:
            bound = self._bind(state, _StreamState(stream, allocate_buffers(self.plan)), arrays)
        return capture([bound], repeat, stream)

    def loader(self, device_id: int | None = None) -> str | None:
        """How the module was loaded on a device: "cubin" (the one built with it), "nvrtc sm_XY (why)" (built at
        load for the device's own arch), "ptx-jit (why)" (the driver compiled the PTX), or None if not yet."""
        if device_id is None:
            import cupy
            device_id = cupy.cuda.Device().id
        state = self._states.get(device_id)
        return state.loader if state else None

    def __repr__(self) -> str:
        return (f"GpuKernel({self.arch}, {len(self.plan.kernels)} launches: "
                f"{', '.join(k.name for k in self.plan.kernels)})")


# ---- plan checks ---------------------------------------------------------------------------------------------------

def check_plan(plan, compiled: CompiledKernel | None, arch: str) -> None:
    """InvalidGraph (naming the field) when a launch plan does not fit its buffers, binary or target."""
    names = [b.name for b in plan.buffers]
    if len(set(names)) != len(names):
        raise InvalidGraph(f"duplicate buffer names in {names}", field="plan.buffers")
    roles = {b.name: b.role for b in plan.buffers}
    for i, name in enumerate(plan.inputs):
        if roles.get(name) != "input":
            raise InvalidGraph(f"{name!r} is not an input buffer", field=f"plan.inputs[{i}]")
    for i, name in enumerate(plan.outputs):
        if name not in roles:
            raise InvalidGraph(f"no buffer {name!r}", field=f"plan.outputs[{i}]")
    for i, launch in enumerate(plan.kernels):
        _check_launch(launch, f"plan.kernels[{i}]", roles, compiled, arch)


def _check_launch(launch, where: str, roles: Mapping[str, str], compiled, arch: str) -> None:
    if launch.kind not in STEP_BUILDERS:
        raise InvalidGraph(f"unknown launch kind {launch.kind!r}", field=f"{where}.kind",
                           hint=f"one of: {', '.join(STEP_BUILDERS)}")
    for j, name in enumerate(launch.args):
        if name not in roles:
            raise InvalidGraph(f"no buffer {name!r}", field=f"{where}.args[{j}]")
    if launch.kind == "library":
        if launch.library_op is None or not launch.args:
            raise InvalidGraph("a library launch needs its KNode and a result buffer", field=where)
        library_op(launch.library_op.op)
        return
    if compiled is not None and launch.name not in compiled.kernels:
        raise InvalidGraph(f"the source has no entry function {launch.name!r}", field=f"{where}.name",
                           hint=f"entry functions: {', '.join(sorted(compiled.kernels)) or '(none)'}")
    threads = int(np.prod(launch.block))
    limit = compile_target(arch).max_smem_per_block
    if threads > 1024:
        raise ResourceError(f"{where} ({launch.name}) launches {threads} threads per block; at most 1024")
    if not 0 <= launch.smem_bytes <= limit:
        raise ResourceError(f"{where} ({launch.name}) asks for {launch.smem_bytes} bytes of dynamic shared "
                            f"memory; {arch} allows {limit} per block")
    _check_cluster(launch, where)
    for j, m in enumerate(launch.tensor_maps):
        if roles.get(m.buffer) is None:
            raise InvalidGraph(f"tensor map over no buffer {m.buffer!r}", field=f"{where}.tensor_maps[{j}]")


MAX_CLUSTER = 16  # blocks in one thread-block cluster, non-portable (sm_90)


def _check_cluster(launch, where: str) -> None:
    cluster = tuple(int(n) for n in launch.cluster)
    if len(cluster) != 3 or min(cluster) < 1 or int(np.prod(cluster)) > MAX_CLUSTER:
        raise InvalidGraph(f"cluster {cluster} must be 3 extents of at least 1 with at most {MAX_CLUSTER} blocks",
                           field=f"{where}.cluster")
    if any(g % c for g, c in zip(launch.grid, cluster)):
        raise InvalidGraph(f"grid {tuple(launch.grid)} is not a whole number of {cluster} clusters",
                           field=f"{where}.cluster", hint="each grid extent must be a multiple of the cluster's")
