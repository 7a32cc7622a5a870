"""Each elementwise op's C snippet (a row per TOp) and the device helpers the snippets call; adding an op is a
row here (a test walks the table against TOp)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from mugraph.ir.ops import TOp

# Templates over fp32 operands {0} (and {1}); {lo}/{hi} are clamp's bounds, {to} a cast's dtype. Helpers
# (below) keep operands that appear twice from being evaluated twice.
ELEMENTWISE_C: Mapping[TOp, str] = {
    TOp.EXP: "mg_exp({0})",
    TOp.LOG: "mg_log({0})",
    TOp.SQUARE: "mg_square({0})",
    TOp.SQRT: "mg_sqrt({0})",
    TOp.RSQRT: "mg_rsqrt({0})",
    TOp.SILU: "mg_silu({0})",
    TOp.GELU: "mg_gelu({0})",
    TOp.RELU: "mg_fmax({0}, 0.0f)",
    TOp.SIGMOID: "mg_sigmoid({0})",
    TOp.TANH: "mg_tanh({0})",
    TOp.ERF: "mg_erf({0})",
    TOp.NEG: "(-{0})",
    TOp.CLAMP: "mg_fmin(mg_fmax({0}, {lo}), {hi})",
    TOp.ADD: "({0} + {1})",
    TOp.SUB: "({0} - {1})",
    TOp.MUL: "({0} * {1})",
    TOp.DIV: "({0} / {1})",
    TOp.POW: "mg_pow({0}, {1})",
    TOp.MAX: "mg_fmax({0}, {1})",
    TOp.MIN: "mg_fmin({0}, {1})",
    TOp.ABS: "mg_fabs({0})",
    TOp.LOG1P: "mg_log1p({0})",
    TOp.EXPM1: "mg_expm1({0})",
    TOp.SOFTPLUS: "mg_softplus({0})",
    TOp.LEAKY_RELU: "mg_leaky_relu({0}, {1})",
    # predicates are 0/1 floats; C comparisons are IEEE: false with a NaN operand, except !=
    TOp.GT: "({0} > {1} ? 1.0f : 0.0f)",
    TOp.GE: "({0} >= {1} ? 1.0f : 0.0f)",
    TOp.LT: "({0} < {1} ? 1.0f : 0.0f)",
    TOp.LE: "({0} <= {1} ? 1.0f : 0.0f)",
    TOp.EQ: "({0} == {1} ? 1.0f : 0.0f)",
    TOp.NE: "({0} != {1} ? 1.0f : 0.0f)",
    TOp.IS_FINITE: "mg_isfinite({0})",
    TOp.SELECT: "({0} != 0.0f ? {1} : {2})",  # a true select: the branch not taken cannot leak a NaN
    TOp.CAST: "mg_cast_{to}({0})",  # the fp32 register value rounded to the target dtype (and back)
}

# Device helpers the generated file defines after its include, emitted only when used.
HELPERS: Mapping[str, str] = {
    "mg_square": "MG_DEVICE float mg_square(float x) { return x * x; }",
    "mg_sigmoid": "MG_DEVICE float mg_sigmoid(float x) { return 1.0f / (1.0f + mg_exp(-x)); }",
    "mg_silu": "MG_DEVICE float mg_silu(float x) { return x / (1.0f + mg_exp(-x)); }",
    "mg_gelu": "MG_DEVICE float mg_gelu(float x) { return 0.5f * x * (1.0f + mg_erf(x * 0.707106781f)); }",
    # the bf16 split of an fp32 operand (three tensor-core products, codegen/mma.py): hi rounds to nearest but
    # saturates where a finite x would round to inf; lo is the rest, 0 where x is inf or NaN (so hi keeps it);
    # a cross product reads hi through mg_bf16x2_finite, so an inf operand never meets a 0 residual (inf * 0)
    "mg_bf16_hi": ("MG_DEVICE mg_bf16 mg_bf16_hi(float x) { const mg_bf16 b = mg_f2b(x); "
                   "return (x - x == 0.0f && (b & 0x7fffu) == 0x7f80u) ? (mg_bf16)(b - 1u) : b; }"),
    "mg_bf16_lo": ("MG_DEVICE mg_bf16 mg_bf16_lo(float x) { "
                   "return x - x == 0.0f ? mg_f2b(x - mg_b2f(mg_bf16_hi(x))) : (mg_bf16)0; }"),
    "mg_bf16x2_finite": ("MG_DEVICE unsigned mg_bf16x2_finite(unsigned r) { "
                         "return r & ((r & 0x7f80u) == 0x7f80u ? 0xffff0000u : 0xffffffffu) "
                         "& ((r & 0x7f800000u) == 0x7f800000u ? 0x0000ffffu : 0xffffffffu); }"),
    "mg_pow": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_pow(float x, float y) { return powf(x, y); }\n#else\n"
               "inline float mg_pow(float x, float y) { return std::pow(x, y); }\n#endif"),
    "mg_fabs": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_fabs(float x) { return fabsf(x); }\n#else\n"
                "inline float mg_fabs(float x) { return std::fabs(x); }\n#endif"),
    "mg_log1p": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_log1p(float x) { return log1pf(x); }\n#else\n"
                 "inline float mg_log1p(float x) { return std::log1p(x); }\n#endif"),
    "mg_expm1": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_expm1(float x) { return expm1f(x); }\n#else\n"
                 "inline float mg_expm1(float x) { return std::expm1(x); }\n#endif"),
    # max(x, 0) + log1p(exp(-|x|)), as XLA computes logaddexp(x, 0); NaN stays NaN (through log1p)
    "mg_softplus": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_softplus(float x) "
                    "{ return fmaxf(x, 0.0f) + log1pf(__expf(-fabsf(x))); }\n#else\n"
                    "inline float mg_softplus(float x) "
                    "{ return std::fmax(x, 0.0f) + std::log1p(std::exp(-std::fabs(x))); }\n#endif"),
    "mg_leaky_relu": "MG_DEVICE float mg_leaky_relu(float x, float s) { return x >= 0.0f ? x : s * x; }",
    "mg_cast_f16": "MG_DEVICE float mg_cast_f16(float x) { return mg_h2f(mg_f2h(x)); }",
    "mg_cast_bf16": "MG_DEVICE float mg_cast_bf16(float x) { return mg_b2f(mg_f2b(x)); }",
    "mg_cast_f32": "MG_DEVICE float mg_cast_f32(float x) { return x; }",
    "mg_isfinite": "MG_DEVICE float mg_isfinite(float x) { return x - x == 0.0f ? 1.0f : 0.0f; }",
    "mg_ninf": ("#if defined(__CUDACC__)\nMG_DEVICE float mg_ninf() { return __int_as_float(0xff800000u); }\n"
                "#else\ninline float mg_ninf() { return -HUGE_VALF; }\n#endif"),
}


def elementwise(op: TOp, args, arg=None) -> str:
    """The C expression of ``op`` applied to fp32 expressions ``args``."""
    extra = {"lo": literal(arg[0]), "hi": literal(arg[1])} if op is TOp.CLAMP else \
        {"to": arg.short} if op is TOp.CAST else {}
    return ELEMENTWISE_C[op].format(*args, **extra)


def helpers_in(text: str) -> list[str]:
    """The helper definitions ``text`` calls, and those they call, in table order (a helper precedes its users)."""
    used = {name for name in HELPERS if name + "(" in text}
    grown = True
    while grown:
        more = {name for name in HELPERS if name not in used and any(name + "(" in HELPERS[u] for u in used)}
        used |= more
        grown = bool(more)
    return [body for name, body in HELPERS.items() if name in used]


def literal(value: float) -> str:
    """An fp32 C literal that round-trips ``value`` rounded to float32 (block constants are fp32)."""
    v = float(np.float32(value))
    if not np.isfinite(v):  # -inf constants (masks), or a value beyond fp32's range
        return "mg_ninf()" if v < 0 else "(-mg_ninf())"
    if v == int(v) and abs(v) < 1e9:
        return f"{int(v)}.0f" if v >= 0 else f"-{int(-v)}.0f"
    text = f"{v:.9g}"
    return f"{text}f"
