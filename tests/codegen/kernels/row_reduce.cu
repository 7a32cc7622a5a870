#include "tc_intrin.cuh"
// Softmax row statistics with warp shuffles: one warp per row of x (rows x cols, fp32) computes the row max and
// sum(exp(x - max)) by butterfly reduction, so every lane ends up with both totals. Launch 4 warps per block.

MG_DEVICE float warp_max(float v) {
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) v = mg_fmax(v, mg_shfl_xor(v, mask));
  return v;
}

MG_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) v += mg_shfl_xor(v, mask);
  return v;
}

// lane_sums[row * 32 + lane] is the sum as lane (31 - lane) holds it, fetched with an indexed shuffle.
MG_GLOBAL void row_softmax_stats(const float* __restrict__ x, float* __restrict__ row_max,
                                 float* __restrict__ row_sumexp, float* __restrict__ lane_sums, int rows, int cols) {
  const int row = mg_bid_x() * (mg_bdim_x() / 32) + mg_warp(), lane = mg_lane();
  if (row >= rows) return;  // warp-uniform: the whole warp leaves together
  const float* xr = x + (long long)row * cols;
  float m = -3.402823466e+38f;
  for (int c = lane; c < cols; c += 32) m = mg_fmax(m, xr[c]);
  m = warp_max(m);
  float s = 0.0f;
  for (int c = lane; c < cols; c += 32) s += mg_exp(xr[c] - m);
  s = warp_sum(s);
  lane_sums[row * 32 + lane] = mg_shfl_idx(s, 31 - lane);
  if (lane == 0) row_max[row] = m, row_sumexp[row] = s;
}
