"""Builds the sm_90 probe kernels (tests/codegen/kernels_sm90) with the wgmma probes generated per n, and the
independent readings of the PTX ISA's / CuTe's tables the emulation tests compare with.

The readings are written from CuTe's (shape, stride) notation (cute/atom/mma_traits_sm90_gmma.hpp: CLayout_64xN,
ALayout_64x16; make_gmma_desc's canonical layouts in 16-byte units) and CuTe's Swizzle<B, M, S>, evaluated the CuTe
way (a flat index splits colexicographically over a shape); they share no code with codegen/hopper_layouts.py.
"""
from __future__ import annotations

from pathlib import Path

from mugraph.codegen import wgmma_intrinsics
from mugraph.codegen.cpu import build_cpu

KERNELS = Path(__file__).parent / "kernels_sm90"
WGMMA_NS = (8, 64, 256)
# wgmma probe variants: (A from registers?, imm-trans-a, imm-trans-b)
VARIANTS = {0: (False, 0, 0), 1: (False, 0, 1), 2: (False, 1, 0), 3: (False, 1, 1), 4: (True, 0, 0), 5: (True, 0, 1)}


# ---- CuTe's layouts, evaluated as CuTe does ------------------------------------------------------------------------

def _flatten(t):
    return [x for e in t for x in _flatten(e)] if isinstance(t, tuple) else [t]


def cute(shape, stride, index: int) -> int:
    """The offset a (shape, stride) layout maps flat ``index`` to (colexicographic: the first mode fastest)."""
    offset = 0
    for s, d in zip(_flatten(shape), _flatten(stride)):
        offset += (index % s) * d
        index //= s
    return offset


def cute_swizzle(bits: int, base: int, shift: int, x: int) -> int:
    """CuTe's Swizzle<B, M, S>: bits [M + S, M + S + B) XORed into bits [M, M + B)."""
    mask = ((1 << bits) - 1) << (base + shift)
    return x ^ ((x & mask) >> shift)


