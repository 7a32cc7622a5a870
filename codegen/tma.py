"""TMA tensor maps: codegen's description of each map a kernel takes (the tensor it views, its dims and strides, the
box one copy moves, the element type, the swizzle), checked against TMA's rules, and its two encodings: the CPU
harness's (what cuda_cpu_shim.h's TensorMap reads) and the driver's CUtensorMap (``cuTensorMapEncodeTiled``, for the
launchers on a GPU). A map depends on the tensor's address, so launchers encode it for the buffer they launch on and
pass its 128 bytes by value after the pointer arguments (the kernel parameter is ``const __grid_constant__``). The
driver's arguments are one record (``DriverArgs``): the CuPy launcher hands them to cuda-bindings, the XLA FFI handler
receives them without the address as a custom call attribute (``record``) and calls the driver itself."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from mugraph.codegen.hopper_layouts import SwizzleMode
from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput, NoDevice

MAP_BYTES = 128
MAX_RANK = 5
MAX_BOX = 256
CPU_MAGIC = 0x31304D414D544D47  # "MGTMAP01" read as a little-endian uint64 (cuda_cpu_shim.h kTensorMapMagic)
_CPU_LAYOUT = struct.Struct("<QQIIII5I5I5Q")  # magic, global, rank, elem bytes, swizzle width, 0, dims, box, strides

# cuda.h's enum values: CUtensorMapDataType per dtype (the swizzle's is SwizzleMode.tma_code), and the
# interleave, L2 promotion and out-of-bounds fill every map here takes
DRIVER_DTYPE = {DType.FLOAT16: 6, DType.FLOAT32: 7, DType.BFLOAT16: 9}
INTERLEAVE_NONE, L2_PROMOTION_128B, OOB_FILL_NONE = 0, 2, 0
RECORD_FIELDS = 4 * MAX_RANK + 6  # a record: dtype, rank, dims, strides, box, element strides (MAX_RANK each), 4 enums


@dataclass(frozen=True)
class DriverArgs:
    """``cuTensorMapEncodeTiled``'s arguments for one map, in its order: ``strides`` are the rank - 1 outer ones
    (bytes), the other tuples have ``rank`` entries, innermost first."""

    dtype: int
    rank: int
    address: int
    dims: tuple
    strides: tuple
    box: tuple
    element_strides: tuple
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int

    def flat(self) -> tuple:
        """Every argument as one tuple of integers, in the driver's order (what the FFI handler's decoder, mugraph
        ffi ``mg_tensor_map_args``, writes for the same map)."""
        return (self.dtype, self.rank, self.address, *self.dims, *self.strides, *self.box, *self.element_strides,
                self.interleave, self.swizzle, self.l2_promotion, self.oob_fill)


@dataclass(frozen=True)
class TensorMapSpec:
    """A tiled tensor map over the plan buffer ``buffer``: ``dims`` elements and ``strides`` bytes per dimension,
    ``box`` elements per copy, all innermost first; out-of-bounds elements of a box land as zeros."""

    buffer: str
    dtype: DType
    dims: tuple
    strides: tuple
    box: tuple
    swizzle: SwizzleMode

    def __post_init__(self):
        rank, item = len(self.dims), self.dtype.itemsize
        _check(1 <= rank <= MAX_RANK and len(self.strides) == rank and len(self.box) == rank,
               f"a tensor map has 1 to {MAX_RANK} dims with a stride and a box extent each: {self}")
        _check(all(1 <= d < 2**32 for d in self.dims), f"dims {self.dims} must be 1..2^32-1")
        _check(self.strides[0] == item, f"the innermost stride must be one element ({item} bytes), not "
                                        f"{self.strides[0]}: TMA reads rows of contiguous elements")
        _check(all(s % 16 == 0 and 0 < s < 2**40 for s in self.strides[1:]),
               f"strides {self.strides[1:]} (bytes) must be multiples of 16 below 2^40")
        _check(all(1 <= b <= MAX_BOX for b in self.box) and all(b <= d for b, d in zip(self.box, self.dims)),
               f"box {self.box} must be 1..{MAX_BOX} per dim and within dims {self.dims}")
        _check(self.box[0] * item % 16 == 0, f"the box's inner extent ({self.box[0]} x {item} bytes) must be a "
                                             "multiple of 16 bytes")
        _check(self.swizzle.width == 16 or self.box[0] * item == self.swizzle.width,
               f"a {self.swizzle.name} swizzle here takes inner boxes of exactly {self.swizzle.width} bytes, not "
               f"{self.box[0] * item}")

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def box_bytes(self) -> int:
        n = self.dtype.itemsize
        for b in self.box:
            n *= b
        return n

    def encode_cpu(self, address: int) -> bytes:
        """The CPU harness's 128 bytes for the tensor at ``address``."""
        pad = lambda values, fill: tuple(values) + (fill,) * (MAX_RANK - len(values))
        data = _CPU_LAYOUT.pack(CPU_MAGIC, address, self.rank, self.dtype.itemsize, self.swizzle.width, 0,
                                *pad(self.dims, 1), *pad(self.box, 1), *pad(self.strides, 0))
        return data + bytes(MAP_BYTES - len(data))

    def driver_args(self, address: int) -> DriverArgs:
        """The driver's arguments for the tensor at device ``address`` (no driver needed)."""
        return DriverArgs(DRIVER_DTYPE[self.dtype], self.rank, int(address), tuple(self.dims),
                          tuple(self.strides[1:]), tuple(self.box), (1,) * self.rank, INTERLEAVE_NONE,
                          self.swizzle.tma_code, L2_PROMOTION_128B, OOB_FILL_NONE)

    def record(self) -> tuple:
        """``driver_args`` but the address, each tuple padded to MAX_RANK entries with zeros: RECORD_FIELDS integers,
        the compact form an XLA custom call carries (the FFI handler encodes it at launch for the buffer's address)."""
        a = self.driver_args(0)
        pad = lambda values: tuple(values) + (0,) * (MAX_RANK - len(values))
        return (a.dtype, a.rank, *pad(a.dims), *pad(a.strides), *pad(a.box), *pad(a.element_strides),
                a.interleave, a.swizzle, a.l2_promotion, a.oob_fill)

    def encode_cuda(self, address: int) -> bytes:
        """The driver's CUtensorMap (128 bytes) for the tensor at device ``address``: what a GPU launcher passes
        for this parameter. Needs the CUDA driver (cuda-bindings and a GPU)."""
        try:
            from cuda.bindings import driver
        except ImportError as e:
            raise NoDevice("encoding a tensor map needs cuda-bindings", hint="pip install cuda-bindings") from e
        import ctypes
        a = self.driver_args(address)
        err, tmap = driver.cuTensorMapEncodeTiled(
            driver.CUtensorMapDataType(a.dtype), a.rank, a.address, list(a.dims), list(a.strides), list(a.box),
            list(a.element_strides), driver.CUtensorMapInterleave(a.interleave),
            driver.CUtensorMapSwizzle(a.swizzle), driver.CUtensorMapL2promotion(a.l2_promotion),
            driver.CUtensorMapFloatOOBfill(a.oob_fill))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise InvalidInput(f"cuTensorMapEncodeTiled failed ({err.name}) for {self}",
                               hint="the map's rules are checked on construction; the address must be 16-byte "
                                    "aligned device memory")
        return ctypes.string_at(tmap.getPtr(), MAP_BYTES)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInput(f"tensor map: {message}")
