"""Tensor element types of the IR and their NumPy storage types."""
from __future__ import annotations

from enum import Enum

import ml_dtypes
import numpy as np

from mugraph.ir.errors import InvalidGraph


class DType(Enum):
    """Storage type of a tensor. Arithmetic inside kernels is fp32 or wider."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        return _NUMPY[self].itemsize

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def is_16bit(self) -> bool:
        return self.itemsize == 2

    @staticmethod
    def parse(value, *, field: str = "dtype") -> "DType":
        """Accept a DType, its name ("float16", "f16", "bf16") or a NumPy/JAX dtype."""
        if isinstance(value, DType):
            return value
        try:
            name = value if isinstance(value, str) else np.dtype(value).name
        except TypeError:  # not a dtype at all (e.g. an arbitrary object)
            name = ""
        found = _BY_NAME.get(name.lower())
        if found is None:
            raise InvalidGraph(f"unknown dtype {value!r}", field=field,
                               hint="use one of float16, bfloat16, float32")
        return found


_NUMPY = {DType.FLOAT16: np.dtype(np.float16), DType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
          DType.FLOAT32: np.dtype(np.float32)}
_SHORT = {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16", DType.FLOAT32: "f32"}
_BY_NAME = {d.value: d for d in DType} | {d.short: d for d in DType}


def promote(a: DType, b: DType) -> DType:
    """The dtype of a binary op's result: equal types stay, mixed types widen to float32."""
    return a if a is b else DType.FLOAT32
