"""The CPU harness: builds a kernel's ``.cu`` text with g++ against the CUDA CPU shim and runs it through ctypes.

What a kernel file looks like (the same text builds with NVRTC):

* its first line is ``#include "tc_intrin.cuh"`` (the precompiled shim header only applies when it comes first);
* kernels are ``MG_GLOBAL void name(...)`` taking pointers, integers, float or double;
* dynamic shared memory is declared in the kernel body with ``MG_SHARED_DYN(smem);``.

Entry points: ``MG_CPU_ENTRY(name)`` exports ``extern "C" int mg_cpu_launch_<name>(void** args, LaunchConfig*)``
and ``const char* mg_cpu_signature_<name>()`` (one type code per parameter, e.g. ``"ppii"``); on the GPU it
expands to nothing. ``build_cpu(source, entry="name")`` appends the macro, so generated sources need no CPU-only
line. ``args`` are pointers to the argument values, as in cuLaunchKernel; the LaunchConfig carries grid, block,
dynamic shared memory, schedule and seed in, and the shim's fault and message out. A fault never aborts the
process: ``run`` raises KernelFault with the shim's message.

sm_90a kernels run too: tensor maps are 128-byte parameters the harness encodes itself (``codegen.tma``), the
blocks of a thread-block cluster run together (``run(..., cluster=...)``), and the checking build follows TMA
copies, mbarriers and wgmma's shared-memory reads (the async proxy) as well as barriers.

Builds are cached by content in ``$MUGRAPH_CACHE_DIR/cpu`` (default ``~/.cache/mugraph/cpu``), next to a
precompiled shim header keyed by the headers' hash, the flags and the compiler.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mugraph.codegen.compile import RUNTIME_DIR, first_error_line, runtime_digest, source_excerpt
from mugraph.ir.cache_dir import usable_dir
from mugraph.ir.errors import CacheWarning, CompileError, InvalidInput, MugraphError
from mugraph.ir.settings import settings

SCHEDULES = {"rr": 0, "reverse": 1, "random": 2, "warpgreedy": 3}
LANDINGS = {"wait": 0, "commit": 1, "random": 2}
FAULT_KINDS = {1: "misaligned", 2: "deadlock", 3: "smem_out_of_bounds", 4: "divergent_collective",
               5: "bad_launch", 6: "stack_overflow", 7: "bad_argument", 8: "race", 9: "global_out_of_bounds"}
CHECK_DEFINE = "MG_SHIM_CHECK"  # build_cpu(..., defines=[CHECK_DEFINE]): the race and bounds checking build
MAX_THREADS_PER_BLOCK = 1024
MAX_SMEM_BYTES = 227 * 1024  # the largest any supported arch allows; the shim enforces the same
DEFAULT_STACK_BYTES = 256 * 1024
# -ffp-contract=off: the kernel's own a * b + c stays two roundings whatever the host, so only the emulated
# instructions (mma: one fma per product) decide where fma is used.
_BASE_FLAGS = ("-std=c++20", "-O1", "-fPIC", "-pthread", "-fvisibility=hidden", "-fno-strict-aliasing",
               "-ffp-contract=off")
_FAST_SWITCH = "-DMG_SHIM_FASTSWITCH"
_ENTRY_MACRO = re.compile(r"^\s*MG_CPU_ENTRY\(\s*(\w+)\s*\)", re.MULTILINE)

_FAULT_HINTS = {
    "misaligned": "cp.async and ldmatrix addresses must be 16-byte aligned: check tile offsets and row strides",
    "deadlock": "every thread of a block must reach each __syncthreads, and all 32 lanes of a warp each "
                "mma/ldmatrix/shfl/syncwarp",
    "smem_out_of_bounds": "a shared-memory index runs past the dynamic shared memory passed as smem_bytes",
    "divergent_collective": "lanes of one warp reached different collectives: keep warp collectives out of "
                            "lane-dependent branches",
    "stack_overflow": "a fiber ran out of stack: pass a larger stack_bytes to run()",
    "bad_launch": "check grid, block (warp collectives need whole warps) and smem_bytes against the kernel",
    "bad_argument": "an intrinsic got an operand outside its range (e.g. cp.async zfill src_bytes > 16)",
    "race": "two threads touched the same shared bytes between two barriers: a __syncthreads (or a cp.async "
            "wait_group before it) is missing between the write and the other access; on sm_90a, an mbarrier wait "
            "(TMA copies), a release of the stage after its last read, a wgmma.wait_group, or a fence.proxy.async "
            "after generic writes that wgmma reads",
    "global_out_of_bounds": "a global load or store falls outside every array passed to the launch: check the "
                            "tile origins and strides against the tensors' shapes",
}


class KernelFault(MugraphError):
    """The CPU shim stopped a kernel: misaligned address, deadlock, shared-memory overrun, bad launch...

    ``kind`` is one of FAULT_KINDS' values; the message names the block, thread, warp and lane.
    """

    def __init__(self, kind: str, message: str, *, entry: str):
        self.kind = kind
        self.entry = entry
        super().__init__(f"{entry}: {kind}: {message}", hint=_FAULT_HINTS.get(kind))


class _LaunchConfig(ctypes.Structure):  # mirrors mgshim::LaunchConfig in cuda_cpu_shim.h
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem_bytes", ctypes.c_uint64),
                ("seed", ctypes.c_uint64), ("stack_bytes", ctypes.c_uint64), ("schedule", ctypes.c_int32),
                ("landing", ctypes.c_int32), ("workers", ctypes.c_int32), ("fault", ctypes.c_int32),
                ("message", ctypes.c_char * 2048), ("blocks", ctypes.POINTER(ctypes.c_uint64)),
                ("nblocks", ctypes.c_uint64), ("ranges", ctypes.POINTER(ctypes.c_uint64)),
                ("nranges", ctypes.c_uint64), ("cluster", ctypes.c_uint32 * 3), ("reserved_", ctypes.c_uint32)]


_SCALARS = {"b": ctypes.c_int8, "B": ctypes.c_uint8, "h": ctypes.c_int16, "H": ctypes.c_uint16,
            "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
            "f": ctypes.c_float, "d": ctypes.c_double, "?": ctypes.c_bool}


@dataclass(frozen=True)
class CpuModule:
    """A built shared object with one or more kernel entry points."""

    path: Path
    entries: tuple[str, ...]
    build_seconds: float  # 0.0 when it came from the cache
    _lib: Any = field(repr=False, compare=False)

    def signature(self, entry: str) -> str:
        """The kernel's parameter type codes, e.g. ``"ppii"`` (p pointer, i int32, f float, ...)."""
        return getattr(self._lib, f"mg_cpu_signature_{self._entry(entry)}")().decode()

    def run(self, entry: str | None, args: Sequence[Any], grid, block, smem_bytes: int = 0, *,
            schedule: str | None = None, seed: int | None = None, workers: int | None = None,
            cp_async: str = "auto", stack_bytes: int = DEFAULT_STACK_BYTES, blocks: Sequence[int] | None = None,
            cluster=(1, 1, 1)) -> None:
        """Launch ``entry`` on the CPU; raises KernelFault when the shim detects a fault.

        ``blocks``: run only these blocks (linear ids, x fastest) of the grid, e.g. a sample of a large grid.
        In a check build (``defines=[CHECK_DEFINE]``) every global access must fall inside one of the numpy
        arrays passed (an address passed as an int is not a buffer the check knows).

        ``args``: numpy arrays (C-contiguous; passed by address), raw addresses or None for pointer parameters,
        128 bytes (``bytes`` or a uint8 array: a tensor map, ``codegen.tma.encode_cpu``) for tensor-map
        parameters, Python numbers for the rest. ``cluster``: thread-block cluster dims; a cluster's blocks run
        together (distributed shared memory, barrier.cluster). ``schedule``: rr | reverse | random | warpgreedy, with ``seed`` for the
        last two. ``cp_async``: when a committed copy group lands: ``wait`` (at the wait_group that needs it),
        ``commit`` (at once), ``random``, or ``auto`` (``wait`` for rr/reverse, ``random`` otherwise). Defaults
        are read at each call: ``$MG_SHIM_SCHED`` (else rr), ``$MG_SHIM_SEED`` (else 0), ``$MG_SHIM_WORKERS``
        (else the CPU count).
        """
        name = self._entry(entry)
        keep_alive = _pack_args(name, self.signature(name), args)
        pointers = (ctypes.c_void_p * max(1, len(keep_alive)))(*[ctypes.addressof(a) for a in keep_alive])
        cfg = _launch_config(grid, block, smem_bytes, schedule, seed, workers, cp_async, stack_bytes)
        cfg.cluster[:] = _dims(cluster, "cluster")
        ids = None
        if blocks is not None:
            ids = (ctypes.c_uint64 * max(1, len(blocks)))(*[int(b) for b in blocks])
            cfg.blocks, cfg.nblocks = ctypes.cast(ids, ctypes.POINTER(ctypes.c_uint64)), len(blocks)
        spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in args if isinstance(a, np.ndarray)]
        ranges = (ctypes.c_uint64 * max(1, 2 * len(spans)))(*[x for span in spans for x in span])
        cfg.ranges, cfg.nranges = ctypes.cast(ranges, ctypes.POINTER(ctypes.c_uint64)), len(spans)
        if getattr(self._lib, f"mg_cpu_launch_{name}")(pointers, ctypes.byref(cfg)) != 0:
            kind = FAULT_KINDS.get(cfg.fault, f"fault {cfg.fault}")
            raise KernelFault(kind, cfg.message.decode(errors="replace"), entry=name)

    def _entry(self, entry: str | None) -> str:
        if entry is None and len(self.entries) == 1:
            return self.entries[0]
        if entry not in self.entries:
            raise InvalidInput(f"no CPU entry {entry!r} in {self.path.name}",
                               hint=f"entries: {', '.join(self.entries) or '(none: add MG_CPU_ENTRY(name))'}")
        return entry


