#include "tc_intrin.cuh"
// A hand-written tensor-core GEMM through tc_intrin.cuh only: C = A @ B with A (M x K) and B (K x N) row-major
// 16-bit and C (M x N) fp32. 64x64 block tile, 4 warps of 32x32, K step 32; cp.async double buffering into
// swizzled shared memory, ldmatrix, mma.sync m16n8k16 (fp16 or bf16 in, fp32 accumulate).
// M and N must be multiples of 64 and K of 32; launch grid (N/64, M/64), 128 threads, GEMM_SMEM_BYTES.
// Defining one BUG_* macro injects that bug; tests/codegen/test_shim.py checks the CPU harness catches each.

constexpr int BM = 64, BN = 64, BK = 32, THREADS = 128;
constexpr int A_STAGE = BM * BK, B_STAGE = BK * BN;  // elements of one pipeline stage
constexpr int GEMM_SMEM_BYTES = 2 * (A_STAGE + B_STAGE) * 2;

// mugraph.codegen.fragments: render_index(choose_smem_layout(64, 32, 2)) and (32, 64, 2).
#define SMEM_A_INDEX(row, col) (((row) * 32 + (col)) ^ ((((row) * 32 + (col)) >> 3) & 24))
#define SMEM_B_INDEX(row, col) (((row) * 64 + (col)) ^ ((((row) * 64 + (col)) >> 3) & 56))

// Thread t copies 16-byte chunks t and t + 128 of each tile, chunks numbered row-major.
MG_DEVICE void load_stage(mg_half* As, mg_half* Bs, const mg_half* A, const mg_half* B, int N, int K, int m0,
                          int n0, int k0, int tid) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = tid + THREADS * i, row = c / 4, col = c % 4 * 8;
    mg_cp_async16(&As[SMEM_A_INDEX(row, col)], A + (long long)(m0 + row) * K + k0 + col);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = tid + THREADS * i, row = c / 8, col = c % 8 * 8;
    mg_cp_async16(&Bs[SMEM_B_INDEX(row, col)], B + (long long)(k0 + row) * N + n0 + col);
  }
}

template <bool BF16>
MG_DEVICE void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (BF16)
    mg_mma_m16n8k16_bf16(d, a, b);
  else
    mg_mma_m16n8k16_f16(d, a, b);
}

// One warp's 32x32 share of a stage: per k16 step, two A fragments (fragments.A_X4) and four B fragments
// (two fragments.B_X4_TRANS loads), then 2 x 4 mma.
template <bool BF16>
MG_DEVICE void compute_stage(float (&acc)[2][4][4], const mg_half* As, const mg_half* Bs, int wm, int wn,
                             int lane) {
#pragma unroll
  for (int ks = 0; ks < BK; ks += 16) {
    unsigned a[2][4], b[4][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#if defined(BUG_LDMATRIX_ROW)
      const int row = wm * 32 + mi * 16 + lane % 8;  // lanes 8-15 repeat rows 0-7
#else
      const int row = wm * 32 + mi * 16 + lane % 16;
#endif
#if defined(BUG_MISALIGNED)
      const int col = ks + 8 * (lane / 16) + 4;  // 8 bytes into a 16-byte row
#else
      const int col = ks + 8 * (lane / 16);
#endif
      mg_ldmatrix_x4(a[mi], &As[SMEM_A_INDEX(row, col)]);
    }
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      unsigned t[4];
      mg_ldmatrix_x4_trans(t, &Bs[SMEM_B_INDEX(ks + lane % 16, wn * 32 + nj * 16 + 8 * (lane / 16))]);
      b[2 * nj][0] = t[0], b[2 * nj][1] = t[1], b[2 * nj + 1][0] = t[2], b[2 * nj + 1][1] = t[3];
    }
#if defined(BUG_HALF_WARP_MMA)
    if (lane >= 16) return;  // half the warp goes on to __syncthreads while the other half waits in mma.sync
#endif
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) mma<BF16>(acc[mi][ni], a[mi], b[ni]);
  }
}

// fp32 accumulators to C through the m16n8k16 C fragment map (fragments.MMA_M16N8K16.c_coord).
MG_DEVICE void store_tile(float* C, const float (&acc)[2][4][4], int N, int m0, int n0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        C[(long long)(m0 + mi * 16 + g + 8 * (q / 2)) * N + n0 + ni * 8 + 2 * t + q % 2] = acc[mi][ni][q];
}

template <bool BF16>
MG_DEVICE void gemm(const mg_half* __restrict__ A, const mg_half* __restrict__ B, float* __restrict__ C, int N,
                    int K) {
  MG_SHARED_DYN(smem);
  mg_half* const As = (mg_half*)smem;     // stages 0, 1 of A
  mg_half* const Bs = As + 2 * A_STAGE;  // stages 0, 1 of B
  const int tid = mg_tid_x(), lane = mg_lane(), warp = mg_warp(), wm = warp / 2, wn = warp % 2;
  const int m0 = mg_bid_y() * BM, n0 = mg_bid_x() * BN, ktiles = K / BK;
  float acc[2][4][4] = {};

  load_stage(As, Bs, A, B, N, K, m0, n0, 0, tid);
  mg_cp_async_commit();
  for (int kt = 0; kt < ktiles; ++kt) {
    const int cur = kt % 2, next = (kt + 1) % 2;
    if (kt + 1 < ktiles) load_stage(As + next * A_STAGE, Bs + next * B_STAGE, A, B, N, K, m0, n0, (kt + 1) * BK, tid);
    mg_cp_async_commit();  // possibly empty, so that stage kt is always "all but the newest group"
#if !defined(BUG_NO_WAIT)
    mg_cp_async_wait_group<1>();  // this thread's copies of stage kt have landed...
#endif
#if !defined(BUG_NO_SYNC_BEFORE_READ)
    mg_syncthreads();  // ...and every other thread's
#endif
    compute_stage<BF16>(acc, As + cur * A_STAGE, Bs + cur * B_STAGE, wm, wn, lane);
#if !defined(BUG_NO_SYNC_AFTER_READ)
    mg_syncthreads();  // stage kt is fully read before iteration kt + 1 refills its buffer
#endif
  }
  store_tile(C, acc, N, m0 + wm * 32, n0 + wn * 32, lane);
}

MG_GLOBAL void MG_LAUNCH_BOUNDS(THREADS)
    gemm_f16(const mg_half* __restrict__ A, const mg_half* __restrict__ B, float* __restrict__ C, int N, int K) {
  gemm<false>(A, B, C, N, K);
}

MG_GLOBAL void MG_LAUNCH_BOUNDS(THREADS)
    gemm_bf16(const mg_bf16* __restrict__ A, const mg_bf16* __restrict__ B, float* __restrict__ C, int N, int K) {
  gemm<true>(A, B, C, N, K);
}
