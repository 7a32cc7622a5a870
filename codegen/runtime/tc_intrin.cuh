// tc_intrin.cuh -- the one intrinsic header every generated kernel includes: each PTX instruction sits next to
// its CPU emulation, so one .cu file builds with NVRTC/nvcc for the GPU and with g++ against cuda_cpu_shim.h.
//
// Under NVRTC this header includes nothing (NVRTC has no host standard headers); 16-bit floats are raw bits.
// Fragment layouts follow the PTX ISA tables; codegen/fragments.py states the same maps in Python.
#pragma once

typedef unsigned short mg_half;  // IEEE binary16, raw bits (the bits of numpy.float16)
typedef unsigned short mg_bf16;  // bfloat16, raw bits (the bits of ml_dtypes.bfloat16)
// mg_half and mg_bf16 are the same C type: overloads cannot tell them apart, so every conversion is named.

#if defined(__CUDACC__)
#define MG_GLOBAL extern "C" __global__
#define MG_DEVICE __device__ __forceinline__
#define MG_LAUNCH_BOUNDS(...) __launch_bounds__(__VA_ARGS__)  // (threads[, CTAs per SM])
#define MG_SHARED_DYN(name) extern __shared__ __align__(128) unsigned char name[]
#define MG_CPU_ENTRY(kernel)  // the CPU entry point exists only in g++ builds
#else
#include "cuda_cpu_shim.h"
#define MG_GLOBAL extern "C"
#define MG_DEVICE inline
#define MG_LAUNCH_BOUNDS(...)
#define MG_SHARED_DYN(name) unsigned char* const name = mgshim::dynamic_smem()
#endif

// Pointer types of kernel parameters and shared buffers. The CPU harness's check builds (-DMG_SHIM_CHECK) make
// them checked pointers: every element access is judged (shared-memory races between barriers, global bounds).
#if defined(MG_SHIM_CHECK) && !defined(__CUDACC__)
#define MG_PARAM(T) mgshim::Checked<T>
#define MG_SPTR(T) mgshim::Checked<T>
#else
#define MG_PARAM(T) T* __restrict__
#define MG_SPTR(T) T*
#endif

struct __align__(16) mg_u32x4 {  // 16 bytes, for vectorised global/shared copies
  unsigned x, y, z, w;
};

struct __align__(64) mg_tmap {  // a TMA tensor map (CUtensorMap: 128 opaque bytes; the CPU harness has its own)
  unsigned long long w[16];
};

// Whole-vector stores through a typed address (codegen writes these instead of casting, so checks see them).
#if defined(__CUDACC__)
MG_DEVICE void mg_st16(void* p, mg_u32x4 v) { *(mg_u32x4*)p = v; }
MG_DEVICE void mg_st32(void* p, unsigned v) { *(unsigned*)p = v; }
#else
inline void mg_st16(void* p, mg_u32x4 v) {
  mgshim::memory_access(p, 16, true, "16-byte store");
  std::memcpy(p, &v, 16);
}
inline void mg_st32(void* p, unsigned v) {
  mgshim::memory_access(p, 4, true, "4-byte store");
  std::memcpy(p, &v, 4);
}
#endif

// ---- thread and block indices ---------------------------------------------------------------------------------
MG_DEVICE unsigned mg_tid_x() { return threadIdx.x; }
MG_DEVICE unsigned mg_tid_y() { return threadIdx.y; }
MG_DEVICE unsigned mg_tid_z() { return threadIdx.z; }
MG_DEVICE unsigned mg_bid_x() { return blockIdx.x; }
MG_DEVICE unsigned mg_bid_y() { return blockIdx.y; }
MG_DEVICE unsigned mg_bid_z() { return blockIdx.z; }
MG_DEVICE unsigned mg_bdim_x() { return blockDim.x; }
MG_DEVICE unsigned mg_bdim_y() { return blockDim.y; }
MG_DEVICE unsigned mg_bdim_z() { return blockDim.z; }
MG_DEVICE unsigned mg_gdim_x() { return gridDim.x; }
MG_DEVICE unsigned mg_gdim_y() { return gridDim.y; }
MG_DEVICE unsigned mg_gdim_z() { return gridDim.z; }
MG_DEVICE unsigned mg_linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
MG_DEVICE unsigned mg_lane() { return mg_linear_tid() & 31u; }
MG_DEVICE unsigned mg_warp() { return mg_linear_tid() >> 5; }