def build_cpu(source: str, entry: str | Sequence[str] | None = None, *, defines: Sequence[str] = (),
              fast_switch: bool = True, pch: bool = True, cache_dir: str | os.PathLike | None = None) -> CpuModule:
    """Compile ``source`` with g++ into a cached shared object and load it.

    ``entry`` names kernels to export (MG_CPU_ENTRY is appended for those the source does not export itself).
    ``defines`` are ``NAME`` or ``NAME=VALUE`` macros. ``fast_switch=False`` selects the portable ucontext fibers.
    """
    source = _with_entries(source, [entry] if isinstance(entry, str) else list(entry or ()))
    entries = tuple(dict.fromkeys(_ENTRY_MACRO.findall(source)))
    if not entries:
        raise InvalidInput("the source exports no kernel", hint="pass entry='kernel_name' or add MG_CPU_ENTRY(name)")
    flags = _header_flags(fast_switch)
    macros = _macros(defines)
    cache = usable_dir(Path(cache_dir) if cache_dir else cache_root() / "cpu", "CPU-harness builds")
    key = _digest([source, flags, macros, runtime_digest(), _compiler_version()])
    with _MEMO_LOCK:
        if (cache, key) in _MEMO:
            return _MEMO[cache, key]
    so, seconds = _build(source, flags, macros, cache, key, pch)
    try:
        lib = _load(so, entries)
    except (OSError, AttributeError, CompileError) as e:
        # a garbage, empty or stale .so (a crash mid-write, a full disk, an older shim): rebuild it
        warnings.warn(f"CPU-harness build {so.name} was unusable ({type(e).__name__}); rebuilding it",
                      CacheWarning, stacklevel=2)
        so.unlink(missing_ok=True)
        so, seconds = _build(source, flags, macros, cache, key, pch)
        lib = _load(so, entries)
    module = CpuModule(path=so, entries=entries, build_seconds=seconds, _lib=lib)
    with _MEMO_LOCK:
        return _MEMO.setdefault((cache, key), module)


