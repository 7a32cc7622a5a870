"""The wgmma.mma_async intrinsics a generated sm_90a kernel calls, one C function per (n, dtype, where A comes from),
written into the kernel's file only when used: the PTX form (n/2 accumulator registers as asm operands) next to the
CPU form (sm90_intrin.cuh's emulation of the instruction).

``mg_wgmma_m64n{n}k16_{f16|bf16}_ss<TA, TB>(float* d, desc_a, desc_b, scale_d)``: A and B from shared-memory
descriptors, TA / TB the imm-trans flags (1: MN-major); ``..._rs<TB>(float* d, const unsigned (&a)[4], desc_b,
scale_d)``: A from registers (the wgmma A fragment). ``d`` points at the thread's n/2 fp32 accumulators.
"""
from __future__ import annotations

import re

from mugraph.codegen.hopper_layouts import WGMMA_NS
from mugraph.ir.errors import InvalidInput

NAME = re.compile(r"\bmg_wgmma_m64n(\d+)k16_(f16|bf16)_(ss|rs)\b")


def name(n: int, dtype: str, a_source: str) -> str:
    if n not in WGMMA_NS or dtype not in ("f16", "bf16") or a_source not in ("ss", "rs"):
        raise InvalidInput(f"no wgmma intrinsic for n={n}, {dtype}, A from {a_source}",
                           hint="n is a multiple of 8 up to 256; f16 or bf16; ss (descriptors) or rs (registers)")
    return f"mg_wgmma_m64n{n}k16_{dtype}_{a_source}"


def _ptx(n: int, dtype: str, a_source: str) -> str:
    regs = n // 2
    d = ",".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    shape = f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype}"
    if a_source == "ss":
        a, b, scale, ta, tb = f"%{regs}", f"%{regs + 1}", f"%{regs + 2}", f"%{regs + 3}", f"%{regs + 4}"
        body = f"{shape} {{{d}}}, {a}, {b}, p, 1, 1, {ta}, {tb};"
        ins = '"l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB)'
    else:
        a = ",".join(f"%{regs + i}" for i in range(4))
        b, scale, tb = f"%{regs + 4}", f"%{regs + 5}", f"%{regs + 6}"
        body = f"{shape} {{{d}}}, {{{a}}}, {b}, p, 1, 1, {tb};"
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB)'
    return (f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, {scale}, 0;\\n{body}\\n}}\\n"\n'
            f"               : {outs}\n               : {ins});")


def source(n: int, dtype: str, a_source: str) -> str:
    """The C of one intrinsic: its PTX under __CUDACC__, its emulation otherwise."""
    fn = name(n, dtype, a_source)
    bf16 = "true" if dtype == "bf16" else "false"
    if a_source == "ss":
        head, params = "template <int TA, int TB>", "float* d, unsigned long long desc_a, unsigned long long desc_b, int scale_d"
        cpu = f"mgsm90_wgmma(d, {n}, nullptr, desc_a, desc_b, scale_d, TA, TB, {bf16}, \"{fn}\");"
    else:
        head, params = "template <int TB>", "float* d, const unsigned (&a)[4], unsigned long long desc_b, int scale_d"
        cpu = f"mgsm90_wgmma(d, {n}, a, 0ull, desc_b, scale_d, 0, TB, {bf16}, \"{fn}\");"
    return "\n".join([
        "#if defined(__CUDACC__)",
        head,
        f"MG_DEVICE void {fn}({params}) {{",
        _ptx(n, dtype, a_source),
        "}",
        "#else",
        head,
        f"inline void {fn}({params}) {{ {cpu} }}",
        "#endif",
    ])


def helpers_in(text: str) -> list[str]:
    """The definitions of the wgmma intrinsics ``text`` calls, in a stable order."""
    used = sorted({(int(n), dt, src) for n, dt, src in NAME.findall(text)})
    return [source(n, dt, src) for n, dt, src in used]
