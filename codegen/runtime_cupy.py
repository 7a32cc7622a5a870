"""Run a generated μGraph on a GPU through CuPy: compile its CUDA to a CUBIN with NVRTC, load it, bind arrays,
launch the plan's kernels in order on the current stream, and capture the whole plan as a CUDA graph.

Arrays: CuPy arrays are used as they are, JAX (and other DLPack) GPU arrays without a copy, NumPy arrays are
copied to the device. Outputs, intermediates and the plan's workspace (split partials and counters,
``LaunchPlan.workspace``) live in buffers allocated once per kernel, device and stream, zeroed where the plan says
so: launches on different streams never share them, launches on one stream are ordered by it. The arrays a call
returns ARE that stream's buffers, so the next call on the same stream overwrites them (``copy=True`` returns
fresh ones). Threads may share a GpuKernel when each launches on its own stream.
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mugraph.codegen.compile import RUNTIME_DIR, TARGETS, CompiledKernel, compile_cuda
from mugraph.codegen.library_ops import library_op
from mugraph.ir.cache_dir import usable_dir
from mugraph.ir.errors import InvalidGraph, InvalidInput, NoDevice, ResourceError
from mugraph.ir.settings import settings

DEFAULT_SMEM_BYTES = 48 * 1024  # what a block may use before opting in to more dynamic shared memory
ARCH_BY_MAJOR = {8: "sm_80", 9: "sm_90"}  # a CUBIN runs on its own major version only
TARGET_ARCHS = {"a100": "sm_80", "h100": "sm_90", "h200": "sm_90"}
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


def device_arch(device_id: int | None = None) -> str | None:
    """The arch whose CUBINs run on the device (sm_80 for 8.x, sm_90 for 9.x), or None for any other."""
    import cupy
    device = cupy.cuda.Device(device_id)
    return ARCH_BY_MAJOR.get(int(device.compute_capability) // 10)


def device_name(device_id: int | None = None) -> str:
    import cupy
    device = cupy.cuda.Device(device_id)
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _smem_optin_limit(device_id: int, arch: str) -> int:
    import cupy
    attributes = cupy.cuda.Device(device_id).attributes
    return int(attributes.get("MaxSharedMemoryPerBlockOptin", TARGETS[arch].max_smem_per_block))


# ---- loading -------------------------------------------------------------------------------------------------------

def load_kernel(graph, *, target: str | None = None, arch: str | None = None) -> "GpuKernel":
    """Generate, compile and load ``graph`` on the current device.

    ``arch`` defaults to the device's (sm_80 for compute capability 8.x, sm_90 for 9.x); a CUBIN runs only on its
    own major version, so another arch is refused. ``target`` ("a100", "h100", "h200") names the cost model's GPU
    and is accepted for the Kernel API; the binary is always built for the device that is present.
    """
    require_gpu()
    if target is not None and target.lower() not in TARGET_ARCHS:
        raise InvalidInput(f"unknown target {target!r}", hint=f"one of: {', '.join(TARGET_ARCHS)}")
    arch = _choose_arch(arch, device_arch())
    from mugraph.codegen import generate  # the renderer: imported only when a kernel is needed
    kernel = GpuKernel(generate(graph, arch=arch), graph=graph)
    kernel.load()
    return kernel


def _choose_arch(arch: str | None, present: str | None) -> str:
    if arch is None:
        return present or "sm_90"  # newer GPUs: the sm_90 flavour, compiled by CuPy for the device (see _load)
    if arch not in TARGETS:
        raise InvalidInput(f"unsupported arch {arch!r}", hint=f"supported: {', '.join(TARGETS)}")
    if present is not None and _major(arch) != _major(present):
        raise InvalidInput(f"a {arch} binary cannot run on this {present} device",
                           hint="leave arch unset to build for the device present")
    return arch


def _major(arch: str) -> int:
    return int(arch.removeprefix("sm_").rstrip("a")) // 10


def cubin_path(cubin: bytes) -> Path:
    """A file holding ``cubin`` in mugraph's cache, named by its content (CuPy loads CUBINs from files)."""
    folder = usable_dir(Path(settings.cache_dir) / "cubin", "CUBIN files")
    path = folder / f"{hashlib.sha256(cubin).hexdigest()[:32]}.cubin"
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


