"""Table values: the constant tensor a TABLE node holds (RoPE's cos and sin tables, a mask closed
over by the traced function), as an immutable, hashable record so nodes stay interned.

A table is what XLA would constant-fold: a tensor computed from shapes and constants alone. The
front end folds one where the IR has no op for the computation (cos, sin) or where it arrives
as a closed-over array. Its values are stored rounded to the table's dtype, as float64 bytes.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from mugraph.ir.errors import InvalidGraph

MAX_ELEMENTS = 1 << 20   # a larger constant is a weight: pass it as an argument


class TableValues:
    """The values of a table, compared and hashed by content (a digest names it in messages)."""

    __slots__ = ("data", "digest", "is_mask")

    def __init__(self, values):
        array = np.ascontiguousarray(np.asarray(values, np.float64))
        if not np.all(~np.isnan(array)):
            raise InvalidGraph("a table holds nan",
                               hint="constants are floats or +-inf; NaN is no value to compute with")
        self.data = array.tobytes()
        self.digest = hashlib.sha1(self.data + repr(array.shape).encode()).hexdigest()[:12]
        self.is_mask = bool(np.all((array == 0.0) | (array == 1.0)))

    def array(self, shape) -> np.ndarray:
        return np.frombuffer(self.data, np.float64).reshape(shape)

    def __len__(self) -> int:
        return len(self.data) // 8

    def __eq__(self, other) -> bool:
        return isinstance(other, TableValues) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"table#{self.digest}"

    def __reduce__(self):
        return (_rebuild, (self.data,))


def _rebuild(data: bytes) -> TableValues:
    return TableValues(np.frombuffer(data, np.float64))


def table_arg(values, dtype) -> tuple:
    """(TableValues, shape, dtype) for a TABLE node: `values` rounded to `dtype`."""
    array = np.asarray(values)
    if array.size > MAX_ELEMENTS:
        raise InvalidGraph(f"a constant tensor of {array.size} elements is too large to hold in "
                           "the graph", hint="pass it as an argument of the traced function")
    rounded = array.astype(np.float64).astype(dtype.numpy).astype(np.float64)
    shape = tuple(int(d) for d in array.shape) or (1,)
    return TableValues(rounded.reshape(-1)), shape, dtype


def table_elements(arg) -> int:
    return math.prod(arg[1])
