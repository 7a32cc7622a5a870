"""TMA tensor maps: codegen's description of each map a kernel takes (the tensor it views, its dims and strides, the
box one copy moves, the element type, the swizzle), checked against TMA's rules, and its two encodings: the CPU
harness's (what cuda_cpu_shim.h's TensorMap reads) and the driver's CUtensorMap (``cuTensorMapEncodeTiled``, for the
launchers on a GPU). A map depends on the tensor's address, so launchers encode it at each launch and pass its 128
bytes by value (the kernel parameter is ``const __grid_constant__``)."""
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

# CUtensorMapDataType member names per dtype (cuda.h)
_DRIVER_DTYPE = {DType.FLOAT16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", DType.BFLOAT16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
                 DType.FLOAT32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
_DRIVER_SWIZZLE = {16: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                   64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}


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

    def encode_cuda(self, address: int) -> bytes:
        """The driver's CUtensorMap (128 bytes) for the tensor at device ``address``: what a GPU launcher passes
        for this parameter. Needs the CUDA driver (cuda-bindings and a GPU)."""
        try:
            from cuda.bindings import driver
        except ImportError as e:
            raise NoDevice("encoding a tensor map needs cuda-bindings", hint="pip install cuda-bindings") from e
        import ctypes
        enum = driver.CUtensorMapDataType
        err, tmap = driver.cuTensorMapEncodeTiled(
            getattr(enum, _DRIVER_DTYPE[self.dtype]), self.rank, address, list(self.dims), list(self.strides[1:]),
            list(self.box), [1] * self.rank, driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(driver.CUtensorMapSwizzle, _DRIVER_SWIZZLE[self.swizzle.width]),
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise InvalidInput(f"cuTensorMapEncodeTiled failed ({err.name}) for {self}",
                               hint="the map's rules are checked on construction; the address must be 16-byte "
                                    "aligned device memory")
        return ctypes.string_at(tmap.getPtr(), MAP_BYTES)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInput(f"tensor map: {message}")
