"""Where a block graph's values live during lowering (the records every lowering module shares), and the
context a loop over a thread's elements gives the code it renders."""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.codegen.layouts import TileLayout
from mugraph.ir.dtypes import DType
from mugraph.ir.node import BNode


@dataclass(frozen=True)
class Const:
    """A block constant: its C literal."""

    text: str


@dataclass(frozen=True)
class Tile:
    """An input tile in shared memory, in its own dtype (``ptr``: this iteration's stage)."""

    buf: str
    ptr: str
    layout: TileLayout
    dtype: DType
    shape: tuple


@dataclass(frozen=True)
class Smem:
    """An fp32 value in a row-major shared buffer."""

    buf: str
    shape: tuple


@dataclass(frozen=True)
class Inline:
    """An elementwise value recomputed inside whatever reads it."""


@dataclass(frozen=True)
class Reg:
    """A value in registers, ``var`` laid out by ``layout`` (Frag, Rows or Spread)."""

    layout: object
    var: str


class Factor:
    """exp(m_prev - m_cur) of a running max: what rescaling accumulators multiply their state by."""

    op = None
    srcs = ()

    def __init__(self, m: BNode):
        self.m = m
        self.shape = m.shape


class Temp:
    """A value with no node of its own (an accumulator's per-iteration partial)."""

    op = None
    srcs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)


@dataclass(frozen=True)
class Ctx:
    """Where a loop body stands: its layout (or None for plain strided loops), shape and coordinates, and the
    register index of its own element (``slot``) and of its row (``row_slot``, in a Frag)."""

    layout: object
    shape: tuple
    coords: tuple
    slot: str = ""
    row_slot: str = ""


def describe(node) -> str:
    """A short name of a value for comments in the generated code."""
    if isinstance(node, (Factor, Temp)):
        return "rescale factor" if isinstance(node, Factor) else "partial"
    return f"{node.op.value}{list(node.shape)}"