def wgmma_d_cute(n: int, thread: int, value: int) -> tuple[int, int]:
    """(m, n) of accumulator value ``value`` of ``thread``: CLayout_64xN into the 64 x n tile (m + 64 n)."""
    off = cute((4, 8, 4), (128, 1, 16), thread) + cute((2, 2, n // 8), (64, 8, 512), value)
    return off % 64, off // 64


def wgmma_a_cute(thread: int, value: int) -> tuple[int, int]:
    """(m, k) of A value ``value`` (register value // 2, half value % 2): ALayout_64x16 into 64 x 16 (m + 64 k)."""
    off = cute((4, 8, 4), (128, 1, 16), thread) + cute((2, 2, 2), (64, 8, 512), value)
    return off % 64, off // 64


# make_gmma_desc's canonical layouts for 16-bit values, in 16-byte units: per (major, swizzle bits B), the shape and
# stride of the MN coordinate's chunk part and of the K coordinate; "LBO" / "SBO" name the descriptor fields
# (their byte values / 16). K-major: ((8, m), 2 chunks) : ((W, SBO), LBO | 1) with W = 1, 2, 4, 8 chunks per row;
# MN-major: ((W, m), (8, k)) : ((1, LBO), (W, SBO)), and for no swizzle ((1, m), (8, k)) : ((X, SBO), (1, LBO)).
CANONICAL = {
    ("K", 0): (((8, None), (1, "SBO")), ((2,), ("LBO",))),
    ("K", 1): (((8, None), (2, "SBO")), ((2,), (1,))),
    ("K", 2): (((8, None), (4, "SBO")), ((2,), (1,))),
    ("K", 3): (((8, None), (8, "SBO")), ((2,), (1,))),
    ("MN", 0): (((1, None), (0, "SBO")), ((8, None), (1, "LBO"))),
    ("MN", 1): (((2, None), (1, "LBO")), ((8, None), (2, "SBO"))),
    ("MN", 2): (((4, None), (1, "LBO")), ((8, None), (4, "SBO"))),
    ("MN", 3): (((8, None), (1, "LBO")), ((8, None), (8, "SBO"))),
}


def _resolve(mode, lbo16: int, sbo16: int, extent: int):
    shape, stride = mode
    shape = tuple(extent if s is None else s for s in shape)
    stride = tuple(lbo16 if d == "LBO" else sbo16 if d == "SBO" else d for d in stride)
    return shape, stride


def gmma_address(major: str, bits: int, start: int, lbo: int, sbo: int, mn: int, k: int) -> int:
    """The byte a canonical layout puts 16-bit element (mn, k) at, Swizzle<bits, 4, 3> on the address."""
    mn_mode, k_mode = CANONICAL[(major, bits)]
    if major == "K":  # the element in its chunk is k % 8; chunks: MN rows, then 2 chunks of k
        chunks = cute(*_resolve(mn_mode, lbo // 16, sbo // 16, 64), mn) + \
            cute(*_resolve(k_mode, lbo // 16, sbo // 16, 1), k // 8)
        byte = 16 * chunks + 2 * (k % 8)
    else:  # the element in its chunk is mn % 8; chunks: MN chunk index, then k rows
        chunks = cute(*_resolve(mn_mode, lbo // 16, sbo // 16, 64), mn // 8) + \
            cute(*_resolve(k_mode, lbo // 16, sbo // 16, 64), k)
        byte = 16 * chunks + 2 * (mn % 8)
    return cute_swizzle(bits, 4, 3, start + byte)


# ---- the probe kernels ---------------------------------------------------------------------------------------------

def wgmma_probe(n: int) -> str:
    regs = n // 2
    calls = []
    for variant, (a_regs, ta, tb) in VARIANTS.items():
        for dt, flag in (("f16", 0), ("bf16", 1)):
            fn = wgmma_intrinsics.name(n, dt, "rs" if a_regs else "ss")
            call = f"{fn}<{tb}>(d, a, db, 1)" if a_regs else f"{fn}<{ta}, {tb}>(d, da, db, 1)"
            calls.append(f"  if (variant == {variant} && bf16 == {flag}) {call};")
    return f"""
// One warpgroup: shared memory <- img, then one wgmma.m64n{n}k16 (variant: see sm90_probes.VARIANTS) on descriptors
// built from (offset, LBO, SBO, layout type), accumulators from c[thread][i]; out[thread][i] <- the accumulators.
MG_GLOBAL void wgmma_probe_{n}(const unsigned char* __restrict__ img, int img_bytes, const float* __restrict__ c,
                               float* __restrict__ out, const unsigned* __restrict__ a_regs, int a_off, int a_lbo,
                               int a_sbo, int a_layout, int b_off, int b_lbo, int b_sbo, int b_layout, int variant,
                               int bf16) {{
  MG_SHARED_DYN(smem);
  const int t = mg_tid_x();
  for (int i = t; i < img_bytes; i += 128) smem[i] = img[i];
  mg_fence_proxy_async();
  mg_syncthreads();
  float d[{regs}];
  for (int i = 0; i < {regs}; ++i) d[i] = c[t * {regs} + i];
  const unsigned a[4] = {{a_regs[4 * t], a_regs[4 * t + 1], a_regs[4 * t + 2], a_regs[4 * t + 3]}};
  const unsigned long long da = mg_smem_desc(smem + a_off, a_lbo, a_sbo, a_layout);
  const unsigned long long db = mg_smem_desc(smem + b_off, b_lbo, b_sbo, b_layout);
  mg_wgmma_fence();
{chr(10).join(calls)}
  mg_wgmma_commit();
  mg_wgmma_wait<0>();
  for (int i = 0; i < {regs}; ++i) out[t * {regs} + i] = d[i];
}}
"""


def probe_source() -> str:
    """The probes as one .cu file: the include, the wgmma intrinsics the generated probes call, the probes."""
    probes = (KERNELS / "sm90_probes.cu").read_text().split("\n", 1)[1]
    generated = "".join(wgmma_probe(n) for n in WGMMA_NS)
    helpers = wgmma_intrinsics.helpers_in(generated)
    return "\n".join(['#include "tc_intrin.cuh"', *helpers, generated, probes])


def entries() -> list[str]:
    return ["tma_probe", "mbarrier_probe", "cluster_probe"] + [f"wgmma_probe_{n}" for n in WGMMA_NS]


def build(defines=()):
    return build_cpu(probe_source(), entries(), defines=list(defines))
