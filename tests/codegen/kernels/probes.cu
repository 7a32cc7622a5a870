#include "tc_intrin.cuh"
// Probes of tc_intrin.cuh's instruction semantics for the tests: each writes what a lane holds or a copy lands as.

// One warp. Lane l passes the address of row l of a 32 x 8 matrix of 16-bit values (matrix j = rows 8j..8j+7)
// to ldmatrix .x{num}[.trans] and writes its registers to out[4 * l + j].
MG_GLOBAL void ldmatrix_probe(const unsigned short* __restrict__ m, unsigned* __restrict__ out, int num, int trans) {
  MG_SHARED_DYN(smem);
  unsigned short* s = (unsigned short*)smem;
  const int lane = mg_lane();
  for (int i = lane; i < 32 * 8; i += 32) s[i] = m[i];
  mg_syncthreads();
  const void* row = s + 8 * lane;
  unsigned r1[1] = {0}, r2[2] = {0, 0}, r4[4] = {0, 0, 0, 0};
  if (num == 1) trans ? mg_ldmatrix_x1_trans(r1, row) : mg_ldmatrix_x1(r1, row);
  if (num == 2) trans ? mg_ldmatrix_x2_trans(r2, row) : mg_ldmatrix_x2(r2, row);
  if (num == 4) trans ? mg_ldmatrix_x4_trans(r4, row) : mg_ldmatrix_x4(r4, row);
  const unsigned* r = num == 1 ? r1 : num == 2 ? r2 : r4;
  for (int j = 0; j < 4; ++j) out[4 * lane + j] = j < num ? r[j] : 0u;
}

// One warp: d = a * b + c on fragment registers given per lane (a: 4, b: 2, c and d: 4 per lane).
MG_GLOBAL void mma_probe(const unsigned* __restrict__ a, const unsigned* __restrict__ b, const float* __restrict__ c,
                         float* __restrict__ d, int bf16) {
  const int lane = mg_lane();
  unsigned ra[4], rb[2];
  float acc[4];
  for (int i = 0; i < 4; ++i) ra[i] = a[4 * lane + i], acc[i] = c[4 * lane + i];
  for (int i = 0; i < 2; ++i) rb[i] = b[2 * lane + i];
  if (bf16)
    mg_mma_m16n8k16_bf16(acc, ra, rb);
  else
    mg_mma_m16n8k16_f16(acc, ra, rb);
  for (int i = 0; i < 4; ++i) d[4 * lane + i] = acc[i];
}

// Every conversion of tc_intrin.cuh over n inputs (grid-stride loop).
MG_GLOBAL void convert_probe(const float* __restrict__ f, mg_half* __restrict__ f2h, mg_bf16* __restrict__ f2b,
                             const mg_half* __restrict__ h, float* __restrict__ h2f, const mg_bf16* __restrict__ b,
                             float* __restrict__ b2f, int n) {
  for (int i = mg_bid_x() * mg_bdim_x() + mg_tid_x(); i < n; i += mg_gdim_x() * mg_bdim_x()) {
    f2h[i] = mg_f2h(f[i]);
    f2b[i] = mg_f2b(f[i]);
    h2f[i] = mg_h2f(h[i]);
    b2f[i] = mg_b2f(b[i]);
  }
}

// Thread t copies 16 bytes with cp.async zfill, src_bytes[t] of them from src; out gets what landed.
MG_GLOBAL void zfill_probe(const unsigned char* __restrict__ src, unsigned char* __restrict__ out,
                           const int* __restrict__ src_bytes) {
  MG_SHARED_DYN(smem);
  const int t = mg_tid_x();
  mg_cp_async16_zfill(smem + 16 * t, src + 16 * t, src_bytes[t]);
  mg_cp_async_wait_all();
  mg_syncthreads();
  for (int i = 0; i < 16; ++i) out[16 * t + i] = smem[16 * t + i];
}

// One thread copies 16 bytes with cp.async and reads shared memory right after the commit (out[0..3]; a race on
// the GPU) and after the wait (out[4..7]): shows when the shim lands the copy.
MG_GLOBAL void landing_probe(const float* __restrict__ src, float* __restrict__ out) {
  MG_SHARED_DYN(smem);
  const float* s = (const float*)smem;
  mg_cp_async16(smem, src);
  mg_cp_async_commit();
  for (int i = 0; i < 4; ++i) out[i] = s[i];
  mg_cp_async_wait_group<0>();
  for (int i = 0; i < 4; ++i) out[4 + i] = s[i];
}
