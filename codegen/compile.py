"""Compile CUDA C++ to a CUBIN in-process with NVRTC (nvcc as the fallback) and read back what ptxas and
cuobjdump say about it: registers, shared memory and spills per kernel, and the SASS.

The runtime folder (``tc_intrin.cuh``) is always on the include path. Results are memoised in-process on
everything that affects them (source, arch, options, backend, runtime headers, toolchain version) and, given a
``cache_dir``, on disk.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from mugraph.ir.cache_dir import usable_dir
from mugraph.ir.errors import CompileError, InvalidInput

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
BACKENDS = ("auto", "nvrtc", "nvcc")
_SASS_TOOLS_HINT = "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"


@dataclass(frozen=True)
class Target:
    """A GPU architecture the compiler accepts, with the per-block limits a shared-memory planner needs."""

    arch: str
    max_smem_per_block: int  # bytes of dynamic shared memory a block may opt in to
    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255


TARGETS: Mapping[str, Target] = MappingProxyType({
    "sm_80": Target("sm_80", max_smem_per_block=163 * 1024),
    "sm_90": Target("sm_90", max_smem_per_block=227 * 1024),
    "sm_90a": Target("sm_90a", max_smem_per_block=227 * 1024),  # sm_90 plus wgmma / setmaxnreg
})

# Shared memory one block may opt in to, per compute capability (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability"). The code generator plans for TARGETS; these size the checks of a binary
# built for another GPU (a launcher reads the device's own limit where it has one).
SMEM_OPTIN_KB: Mapping[tuple, int] = MappingProxyType({
    (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227, (10, 0): 227, (10, 3): 227,
    (11, 0): 227, (12, 0): 99, (12, 1): 99})
UNLISTED_SMEM_KB = 48  # a capability missing above: what every GPU gives a block without opting in
_ARCH_NAME = re.compile(r"sm_(\d+?)(\d)([af]?)")


def compile_target(arch: str) -> Target:
    """The Target for ``arch``: one of TARGETS, or any ``sm_XY`` (``sm_XYa``, ``sm_XYf``) the compiler supports
    (``supported_archs``), with the per-block limits of compute capability X.Y. InvalidInput names the supported
    ones otherwise."""
    if arch in TARGETS:
        return TARGETS[arch]
    m = _ARCH_NAME.fullmatch(str(arch))
    supported = supported_archs()
    if m is None or int(m.group(1) + m.group(2)) not in supported:
        raise InvalidInput(f"unsupported arch {arch!r}",
                           hint=f"sm_XY for a compute capability the compiler builds for: "
                                f"{', '.join(f'sm_{n}' for n in supported) or ', '.join(TARGETS)} (an 'a' or 'f' "
                                "suffix for arch- or family-specific code)")
    kb = SMEM_OPTIN_KB.get(capability_of(arch), UNLISTED_SMEM_KB)
    return Target(arch, max_smem_per_block=kb * 1024)


def capability_of(arch: str) -> tuple[int, int]:
    """(major, minor) of ``sm_XY`` / ``sm_XYa`` / ``sm_XYf``: sm_90a -> (9, 0), sm_120 -> (12, 0)."""
    m = _ARCH_NAME.fullmatch(str(arch))
    if m is None:
        raise InvalidInput(f"{arch!r} is not an sm_XY architecture name", hint="e.g. sm_80, sm_90a, sm_120")
    return int(m.group(1)), int(m.group(2))


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """The compute capabilities (as ``10 * major + minor``) the compiler can build CUBINs for: NVRTC's own list,
    else nvcc's, else TARGETS' (the generator's)."""
    try:
        from cuda.bindings import nvrtc
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return tuple(sorted(int(a) for a in archs))
    except Exception:  # ImportError, or cuda-pathfinder's DynamicLibNotFoundError for libnvrtc
        pass
    return _nvcc_archs() or tuple(sorted({int(a.removeprefix("sm_").rstrip("af")) for a in TARGETS}))


def _nvcc_archs() -> tuple[int, ...]:
    try:
        proc = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True)
    except FileNotFoundError:
        return ()
    return tuple(sorted({int(n) for n in re.findall(r"compute_(\d+)\b", proc.stdout)}))


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one entry function (``--ptxas-options=-v``)."""

    registers: int
    shared_bytes: int  # static shared memory; dynamic shared memory is a launch parameter
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    barriers: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass(frozen=True, eq=False)
class CompiledKernel:
    """One compiled translation unit: its CUBIN, PTX, ptxas log and the resources of each entry function."""

    name: str
    arch: str
    cubin: bytes
    ptx: str
    kernels: Mapping[str, KernelResources]
    compile_seconds: float
    log: str
    backend: str  # "nvrtc" or "nvcc"

    def resources(self, kernel: str) -> KernelResources:
        if kernel not in self.kernels:
            raise InvalidInput(f"no entry function {kernel!r} in {self.name!r}",
                               hint=f"entry functions: {', '.join(sorted(self.kernels)) or '(none)'}")
        return self.kernels[kernel]

    def sass(self) -> str:
        """The SASS of every kernel, from ``cuobjdump --dump-sass`` (0.3 s; cached per CUBIN)."""
        return _dump_sass(self.cubin)

    def opcodes(self) -> tuple[str, ...]:
        """Every SASS instruction's opcode with its modifiers, in order, e.g. ``HMMA.16816.F32``."""
        return _sass_opcodes(self.sass())

    def count(self, opcode_prefix: str) -> int:
        """How many SASS instructions start with ``opcode_prefix`` (``"HMMA"``, ``"LDSM"``, ``"LDGSTS"``)."""
        return sum(n for op, n in Counter(self.opcodes()).items() if op.startswith(opcode_prefix))


