"""The renderer's tables: each op's C snippet, each dtype's storage and conversions, each accumulator's rule.

Everything the generator writes about an op's meaning comes from these tables (keyed by TOp / BOp / DType);
the lowering only decides where values live and how threads walk them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from mugraph.codegen.fragments import MMA_M16N8K16
from mugraph.codegen.snippets import ELEMENTWISE_C, HELPERS, elementwise, helpers_in, literal  # noqa: F401
from mugraph.ir.dtypes import DType
from mugraph.ir.ops import BOp

# ---- dtypes -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CType:
    """How a tensor dtype is stored and converted: ``load`` widens a stored value to fp32, ``store`` rounds."""

    storage: str
    load: str    # format string with {}
    store: str


DTYPE_C: Mapping[DType, CType] = {
    DType.FLOAT16: CType("mg_half", "mg_h2f({})", "mg_f2h({})"),
    DType.BFLOAT16: CType("mg_bf16", "mg_b2f({})", "mg_f2b({})"),
    DType.FLOAT32: CType("float", "{}", "{}"),
}

# The tensor-core instruction per 16-bit operand dtype (fp32 accumulation).
MMA_C: Mapping[DType, str] = {d: MMA_M16N8K16.intrinsic(d.short) for d in (DType.FLOAT16, DType.BFLOAT16)}

# An fp32 operand of a tensor-core product as two bf16 halves: x ~ hi + lo.
SPLIT_C: Mapping[str, object] = {"hi": "mg_bf16_hi({})".format, "lo": "mg_bf16_lo({})".format}

# ---- reductions and accumulators ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Combine:
    """An associative fp32 combine with its identity."""

    identity: str
    template: str  # {0} op {1}

    def __call__(self, a: str, b: str) -> str:
        return self.template.format(a, b)


SUM = Combine("0.0f", "{0} + {1}")
MAX = Combine("mg_ninf()", "mg_fmax({0}, {1})")

REDUCE_C: Mapping[BOp, Combine] = {BOp.REDUCE_SUM: SUM, BOp.REDUCE_MAX: MAX}


@dataclass(frozen=True)
class AccRule:
    """An accumulator: its initial value, how an iteration's value joins it, and its final transform.

    ``last``: the value is first reduced over its last dim; ``square``: it is squared before (acc_rms_last);
    ``rescale``: the state is multiplied by exp(m_prev - m_cur) of a running max before the join;
    ``final``: applied once after the loop ({0} the state, {n} the count of summed squares).
    """

    combine: Combine
    last: bool = False
    square: bool = False
    rescale: bool = False
    final: str | None = None


ACC_C: Mapping[BOp, AccRule] = {
    BOp.ACC_SUM: AccRule(SUM),
    BOp.ACC_SUM_LAST: AccRule(SUM, last=True),
    BOp.ACC_RMS_LAST: AccRule(SUM, last=True, square=True, final="mg_sqrt({0} / {n})"),
    BOp.ACC_MAX: AccRule(MAX),
    BOp.ACC_MAX_LAST: AccRule(MAX, last=True),
    BOp.ACC_SUM_RESCALE: AccRule(SUM, rescale=True),
    BOp.ACC_SUM_LAST_RESCALE: AccRule(SUM, last=True, rescale=True),
}

# ---- text ----------------------------------------------------------------------------------------------------


class CodeWriter:
    """Lines with indentation, for readable generated code."""

    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def __call__(self, *lines: str) -> "CodeWriter":
        for line in lines:
            for part in line.split("\n"):
                self.lines.append(part if part.startswith("#") or not part else "  " * self.level + part)
        return self

    def open(self, head: str) -> "CodeWriter":
        self(head + " {" if head else "{")
        self.level += 1
        return self

    def close(self, tail: str = "}") -> "CodeWriter":
        self.level -= 1
        return self(tail)

    def extend(self, lines) -> "CodeWriter":
        return self(*lines)

    def text(self) -> str:
        return "\n".join(self.lines)