// ---- barriers -------------------------------------------------------------------------------------------------
#if defined(__CUDACC__)
MG_DEVICE void mg_syncthreads() { __syncthreads(); }
MG_DEVICE void mg_syncwarp() { __syncwarp(); }
#else
inline void mg_syncthreads() { mgshim::block_barrier(); }
inline void mg_syncwarp() { mgshim::warp_collective("__syncwarp", [](mgshim::Warp&) {}); }
#endif

// ---- 16-bit float conversions: cvt on the GPU, exact round-to-nearest-even bit arithmetic on the CPU -----------
#if defined(__CUDACC__)
MG_DEVICE float mg_h2f(mg_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
MG_DEVICE mg_half mg_f2h(float f) {
  mg_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
MG_DEVICE float mg_b2f(mg_bf16 b) { return __uint_as_float((unsigned)b << 16); }  // cvt.f32.bf16 needs sm_90
MG_DEVICE mg_bf16 mg_f2b(float f) {
  mg_bf16 b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
#else
inline uint32_t mgshim_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float mgshim_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float mg_h2f(mg_half h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return mgshim_float(sign | 0x7f800000u | (man << 13));  // inf, nan (payload kept)
  if (exp == 0) {                                                          // zero, subnormal: man * 2^-24 exactly
    const float f = (float)man * 0x1p-24f;
    return sign ? -f : f;
  }
  return mgshim_float(sign | ((exp + 112u) << 23) | (man << 13));
}
inline mg_half mg_f2h(float f) {
  const uint32_t x = mgshim_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (mg_half)(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));  // nan stays a quiet nan
  if (ax >= 0x477ff000u) return (mg_half)(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                                   // normal half: drop 13 bits, ties to even
    const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return (mg_half)(sign | ((r - 0x38000000u) >> 13));     // rebias the exponent from 127 to 15
  }
  // Subnormal or zero: the result counts units of 2^-24; scaling is exact and nearbyint rounds ties to even.
  return (mg_half)(sign | (uint32_t)std::nearbyint(mgshim_float(ax) * 0x1p24f));
}
inline float mg_b2f(mg_bf16 b) { return mgshim_float((uint32_t)b << 16); }
inline mg_bf16 mg_f2b(float f) {
  const uint32_t x = mgshim_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (mg_bf16)((x >> 16) | 0x40u);  // nan stays a quiet nan
  return (mg_bf16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#endif
MG_DEVICE unsigned mg_pack2(unsigned short lo, unsigned short hi) { return (unsigned)lo | ((unsigned)hi << 16); }

// ---- fast math: CUDA built-ins (NVRTC has them without headers) / <cmath> --------------------------------------
#if defined(__CUDACC__)
MG_DEVICE float mg_exp(float x) { return __expf(x); }
// 2^x: __expf(x) is MUFU.EX2 of x * log2(e); exp2f is the MUFU.EX2 alone (SASS read here, NVRTC sm_90a: qknorm_gqa
// has 64 FMUL fewer with the scale folded; an inline-asm ex2.approx.ftz spilled 8 bytes at 128 registers instead)
MG_DEVICE float mg_exp2(float x) { return exp2f(x); }
MG_DEVICE float mg_log(float x) { return __logf(x); }
MG_DEVICE float mg_sqrt(float x) { return sqrtf(x); }
MG_DEVICE float mg_rsqrt(float x) { return rsqrtf(x); }
MG_DEVICE float mg_tanh(float x) { return tanhf(x); }
MG_DEVICE float mg_erf(float x) { return erff(x); }
// max/min propagate NaN as XLA's do (fmaxf/fminf return the other operand): a NaN makes a + b NaN
// max.NaN / min.NaN (sm_80+): one instruction that returns NaN when either operand is NaN, as XLA's max does.
MG_DEVICE float mg_fmax(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
MG_DEVICE float mg_fmin(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
#else
inline float mg_exp(float x) { return std::exp(x); }
inline float mg_exp2(float x) { return std::exp2(x); }
inline float mg_log(float x) { return std::log(x); }
inline float mg_sqrt(float x) { return std::sqrt(x); }
inline float mg_rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float mg_tanh(float x) { return std::tanh(x); }
inline float mg_erf(float x) { return std::erf(x); }
inline float mg_fmax(float a, float b) { return (a != a || b != b) ? a + b : std::fmax(a, b); }
inline float mg_fmin(float a, float b) { return (a != a || b != b) ? a + b : std::fmin(a, b); }
#endif

// ---- warp shuffles (full warp): shfl.sync.bfly / shfl.sync.idx --------------------------------------------------
#if defined(__CUDACC__)
MG_DEVICE float mg_shfl_xor(float v, int lane_mask) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lane_mask));
  return r;
}
MG_DEVICE float mg_shfl_idx(float v, int src_lane) {
  float r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(src_lane));
  return r;
}
#else
// Lane l reads lane j = l ^ mask (bfly) or j = src (idx); a j outside the warp reads l's own value, as in PTX.
inline void mgshim_shfl_complete(mgshim::Warp& w, bool xor_mode) {
  for (int l = 0; l < w.size; ++l) {
    const int j = xor_mode ? (l ^ w.in_i[l]) : w.in_i[l];
    w.out_f[l][0] = (j >= 0 && j < w.size) ? w.in_f[j][0] : w.in_f[l][0];
  }
}
inline float mgshim_shfl(float v, int arg, const char* op, void (*complete)(mgshim::Warp&)) {
  mgshim::Thread& t = mgshim::self();
  t.warp->in_f[t.lane][0] = v;
  t.warp->in_i[t.lane] = arg;
  mgshim::warp_collective(op, complete);
  return t.warp->out_f[t.lane][0];
}
inline float mg_shfl_xor(float v, int lane_mask) {
  return mgshim_shfl(v, lane_mask, "shfl.sync.bfly", [](mgshim::Warp& w) { mgshim_shfl_complete(w, true); });
}
inline float mg_shfl_idx(float v, int src_lane) {
  return mgshim_shfl(v, src_lane, "shfl.sync.idx", [](mgshim::Warp& w) { mgshim_shfl_complete(w, false); });
}
#endif

// ---- cp.async: 16-byte global -> shared copies, grouped; a group is usable after its wait_group ---------------
// zfill copies src_bytes (0..16) and zero-fills the rest of the 16 bytes: partial tiles at a tensor's edge.
#if defined(__CUDACC__)
MG_DEVICE unsigned mg_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
MG_DEVICE void mg_cp_async16(void* dst_smem, const void* src_gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(mg_smem_addr(dst_smem)), "l"(src_gmem));
}
MG_DEVICE void mg_cp_async16_zfill(void* dst_smem, const void* src_gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mg_smem_addr(dst_smem)), "l"(src_gmem),
               "r"(src_bytes));
}
MG_DEVICE void mg_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MG_DEVICE void mg_cp_async_wait_group() {  // all but the N most recent committed groups have landed
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else
inline void mg_cp_async16(void* dst_smem, const void* src_gmem) {
  mgshim::cp_async(dst_smem, src_gmem, 16, "cp.async.cg 16");
}
inline void mg_cp_async16_zfill(void* dst_smem, const void* src_gmem, int src_bytes) {
  mgshim::cp_async(dst_smem, src_gmem, (unsigned)src_bytes, "cp.async.cg 16 (zfill)");
}
inline void mg_cp_async_commit() { mgshim::cp_async_commit(); }
template <int N>
inline void mg_cp_async_wait_group() {
  static_assert(N >= 0, "cp.async.wait_group takes a non-negative group count");
  mgshim::cp_async_wait((uint32_t)N);
}
#endif
MG_DEVICE void mg_cp_async_wait_all() {
  mg_cp_async_commit();
  mg_cp_async_wait_group<0>();
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 ---------------------------------------------------
// Matrix j's 8 rows (16 bytes each) come from the addresses of lanes 8j..8j+7. Lane l receives, in register j,
// row l/4, columns 2(l%4) and 2(l%4)+1 of matrix j; with .trans, column l/4, rows 2(l%4) and 2(l%4)+1.
#if defined(__CUDACC__)
MG_DEVICE void mg_ldmatrix_x1(unsigned (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(mg_smem_addr(row)));
}
MG_DEVICE void mg_ldmatrix_x2(unsigned (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(mg_smem_addr(row)));
}
MG_DEVICE void mg_ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(mg_smem_addr(row)));
}
MG_DEVICE void mg_ldmatrix_x1_trans(unsigned (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(mg_smem_addr(row)));
}
MG_DEVICE void mg_ldmatrix_x2_trans(unsigned (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(mg_smem_addr(row)));
}
MG_DEVICE void mg_ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(mg_smem_addr(row)));
}
#else
template <int NUM, bool TRANS>
void mgshim_ldmatrix_complete(mgshim::Warp& w) {
  mgshim::require_full_warp(w, "ldmatrix");
  for (int l = 0; l < 32; ++l) {
    for (int j = 0; j < NUM; ++j) {
      const uint16_t* const* rows = (const uint16_t* const*)&w.ptr[8 * j];
      const uint16_t lo = TRANS ? rows[2 * (l % 4)][l / 4] : rows[l / 4][2 * (l % 4)];
      const uint16_t hi = TRANS ? rows[2 * (l % 4) + 1][l / 4] : rows[l / 4][2 * (l % 4) + 1];
      w.out_u[l][j] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
  }
}
template <int NUM, bool TRANS>
void mgshim_ldmatrix(unsigned* r, const void* row, const char* op) {
  mgshim::Thread& t = mgshim::self();
  if (t.lane < 8 * NUM) {  // only these lanes' addresses are read
    mgshim::check_aligned(row, 16, op, "row address");
    mgshim::check_smem(row, 16, op);
    mgshim::shared_access(row, 16, false, op);
  }
  t.warp->ptr[t.lane] = row;
  mgshim::warp_collective(op, mgshim_ldmatrix_complete<NUM, TRANS>);
  for (int j = 0; j < NUM; ++j) r[j] = t.warp->out_u[t.lane][j];
}
inline void mg_ldmatrix_x1(unsigned (&r)[1], const void* row) { mgshim_ldmatrix<1, false>(r, row, "ldmatrix.x1"); }
inline void mg_ldmatrix_x2(unsigned (&r)[2], const void* row) { mgshim_ldmatrix<2, false>(r, row, "ldmatrix.x2"); }
inline void mg_ldmatrix_x4(unsigned (&r)[4], const void* row) { mgshim_ldmatrix<4, false>(r, row, "ldmatrix.x4"); }
inline void mg_ldmatrix_x1_trans(unsigned (&r)[1], const void* row) {
  mgshim_ldmatrix<1, true>(r, row, "ldmatrix.x1.trans");
}
inline void mg_ldmatrix_x2_trans(unsigned (&r)[2], const void* row) {
  mgshim_ldmatrix<2, true>(r, row, "ldmatrix.x2.trans");
}
inline void mg_ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  mgshim_ldmatrix<4, true>(r, row, "ldmatrix.x4.trans");
}
#endif

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += a * b with fp32 accumulation ------------------------
// With g = lane/4, t = lane%4 and each 32-bit register holding two 16-bit values (low half first):
//   A (16x16): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, k x n): b0 (k = 2t..2t+1, n = g)  b1 (k = 2t+8.., n = g)
//   C/D (16x8 fp32): d0, d1 (g, 2t..2t+1)  d2, d3 (g+8, 2t..2t+1)
#if defined(__CUDACC__)
MG_DEVICE void mg_mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
MG_DEVICE void mg_mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
// Accumulates in k order with one fma per product; real HMMA's internal order differs, so compare with a tolerance.
template <float (*TO_F32)(unsigned short)>
void mgshim_mma_m16n8k16_complete(mgshim::Warp& w) {
  mgshim::require_full_warp(w, "mma.sync.m16n8k16");
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) A[g + 8 * (r & 1)][2 * t + h + 8 * (r >> 1)] = TO_F32(w.in_u[l][r] >> (16 * h));
      for (int r = 0; r < 2; ++r) B[2 * t + h + 8 * r][g] = TO_F32(w.in_u[l][4 + r] >> (16 * h));
      C[g][2 * t + h] = w.in_f[l][h];
      C[g + 8][2 * t + h] = w.in_f[l][2 + h];
    }
  }
  for (int l = 0; l < 32; ++l) {
    for (int q = 0; q < 4; ++q) {
      const int row = l / 4 + 8 * (q >> 1), col = 2 * (l % 4) + (q & 1);
      float acc = C[row][col];
      for (int k = 0; k < 16; ++k) acc = std::fma(A[row][k], B[k][col], acc);
      w.out_f[l][q] = acc;
    }
  }
}
inline float mgshim_h2f(unsigned short h) { return mg_h2f(h); }
inline float mgshim_b2f(unsigned short b) { return mg_b2f(b); }
inline void mgshim_mma(float* d, const unsigned* a, const unsigned* b, const char* op,
                       void (*complete)(mgshim::Warp&)) {
  mgshim::Thread& t = mgshim::self();
  mgshim::Warp& w = *t.warp;
  for (int i = 0; i < 4; ++i) w.in_u[t.lane][i] = a[i], w.in_f[t.lane][i] = d[i];
  for (int i = 0; i < 2; ++i) w.in_u[t.lane][4 + i] = b[i];
  mgshim::warp_collective(op, complete);
  for (int i = 0; i < 4; ++i) d[i] = w.out_f[t.lane][i];
}
inline void mg_mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  mgshim_mma(d, a, b, "mma.sync.m16n8k16.f16", mgshim_mma_m16n8k16_complete<mgshim_h2f>);
}
inline void mg_mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  mgshim_mma(d, a, b, "mma.sync.m16n8k16.bf16", mgshim_mma_m16n8k16_complete<mgshim_b2f>);
}
#endif

// ---- blocks that share one loop (split-K / split-KV): publish partial state, count finished blocks ------------
// A block writes its partial state to global memory, fences, and one thread counts it in; the block that counts
// last reads every partial (bypassing L1, which may hold none of them) and finishes the output.
#if defined(__CUDACC__)
MG_DEVICE void mg_threadfence() { __threadfence(); }
MG_DEVICE unsigned mg_atomic_inc(unsigned* counter) { return atomicAdd(counter, 1u); }
MG_DEVICE float mg_ldcg(const float* p) { return __ldcg(p); }
#else
inline void mg_threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline unsigned mg_atomic_inc(unsigned* counter) {
  mgshim::global_access(counter, 4, "atomicAdd");
  return __atomic_fetch_add(counter, 1u, __ATOMIC_SEQ_CST);
}
inline float mg_ldcg(const float* p) {
  mgshim::global_access(p, 4, "ld.global.cg");
  return *p;
}
#endif

#include "sm90_intrin.cuh"  // Hopper (sm_90a): mbarriers, TMA, wgmma, setmaxnreg, named barriers, clusters