def compile_cuda(source: str, arch: str = "sm_80", *, name: str = "kernel", options: Sequence[str] = (),
                 backend: str = "auto", cache_dir: str | os.PathLike | None = None) -> CompiledKernel:
    """Compile ``source`` for ``arch`` (any ``compile_target``: the generator's sm_80 / sm_90 / sm_90a, or the
    sm_XY of another GPU, e.g. sm_120); raises CompileError with an excerpt, the log and a repro on failure."""
    _check_arguments(arch, name, backend)
    options = tuple(options)
    backend = _resolve_backend(backend)
    key = _cache_key(source, arch, name, options, backend)
    with _MEMO_LOCK:
        kernel = _MEMO.get(key)
    if cache_dir:
        cache_dir = usable_dir(cache_dir, "NVRTC builds")
    if kernel is None and cache_dir:
        kernel = _load_from_disk(cache_dir, key)
    if kernel is None:
        kernel = _compile(source, arch, name, options, backend)
    if cache_dir and not _on_disk(cache_dir, key):
        _store_on_disk(cache_dir, key, kernel)
    with _MEMO_LOCK:
        return _MEMO.setdefault(key, kernel)


def clear_memo() -> None:
    """Forget the in-process results (the on-disk cache stays)."""
    with _MEMO_LOCK:
        _MEMO.clear()


_MEMO: dict[str, CompiledKernel] = {}
_MEMO_LOCK = threading.Lock()


def _check_arguments(arch: str, name: str, backend: str) -> None:
    compile_target(arch)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise InvalidInput(f"name {name!r} must be a C identifier (it names the .cu file in logs and repros)")
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}", hint=f"one of: {', '.join(BACKENDS)}")


def _compile(source: str, arch: str, name: str, options: tuple[str, ...], backend: str) -> CompiledKernel:
    start = time.perf_counter()
    compile_with = _nvrtc_compile if backend == "nvrtc" else _nvcc_compile
    cubin, ptx, log = compile_with(source, arch, name, options)
    seconds = time.perf_counter() - start
    return CompiledKernel(name=name, arch=arch, cubin=cubin, ptx=ptx, kernels=parse_ptxas_log(log),
                          compile_seconds=seconds, log=log, backend=backend)


def _base_options(arch: str) -> list[str]:
    return [f"--gpu-architecture={arch}", f"-I{RUNTIME_DIR}", "-std=c++17", "--ptxas-options=-v"]


# ---- NVRTC ---------------------------------------------------------------------------------------------------------

@functools.cache
def _nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's version, or None when cuda-bindings or libnvrtc is missing."""
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # ImportError, or cuda-pathfinder's DynamicLibNotFoundError for libnvrtc
        return None
    return (major, minor) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def _resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "nvrtc" if _nvrtc_version() else "nvcc"
    if backend == "nvrtc" and not _nvrtc_version():
        raise CompileError("NVRTC is not available", hint="pip install cuda-bindings 'nvidia-cuda-nvrtc==13.0.*'")
    return backend


