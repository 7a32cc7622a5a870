"""A hand-written sm_90a module whose one launch runs in thread-block clusters, for the launchers' cluster path (the
CPU harness, the CuPy runtime's cuLaunchKernelEx, the XLA FFI handler's): each block of a cluster of ``size``
publishes a row of partials and its partial maximum in its own shared memory; after a cluster barrier rank 0
combines the cluster's rows through distributed shared memory (sum of partial_r * exp(max_r - max), the split-KV
combine), and every block reads its right neighbour's first partial. The kernel takes no cluster shape of its own
(no ``__cluster_dims__``): the launch sets it.

    part (8, 40) f32, pmax (8,) f32  ->  out (8 / size, 40) f32, seen (8,) f32, ranks (8,) f32
"""
from __future__ import annotations

import numpy as np

from mugraph.codegen.generate import GeneratedModule
from mugraph.codegen.plan import Buffer, KernelLaunch, LaunchPlan
from mugraph.ir import DType

BLOCKS, N = 8, 40

SOURCE = r"""#include "tc_intrin.cuh"
constexpr int N = 40;

MG_GLOBAL void cluster_combine(const float* __restrict__ part, const float* __restrict__ pmax,
                               float* __restrict__ out, float* __restrict__ seen, float* __restrict__ ranks) {
  MG_SHARED_DYN(smem);
  float* mine = (float*)smem;  // [0] max, [1..N] partials
  const unsigned rank = mg_cluster_rank(), size = mg_cluster_size(), block = mg_bid_x();
  for (int i = mg_tid_x(); i < N; i += mg_bdim_x()) mine[1 + i] = part[block * N + i];
  if (mg_tid_x() == 0) {
    mine[0] = pmax[block];
    ranks[block] = (float)rank;
  }
  mg_cluster_sync();
  if (mg_tid_x() == 0) seen[block] = mg_ld_dsmem(mg_mapa(mine, (rank + 1) % size) + 1);
  if (rank == 0) {
    for (int i = mg_tid_x(); i < N; i += mg_bdim_x()) {
      float m = -1e30f, acc = 0.0f;
      for (unsigned r = 0; r < size; ++r) m = mg_fmax(m, mg_ld_dsmem(mg_mapa(mine, r)));
      for (unsigned r = 0; r < size; ++r) {
        const float* other = mg_mapa(mine, r);
        acc += mg_ld_dsmem(other + 1 + i) * mg_exp(mg_ld_dsmem(other) - m);
      }
      out[(block / size) * N + i] = acc;
    }
  }
  mg_cluster_sync();
}
"""


def module(size: int = 2) -> GeneratedModule:
    f32 = DType.FLOAT32
    buffers = (Buffer("part", (BLOCKS, N), f32, "input"), Buffer("pmax", (BLOCKS,), f32, "input"),
               Buffer("out", (BLOCKS // size, N), f32, "output"), Buffer("seen", (BLOCKS,), f32, "output"),
               Buffer("ranks", (BLOCKS,), f32, "output"))
    launch = KernelLaunch("cluster_combine", "custom", (BLOCKS, 1, 1), (64, 1, 1), 4 * (N + 1),
                          ("part", "pmax", "out", "seen", "ranks"), cluster=(size, 1, 1))
    plan = LaunchPlan((launch,), buffers, ("part", "pmax"), ("out", "seen", "ranks"))
    return GeneratedModule(SOURCE, plan, "sm_90a", (SOURCE,))


def inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (BLOCKS, N)).astype(np.float32), rng.uniform(-2, 2, BLOCKS).astype(np.float32)]


def expected(part: np.ndarray, pmax: np.ndarray, size: int) -> list[np.ndarray]:
    groups = pmax.reshape(-1, size)
    weights = np.exp(groups - groups.max(axis=1, keepdims=True))[..., None]
    right = [b // size * size + (b % size + 1) % size for b in range(BLOCKS)]
    return [(part.reshape(-1, size, N) * weights).sum(axis=1), part[right, 0],
            np.asarray([b % size for b in range(BLOCKS)], np.float32)]
