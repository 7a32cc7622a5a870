#include "tc_intrin.cuh"
// Kernels with deliberate faults. The CPU shim must report each as a typed error and never abort the process.

// Lanes 0-15 shuffle while lanes 16-31 __syncwarp: two different collectives in one warp.
MG_GLOBAL void divergent_collectives(float* out) {
  const int lane = mg_lane();
  if (lane < 16)
    out[lane] = mg_shfl_xor(1.0f, 1);
  else
    mg_syncwarp();
}

// Block `fault_block` issues a cp.async whose destination starts `offset` bytes into dynamic shared memory.
MG_GLOBAL void cp_async_at(const mg_u32x4* src, int offset, int fault_block) {
  MG_SHARED_DYN(smem);
  mg_cp_async16(smem + (mg_bid_x() == (unsigned)fault_block ? offset : 0), src);
  mg_cp_async_wait_all();
}

// A plain store just past the end of dynamic shared memory: caught by the redzone check when the block ends.
MG_GLOBAL void store_past_end(int smem_floats) {
  MG_SHARED_DYN(smem);
  if (mg_tid_x() == 0) ((float*)smem)[smem_floats] = 1.0f;
}

// Lanes 16-31 return; lanes 0-15 wait in mma.sync for lanes that are gone.
MG_GLOBAL void mma_after_exit(float* out) {
  if (mg_lane() >= 16) return;
  unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  mg_mma_m16n8k16_f16(d, a, b);
  out[mg_lane()] = d[0];
}

// ldmatrix in a block whose second warp has only 16 lanes (launch with 48 threads).
MG_GLOBAL void ldmatrix_partial_warp(unsigned* out) {
  MG_SHARED_DYN(smem);
  unsigned r[1];
  mg_ldmatrix_x1(r, smem + 16 * (mg_lane() % 8));
  out[mg_tid_x()] = r[0];
}

// Recursion with 4 KiB frames, for overflowing a small fiber stack.
MG_DEVICE int deep(volatile unsigned char* parent, int depth) {
  volatile unsigned char frame[4096];
  for (int i = 0; i < 4096; ++i) frame[i] = (unsigned char)(depth + parent[i % 64]);
  return depth == 0 ? frame[7] : deep(frame, depth - 1) + frame[depth];
}
MG_GLOBAL void recurse(int* out, int depth) {
  volatile unsigned char seed[64] = {0};
  out[mg_tid_x()] = deep(seed, depth);
}