def compile_with_cupy(source: str, names: Sequence[str]) -> dict[str, Any]:
    """CuPy's own NVRTC path, for the device present: the fallback when no CUBIN of ours can be loaded."""
    import cupy
    module = cupy.RawModule(code=source, options=("-std=c++17", f"-I{RUNTIME_DIR}"), backend="nvrtc")
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
    function = state.functions[launch.name]
    args = tuple(buffers[a] for a in launch.args)
    grid, block, smem = tuple(launch.grid), tuple(launch.block), int(launch.smem_bytes)
    return lambda: function(grid, block, args, shared_mem=smem)


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
    loader: str                    # "cubin" (our NVRTC build) or "cupy-nvrtc (reason)"
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
    names the inputs in error messages.
    """

    def __init__(self, module, *, graph=None, compiled: CompiledKernel | None = None):
        self.module, self.graph = module, graph
        self.plan, self.source, self.arch = module.plan, module.source, module.arch
        self._buffers = {b.name: b for b in self.plan.buffers}
        self._custom = sorted({k.name for k in self.plan.kernels if k.kind == "custom"})
        self.compiled = compiled if compiled is not None else self._compile()
        self._input_names = tuple(graph.input_names) if graph is not None else tuple(self.plan.inputs)
        check_plan(self.plan, self.compiled, self.arch)
        self._states: dict[int, _DeviceState] = {}
        self._lock = threading.Lock()  # guards the creation of device and stream states

    def _compile(self) -> CompiledKernel | None:
        if not self._custom or self.arch not in TARGETS:
            return None
        return compile_cuda(self.source, self.arch, name="mugraph_kernel",
                            cache_dir=Path(settings.cache_dir) / "nvrtc")

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
        functions, loader = self._load_functions(device_id)
        self._check_device_limits(device_id, functions)
        for name, smem in self._dynamic_smem().items():
            if smem > DEFAULT_SMEM_BYTES:
                functions[name].max_dynamic_shared_size_bytes = smem
        return _DeviceState(device_id, functions, loader)

    def _load_functions(self, device_id: int) -> tuple[dict, str]:
        if not self._custom:
            return {}, "none"
        if self.compiled is not None and device_arch(device_id) == self.arch:
            try:
                return load_cubin(self.compiled.cubin, self._custom), "cubin"
            except Exception as e:  # a driver older than the NVRTC that built the CUBIN, say
                reason = f"{type(e).__name__}: {e}"
        else:
            reason = f"no {self.arch} CUBIN fits this device"
        return compile_with_cupy(self.source, self._custom), f"cupy-nvrtc ({reason})"

    def _dynamic_smem(self) -> dict[str, int]:
        smem: dict[str, int] = {}
        for k in self.plan.kernels:
            if k.kind == "custom":
                smem[k.name] = max(smem.get(k.name, 0), int(k.smem_bytes))
        return smem

    def _check_device_limits(self, device_id: int, functions) -> None:
        limit = _smem_optin_limit(device_id, self.arch if self.arch in TARGETS else "sm_90")
        for name, smem in self._dynamic_smem().items():
            static = int(functions[name].shared_size_bytes)
            if static + smem > limit:
                raise ResourceError(f"kernel {name!r} needs {static} + {smem} bytes of shared memory (static + "
                                    f"dynamic); GPU {device_id} allows {limit} per block",
                                    hint="the search should have rejected this candidate: check its target")

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
        """How the module was loaded on a device: "cubin", "cupy-nvrtc (why)", or None if not yet."""
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
    limit = TARGETS[arch].max_smem_per_block if arch in TARGETS else TARGETS["sm_90"].max_smem_per_block
    if threads > 1024:
        raise ResourceError(f"{where} ({launch.name}) launches {threads} threads per block; at most 1024")
    if not 0 <= launch.smem_bytes <= limit:
        raise ResourceError(f"{where} ({launch.name}) asks for {launch.smem_bytes} bytes of dynamic shared "
                            f"memory; {arch} allows {limit} per block")