def cache_root() -> Path:
    """mugraph's cache folder: ``$MUGRAPH_CACHE_DIR``, else ``~/.cache/mugraph``."""
    return Path(os.environ.get("MUGRAPH_CACHE_DIR") or Path.home() / ".cache" / "mugraph")


def clear_memo() -> None:
    """Forget the modules built in this process (their cached .so files stay on disk)."""
    with _MEMO_LOCK:
        _MEMO.clear()


_MEMO: dict[tuple[Path, str], CpuModule] = {}
_MEMO_LOCK = threading.Lock()


def _with_entries(source: str, entries: list[str]) -> str:
    exported = set(_ENTRY_MACRO.findall(source))
    for name in entries:
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise InvalidInput(f"entry {name!r} is not a C identifier")
    missing = [name for name in entries if name not in exported]
    return source + "".join(f"\nMG_CPU_ENTRY({name})" for name in missing) + ("\n" if missing else "")


def _header_flags(fast_switch: bool) -> list[str]:
    """The flags the precompiled header is built with; a kernel's own -D macros are not among them."""
    return [*_BASE_FLAGS, *_host_fma_flag(), *([_FAST_SWITCH] if fast_switch else [])]


@functools.cache
def _host_fma_flag() -> tuple[str, ...]:
    """``-mfma`` where the CPU has it: std::fma becomes one instruction instead of a libm call (the mma emulation
    runs 1.5-2.5x faster), with bit-identical results."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return ()
    return ("-mfma",) if platform.machine() == "x86_64" and "fma" in flags else ()


def _macros(defines: Sequence[str]) -> list[str]:
    for d in defines:
        if not re.fullmatch(r"[A-Za-z_]\w*(=.*)?", d):
            raise InvalidInput(f"define {d!r} must look like NAME or NAME=VALUE")
    return [f"-D{d}" for d in defines]


def _digest(parts: list) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


@functools.cache
def _compiler_version() -> str:
    try:
        proc = subprocess.run(["g++", "--version"], capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError("g++ not found; the CPU harness needs it", hint="apt-get install g++") from None
    return proc.stdout.splitlines()[0] if proc.stdout else "g++"


# ---- building ------------------------------------------------------------------------------------------------------

def _build(source: str, flags: list[str], macros: list[str], cache: Path, key: str,
           pch: bool) -> tuple[Path, float]:
    so = cache / f"{key}.so"
    if so.is_file():
        return so, 0.0
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / f"{key}.cu"
    src.write_text(source)
    includes = [f"-I{_pch_dir(cache, flags)}"] if pch else []
    tmp = so.with_name(f"{so.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    # Macros that tc_intrin.cuh does not use leave the PCH valid; g++ checks, and falls back to the header if not.
    cmd = ["g++", *flags, *macros, "-shared", "-Winvalid-pch", *includes, f"-I{RUNTIME_DIR}", "-x", "c++",
           str(src), "-o", str(tmp)]
    start = time.perf_counter()
    _run_gxx(cmd, source, src.name)
    os.replace(tmp, so)
    return so, time.perf_counter() - start


def _pch_dir(cache: Path, flags: list[str]) -> Path:
    """A folder holding ``tc_intrin.cuh.gch``, built once per (headers, flags, compiler).

    g++ looks for ``<header>.gch`` in each include folder before the header itself, so this folder goes first on
    the include path. The PCH must be built with the kernel's exact flags (-pthread included) or g++ ignores it.
    """
    directory = cache / "pch" / _digest([runtime_digest(), flags, _compiler_version()])
    gch = directory / "tc_intrin.cuh.gch"
    if not gch.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = gch.with_name(f"{gch.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        header = RUNTIME_DIR / "tc_intrin.cuh"
        _run_gxx(["g++", *flags, "-x", "c++-header", str(header), "-o", str(tmp)], header.read_text(), header.name)
        os.replace(tmp, gch)
    return directory


def _run_gxx(cmd: list[str], source: str, file_name: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError("g++ not found; the CPU harness needs it", hint="apt-get install g++") from None
    if proc.returncode != 0:
        log = proc.stderr.strip()
        line = first_error_line(log, file_name)
        raise CompileError(f"g++ failed to compile {file_name}", log=log,
                           source_excerpt=source_excerpt(source, line) if line else "", repro=shlex.join(cmd),
                           hint="the same .cu should also compile with NVRTC; CPU-only failures are shim bugs")


def _load(so: Path, entries: tuple[str, ...]) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(so))
    if lib.mg_shim_config_bytes() != ctypes.sizeof(_LaunchConfig):
        raise CompileError(f"{so.name} was built against a different cuda_cpu_shim.h LaunchConfig layout",
                           hint=f"delete {so.parent} and rebuild")
    for name in entries:
        launch, signature = getattr(lib, f"mg_cpu_launch_{name}"), getattr(lib, f"mg_cpu_signature_{name}")
        launch.argtypes, launch.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_LaunchConfig)], ctypes.c_int
        signature.argtypes, signature.restype = [], ctypes.c_char_p
    return lib


# ---- launching -----------------------------------------------------------------------------------------------------

def _dims(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and 1 <= d < 2**31 for d in dims):
        raise InvalidInput(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _launch_config(grid, block, smem_bytes: int, schedule: str | None, seed: int | None, workers: int | None,
                   cp_async: str, stack_bytes: int) -> _LaunchConfig:
    grid3, block3 = _dims(grid, "grid"), _dims(block, "block")
    schedule = schedule or os.environ.get("MG_SHIM_SCHED") or "rr"
    seed = _env_int("MG_SHIM_SEED", 0) if seed is None else seed
    threads = block3[0] * block3[1] * block3[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise InvalidInput(f"block {block3} has {threads} threads; at most {MAX_THREADS_PER_BLOCK}")
    if not 0 <= smem_bytes <= MAX_SMEM_BYTES:
        raise InvalidInput(f"smem_bytes={smem_bytes} is outside 0..{MAX_SMEM_BYTES}")
    if schedule not in SCHEDULES:
        raise InvalidInput(f"unknown schedule {schedule!r}", hint=f"one of: {', '.join(SCHEDULES)}")
    if cp_async != "auto" and cp_async not in LANDINGS:
        raise InvalidInput(f"unknown cp_async landing {cp_async!r}", hint=f"one of: auto, {', '.join(LANDINGS)}")
    if stack_bytes < 16384 or stack_bytes % 4096:
        raise InvalidInput(f"stack_bytes={stack_bytes} must be a multiple of 4096 and at least 16384")
    landing = cp_async if cp_async != "auto" else ("random" if schedule in ("random", "warpgreedy") else "wait")
    cfg = _LaunchConfig()
    cfg.grid[:], cfg.block[:] = grid3, block3
    if not isinstance(seed, (int, np.integer)):
        raise InvalidInput(f"seed must be an integer, got {seed!r}")
    cfg.smem_bytes, cfg.seed, cfg.stack_bytes = smem_bytes, int(seed) % 2**64, stack_bytes
    cfg.schedule, cfg.landing, cfg.workers = SCHEDULES[schedule], LANDINGS[landing], _workers(workers)
    return cfg


def _workers(workers: int | None) -> int:
    if workers is None:  # MG_SHIM_WORKERS (the shim's own debug knob) wins over MUGRAPH_CPU_WORKERS
        workers = _env_int("MG_SHIM_WORKERS", settings.cpu_workers or os.cpu_count() or 1)
    if not isinstance(workers, int) or workers < 1:
        raise InvalidInput(f"workers must be a positive integer, got {workers!r}")
    return workers


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidInput(f"${name}={value!r} is not an integer") from None


def _pack_args(entry: str, codes: str, args: Sequence[Any]) -> list[ctypes._SimpleCData]:
    if len(args) != len(codes):
        raise InvalidInput(f"{entry} takes {len(codes)} arguments (type codes {codes!r}), got {len(args)}")
    return [_pack_arg(entry, i, code, value) for i, (code, value) in enumerate(zip(codes, args))]


def _pack_arg(entry: str, index: int, code: str, value: Any) -> ctypes._SimpleCData:
    where = f"{entry} argument {index}"
    if code == "p":
        return ctypes.c_void_p(_address(where, value))
    if code == "T":
        return _tensor_map(where, value)
    ctype = _SCALARS[code]
    if code in "fd":
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidInput(f"{where} is a {ctype.__name__[2:]}, got {type(value).__name__}")
        return ctype(float(value))
    if not isinstance(value, (int, np.integer, bool, np.bool_)):
        raise InvalidInput(f"{where} is an integer ({ctype.__name__[2:]}), got {type(value).__name__}")
    bits, signed = 8 * ctypes.sizeof(ctype), code.islower()
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if code != "?" and not lo <= int(value) <= hi:
        raise InvalidInput(f"{where} = {value} does not fit {ctype.__name__[2:]}")
    return ctype(int(value))


TENSOR_MAP_BYTES = 128


def _tensor_map(where: str, value: Any):
    """A tensor map passed by value: its 128 bytes in a 64-byte aligned ctypes buffer (kept alive by the caller)."""
    data = bytes(value) if isinstance(value, (bytes, bytearray)) else \
        np.ascontiguousarray(value, np.uint8).tobytes() if isinstance(value, np.ndarray) else None
    if data is None or len(data) != TENSOR_MAP_BYTES:
        raise InvalidInput(f"{where} is a tensor map: pass its {TENSOR_MAP_BYTES} bytes (codegen.tma.encode_cpu)",
                           hint="got " + (f"{len(data)} bytes" if data is not None else type(value).__name__))
    raw = (ctypes.c_uint8 * (TENSOR_MAP_BYTES + 64))()
    pad = -ctypes.addressof(raw) % 64
    aligned = (ctypes.c_uint8 * TENSOR_MAP_BYTES).from_buffer(raw, pad)
    ctypes.memmove(aligned, data, TENSOR_MAP_BYTES)
    return aligned  # from_buffer keeps `raw` alive


def _address(where: str, value: Any) -> int | None:
    if value is None or isinstance(value, (int, np.integer)):
        return None if value is None else int(value)
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise InvalidInput(f"{where} must be C-contiguous", hint="pass np.ascontiguousarray(x)")
        return value.ctypes.data
    raise InvalidInput(f"{where} is a pointer: pass a numpy array, an address or None, got {type(value).__name__}")