def _nvrtc_compile(source: str, arch: str, name: str, options: tuple[str, ...]) -> tuple[bytes, str, str]:
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check_nvrtc(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*_base_options(arch), *options)]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _nvrtc_text(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(f"NVRTC failed to compile {name!r} for {arch} ({result.name})",
                                 source, arch, name, options, log)
        cubin = _nvrtc_bytes(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        ptx = _nvrtc_text(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        return cubin, ptx, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _check_nvrtc(err, what: str) -> None:
    from cuda.bindings import nvrtc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err.name}")


def _nvrtc_bytes(prog, get_size, get) -> bytes:
    err, size = get_size(prog)
    _check_nvrtc(err, get_size.__name__)
    buf = b" " * size
    (err,) = get(prog, buf)
    _check_nvrtc(err, get.__name__)
    return buf


def _nvrtc_text(prog, get_size, get) -> str:
    return _nvrtc_bytes(prog, get_size, get).rstrip(b"\0").decode(errors="replace").strip()


# ---- nvcc (fallback) -----------------------------------------------------------------------------------------------

def _nvcc_command(arch: str, options: tuple[str, ...], src: Path, out: Path) -> list[str]:
    return ["nvcc", "-cubin", f"-arch={arch}", *_base_options(arch)[1:], *options, "-o", str(out), str(src)]


def _nvcc_compile(source: str, arch: str, name: str, options: tuple[str, ...]) -> tuple[bytes, str, str]:
    if not shutil.which("nvcc"):
        raise CompileError("neither NVRTC nor nvcc is available",
                           hint="pip install cuda-bindings 'nvidia-cuda-nvrtc==13.0.*'")
    with tempfile.TemporaryDirectory(prefix="mugraph-nvcc-") as tmp:
        src, out = Path(tmp) / f"{name}.cu", Path(tmp) / f"{name}.cubin"
        src.write_text(source)
        cmd = _nvcc_command(arch, options, src, out)
        cmd[-3:-3] = ["--keep", "--keep-dir", tmp]  # keeps the PTX next to the CUBIN
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise _compile_error(f"nvcc failed to compile {name!r} for {arch}", source, arch, name, options, log)
        ptx = next(Path(tmp).glob("*.ptx"), None)
        return out.read_bytes(), ptx.read_text() if ptx else "", log


# ---- errors --------------------------------------------------------------------------------------------------------

def source_excerpt(source: str, line: int, context: int = 3) -> str:
    """Lines ``line-context .. line+context`` of ``source``, numbered, with ``>`` marking ``line`` (1-based)."""
    lines = source.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(f"{'>' if i == line else ' '} {i:5d} | {lines[i - 1]}" for i in range(lo, hi + 1))


def first_error_line(log: str, file_name: str) -> int | None:
    """The line of the first error the log reports in ``file_name`` (NVRTC/nvcc ``f(12): error`` or g++ ``f:12:``)."""
    pattern = re.escape(file_name) + r"(?:\((\d+)\)|:(\d+):\d+):\s+(?:catastrophic |fatal )?error"
    match = re.search(pattern, log)
    return int(match.group(1) or match.group(2)) if match else None


def _compile_error(message: str, source: str, arch: str, name: str, options: tuple[str, ...],
                   log: str) -> CompileError:
    line = first_error_line(log, f"{name}.cu")
    repro_dir = Path(tempfile.mkdtemp(prefix="mugraph-repro-"))
    src = repro_dir / f"{name}.cu"
    src.write_text(source)
    repro = shlex.join(_nvcc_command(arch, options, src, repro_dir / f"{name}.cubin"))
    return CompileError(message, log=log, source_excerpt=source_excerpt(source, line) if line else "",
                        repro=repro, hint="the excerpt marks the first reported line; the repro writes the same file")


# ---- ptxas -v ------------------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(log: str) -> Mapping[str, KernelResources]:
    """Resources per entry function from ptxas's ``-v`` report (as NVRTC or nvcc prints it)."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, str] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif m := _PROPERTIES.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props:
            frames[props] = tuple(int(g) for g in m.groups())
        elif _USED.search(line) and entry:
            used[entry] = line
    return MappingProxyType({name: _resources(line, frames.get(name, (0, 0, 0))) for name, line in used.items()})


def _resources(used_line: str, frame: tuple[int, int, int]) -> KernelResources:
    def number(pattern: str) -> int:
        m = re.search(pattern, used_line)
        return int(m.group(1)) if m else 0

    return KernelResources(registers=number(r"Used (\d+) registers"), shared_bytes=number(r"(\d+) bytes smem"),
                           spill_stores=frame[1], spill_loads=frame[2], stack_bytes=frame[0],
                           barriers=number(r"used (\d+) barriers"))


# ---- SASS ----------------------------------------------------------------------------------------------------------

def _nvidia_bin_dirs() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return [Path(root) / sub / "bin" for root in roots for sub in ("cu13", "cu12", "cuda_cuobjdump", "cuda_nvdisasm")]


def find_tool(name: str) -> Path | None:
    """A CUDA binary from the pip wheels (``nvidia/cu13/bin``), else from PATH."""
    for directory in _nvidia_bin_dirs():
        if (directory / name).is_file() and os.access(directory / name, os.X_OK):
            return directory / name
    found = shutil.which(name)
    return Path(found) if found else None


@functools.lru_cache(maxsize=64)
def _dump_sass(cubin: bytes) -> str:
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        missing = " and ".join(n for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if not p)
        raise CompileError(f"{missing} not found; SASS inspection needs both", hint=_SASS_TOOLS_HINT)
    env = dict(os.environ, PATH=f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory(prefix="mugraph-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([str(cuobjdump), "--dump-sass", str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise CompileError("cuobjdump --dump-sass failed", log=proc.stderr.strip(), hint=_SASS_TOOLS_HINT)
    return proc.stdout


_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)",
                               re.MULTILINE)


@functools.lru_cache(maxsize=64)
def _sass_opcodes(sass: str) -> tuple[str, ...]:
    return tuple(_SASS_INSTRUCTION.findall(sass))


# ---- caches --------------------------------------------------------------------------------------------------------

@functools.cache
def runtime_digest() -> str:
    """A hash of the runtime headers: part of every cache key, since kernels include them."""
    h = hashlib.sha256()
    for path in sorted(RUNTIME_DIR.iterdir()):
        if path.suffix in (".h", ".cuh"):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@functools.cache
def _toolchain_version(backend: str) -> str:
    if backend == "nvrtc":
        return f"nvrtc-{_nvrtc_version()}"
    try:
        proc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        return "nvcc-missing"  # compiling says so, with a hint
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else "nvcc-unknown"


def _cache_key(source: str, arch: str, name: str, options: tuple[str, ...], backend: str) -> str:
    parts = [source, arch, name, list(options), backend, runtime_digest(), _toolchain_version(backend)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _on_disk(cache_dir, key: str) -> bool:
    return (Path(cache_dir) / f"{key}.json").is_file() and (Path(cache_dir) / f"{key}.cubin").is_file()


def _load_from_disk(cache_dir, key: str) -> CompiledKernel | None:
    meta_path, cubin_path = Path(cache_dir) / f"{key}.json", Path(cache_dir) / f"{key}.cubin"
    if not _on_disk(cache_dir, key):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        kernels = MappingProxyType({k: KernelResources(**v) for k, v in meta.pop("kernels").items()})
        cubin = cubin_path.read_bytes()
        if not cubin:
            raise ValueError("empty CUBIN")
        return CompiledKernel(cubin=cubin, kernels=kernels, **meta)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        # a damaged entry (truncated JSON, an empty CUBIN, an older layout): compile it again
        meta_path.unlink(missing_ok=True)
        cubin_path.unlink(missing_ok=True)
        return None


def _store_on_disk(cache_dir, key: str, kernel: CompiledKernel) -> None:
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"name": kernel.name, "arch": kernel.arch, "ptx": kernel.ptx, "compile_seconds": kernel.compile_seconds,
            "log": kernel.log, "backend": kernel.backend,
            "kernels": {k: vars(v) for k, v in kernel.kernels.items()}}
    _atomic_write(directory / f"{key}.cubin", kernel.cubin)
    _atomic_write(directory / f"{key}.json", json.dumps(meta).encode())  # written last: marks the entry complete


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
