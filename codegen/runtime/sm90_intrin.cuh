// sm90_intrin.cuh -- Hopper's instructions for generated kernels (sm_90a), each PTX form next to its CPU emulation:
// mbarriers (init, arrive[.expect_tx], try_wait.parity phases, transaction counts), TMA box loads
// (cp.async.bulk.tensor with a tensor map, swizzled), wgmma.mma_async from shared-memory descriptors or registers
// (fence / commit_group / wait_group), fence.proxy.async, setmaxnreg, named barriers, and thread-block clusters
// (ranks, mapa, distributed shared memory, barrier.cluster). Included by tc_intrin.cuh.
//
// The fragment maps and swizzle widths the emulation uses are rendered from codegen/hopper_layouts.py (the generated
// block below); the descriptor's canonical layouts and the box copy follow the PTX ISA and are tested lane by lane
// against an independent reading of its tables (tests/codegen/test_hopper_layouts.py, test_hopper_emulation.py).
#pragma once

// Dynamic shared memory on a 1024-byte boundary: the 128-byte swizzle follows address bits, and codegen's index
// expressions follow it from each buffer's start (the CPU harness's arena is always so aligned).
#if defined(__CUDACC__)
#define MG_SHARED_DYN_1024(name) extern __shared__ __align__(1024) unsigned char name[]
#else
#define MG_SHARED_DYN_1024(name) MG_SHARED_DYN(name)
#endif

#if defined(__CUDACC__)
#define MG_TMAP(name) const __grid_constant__ mg_tmap name  // a tensor map kernel parameter, by value
#define MG_CLUSTER_DIMS(x, y, z) __cluster_dims__(x, y, z)  // a kernel launched in clusters of x * y * z blocks
#else
#define MG_TMAP(name) const mg_tmap name
#define MG_CLUSTER_DIMS(x, y, z)  // the CPU harness takes the cluster shape from the launch (KernelLaunch.cluster)
#endif

// ---- BEGIN GENERATED TABLES (codegen/hopper_layouts.py render_runtime_tables) ----
// wgmma.m64nNk16 fp32 accumulator: thread t (of the warpgroup), register i -> (row, col)
MG_DEVICE int mgsm90_d_row(int t, int i) { return ((t >> 2) & 7) + (t >> 5) * 16 + ((i >> 1) & 1) * 8; }
MG_DEVICE int mgsm90_d_col(int t, int i) { return (t & 3) * 2 + (i & 1) + (i >> 2) * 8; }
// wgmma.m64nNk16 A in registers: thread t, register r, half h -> (row, k)
MG_DEVICE int mgsm90_a_row(int t, int r, int h) { return ((t >> 2) & 7) + (t >> 5) * 16 + (r & 1) * 8; }
MG_DEVICE int mgsm90_a_col(int t, int r, int h) { return (t & 3) * 2 + (r >> 1) * 8 + h; }
// swizzled row width in bytes per descriptor layout type (bits 62-63) and per CUtensorMapSwizzle
MG_DEVICE int mgsm90_desc_width(int code) { const int w[4] = {16, 128, 64, 32}; return w[code & 3]; }
MG_DEVICE int mgsm90_tma_width(int code) { const int w[4] = {16, 32, 64, 128}; return w[code & 3]; }
// ---- END GENERATED TABLES ----

// ---- mbarrier: phases of `count` arrivals plus a transaction count of bytes still to land ----------------------
#if defined(__CUDACC__)
MG_DEVICE void mg_mbar_init(unsigned long long* mbar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mg_smem_addr(mbar)), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the async proxy (TMA) and the cluster; a barrier follows it.
MG_DEVICE void mg_fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
MG_DEVICE void mg_mbar_arrive(unsigned long long* mbar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(mg_smem_addr(mbar)) : "memory");
}
MG_DEVICE void mg_mbar_arrive_expect_tx(unsigned long long* mbar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mg_smem_addr(mbar)), "r"(bytes)
               : "memory");
}
// Returns once the phase of parity `parity` has completed (try_wait suspends for a while in hardware; loop on it).
MG_DEVICE void mg_mbar_wait(unsigned long long* mbar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nMG_WAIT:\n"  // a label inside braces is local to them: each inlined copy has its own
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MG_WAIT;\n}\n" ::"r"(mg_smem_addr(mbar)),
      "r"(parity)
      : "memory");
}
// Whether the phase of parity `parity` has completed, without waiting (mbarrier.test_wait.parity).
MG_DEVICE bool mg_mbar_test_wait(unsigned long long* mbar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(mg_smem_addr(mbar)), "r"(parity)
      : "memory");
  return done != 0;
}
#else
inline void mg_mbar_init(unsigned long long* mbar, unsigned count) { mgshim::mbarrier_init(mbar, (int)count); }
inline bool mg_mbar_test_wait(unsigned long long* mbar, unsigned parity) {
  return mgshim::mbarrier_test(mbar, parity, "mbarrier.test_wait.parity");
}
inline void mg_fence_mbar_init() {}
inline void mg_mbar_arrive(unsigned long long* mbar) { mgshim::mbarrier_arrive(mbar, 0, "mbarrier.arrive"); }
inline void mg_mbar_arrive_expect_tx(unsigned long long* mbar, unsigned bytes) {
  mgshim::mbarrier_arrive(mbar, bytes, "mbarrier.arrive.expect_tx");
}
inline void mg_mbar_wait(unsigned long long* mbar, unsigned parity) {
  mgshim::mbarrier_wait(mbar, parity, "mbarrier.try_wait.parity");
}
#endif

// ---- TMA: cp.async.bulk.tensor box loads into shared memory, completing bytes on an mbarrier ---------------------
// Coordinates are elements, innermost dimension first; out-of-bounds elements land as zeros; the box lands dense
// (innermost dimension fastest) and swizzled by the map's mode on shared-memory address bits.
#if defined(__CUDACC__)
MG_DEVICE void mg_tma_load_1d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];" ::"r"(
          mg_smem_addr(dst)),
      "l"(map), "r"(mg_smem_addr(mbar)), "r"(c0)
      : "memory");
}
MG_DEVICE void mg_tma_load_2d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          mg_smem_addr(dst)),
      "l"(map), "r"(mg_smem_addr(mbar)), "r"(c0), "r"(c1)
      : "memory");
}
MG_DEVICE void mg_tma_load_3d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::
          "r"(mg_smem_addr(dst)),
      "l"(map), "r"(mg_smem_addr(mbar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
MG_DEVICE void mg_tma_load_4d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2,
                              int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(mg_smem_addr(dst)),
      "l"(map), "r"(mg_smem_addr(mbar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
MG_DEVICE void mg_tma_load_5d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2,
                              int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
      "[%2];" ::"r"(mg_smem_addr(dst)),
      "l"(map), "r"(mg_smem_addr(mbar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
#else
inline uint32_t mgsm90_swizzle(uint32_t byte_address, uint32_t width) {  // Swizzle<log2(width / 16), 4, 3>
  return byte_address ^ ((byte_address >> 3) & ((width / 16 - 1) << 4));
}

template <int R>
void mgsm90_tma_load(void* dst, const mg_tmap* map, unsigned long long* mbar, const int (&coord)[R]) {
  const char* op = "cp.async.bulk.tensor";
  mgshim::Block& b = *mgshim::self().block;
  mgshim::BulkCopy c{};
  std::memcpy(&c.map, map, sizeof c.map);
  if (c.map.magic != mgshim::kTensorMapMagic)
    mgshim::fail(mgshim::kBadArgument, "%s: the tensor map was not encoded for the CPU harness "
                 "(codegen.tma.encode_cpu)", op);
  if (c.map.rank != (uint32_t)R)
    mgshim::fail(mgshim::kBadArgument, "%s.%dd with a rank-%u tensor map", op, R, c.map.rank);
  mgshim::check_aligned(dst, 128, op, "shared destination");
  uint64_t bytes = c.map.elem_bytes;
  for (int d = 0; d < R; ++d) bytes *= c.map.box[d];
  if (c.map.swizzle > 16 && c.map.box[0] * c.map.elem_bytes != c.map.swizzle)
    mgshim::fail(mgshim::kBadArgument, "%s: a %u-byte inner box with a %u-byte swizzle is not modelled (use inner "
                 "boxes of exactly the swizzle width)", op, c.map.box[0] * c.map.elem_bytes, c.map.swizzle);
  mgshim::check_smem(dst, bytes, op);
  if (!mgshim::in_block_smem(b, dst) || mgshim::smem_offset(b, dst) + bytes > b.smem_bytes)
    mgshim::fail(mgshim::kSmemOutOfBounds, "%s: the %llu-byte box does not fit dynamic shared memory", op,
                 (unsigned long long)bytes);
  mgshim::mbarrier(mbar, op);  // initialised
  c.dst = (unsigned char*)dst;
  for (int d = 0; d < R; ++d) c.coord[d] = coord[d];
  c.mbar = mbar;
  c.bytes = (uint32_t)bytes;
  c.issuer = mgshim::self().id;
  mgshim::bulk_issue(c);
}

// The box copy: every element of the box in order (innermost fastest), from the tensor or zero out of bounds, to its
// dense offset swizzled on the shared-memory address; then complete_tx of the whole box on the mbarrier.
inline void mgshim::land_bulk(Block& b, const BulkCopy& c) {
  const TensorMap& m = c.map;
  uint64_t count = 1;
  for (uint32_t d = 0; d < m.rank; ++d) count *= m.box[d];
  const uint32_t base = (uint32_t)smem_offset(b, c.dst);
  for (uint64_t e = 0; e < count; ++e) {
    uint64_t rest = e, src = m.global;
    bool inside = true;
    for (uint32_t d = 0; d < m.rank; ++d) {
      const int64_t g = (int64_t)c.coord[d] + (int64_t)(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && g >= 0 && g < (int64_t)m.dims[d];
      src += (uint64_t)g * m.strides[d];
    }
    unsigned char* to = b.smem + mgsm90_swizzle(base + (uint32_t)(e * m.elem_bytes), m.swizzle);
    if (inside) {
      global_access((const void*)src, m.elem_bytes, "cp.async.bulk.tensor (global read)");
      std::memcpy(to, (const void*)src, m.elem_bytes);
    } else {
      std::memset(to, 0, m.elem_bytes);
    }
  }
  const uint32_t clock = b.tma_clock++;
  bulk_landed(b, c.dst, c.bytes, clock);
  mbarrier_complete_tx(b, c.mbar, c.bytes, clock);
}

inline void mg_tma_load_1d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0) {
  mgsm90_tma_load<1>(dst, map, mbar, {c0});
}
inline void mg_tma_load_2d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1) {
  mgsm90_tma_load<2>(dst, map, mbar, {c0, c1});
}
inline void mg_tma_load_3d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2) {
  mgsm90_tma_load<3>(dst, map, mbar, {c0, c1, c2});
}
inline void mg_tma_load_4d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2, int c3) {
  mgsm90_tma_load<4>(dst, map, mbar, {c0, c1, c2, c3});
}
inline void mg_tma_load_5d(void* dst, const mg_tmap* map, unsigned long long* mbar, int c0, int c1, int c2, int c3,
                           int c4) {
  mgsm90_tma_load<5>(dst, map, mbar, {c0, c1, c2, c3, c4});
}
#endif

// ---- proxies: generic-proxy shared-memory writes become visible to the async proxy (wgmma, TMA) ----------------
#if defined(__CUDACC__)
MG_DEVICE void mg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#else
inline void mg_fence_proxy_async() { ++mgshim::self().fences; }
#endif

// ---- wgmma: shared-memory matrix descriptors, fence / commit_group / wait_group --------------------------------
// A descriptor: start address, leading- and stride-dimension byte offsets (each >> 4, 14 bits) and the layout type
// (0 none, 1 128B, 2 64B, 3 32B swizzle) in bits 62-63; the matrix base offset (bits 49-51) stays 0.
#if defined(__CUDACC__)
MG_DEVICE unsigned long long mg_smem_desc(const void* p, unsigned lbo, unsigned sbo, unsigned layout) {
  return (unsigned long long)((mg_smem_addr(p) & 0x3FFFFu) >> 4) | (unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16 |
         (unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32 | (unsigned long long)layout << 62;
}
MG_DEVICE void mg_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
MG_DEVICE void mg_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
MG_DEVICE void mg_wgmma_wait() {  // all but the N most recent wgmma-groups have completed
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
#else
inline unsigned long long mg_smem_desc(const void* p, unsigned lbo, unsigned sbo, unsigned layout) {
  mgshim::Block& b = *mgshim::self().block;
  if (!mgshim::in_block_smem(b, p))
    mgshim::fail(mgshim::kBadArgument, "a wgmma descriptor's start %p is not in dynamic shared memory", p);
  const unsigned addr = (unsigned)mgshim::smem_offset(b, p);
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16 |
         (unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32 | (unsigned long long)layout << 62;
}

// The shared-memory byte (offset in the block's dynamic shared memory) of 16-bit element (mn, k) of an operand a
// descriptor describes, K-major (k contiguous) or MN-major, by the PTX ISA's canonical layouts: in units of 16-byte
// chunks, K-major ((8, m), (2 chunks)) : ((w/16 or 1, SBO), (1 or LBO)); MN-major ((w/16 chunks, m), (8, k)) :
// ((1, LBO), (w/16, SBO)), and with no swizzle ((1 chunk, m), (8, k)) : ((-, SBO), (1, LBO)); then the swizzle.
inline uint32_t mgsm90_desc_address(unsigned long long desc, bool mn_major, int mn, int k) {
  const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
                 sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 49) & 7)
    mgshim::fail(mgshim::kBadArgument, "wgmma: a nonzero matrix base offset is not modelled (align the tile)");
  const uint32_t w = (uint32_t)mgsm90_desc_width((int)(desc >> 62));
  const bool swizzled = w > 16;
  uint32_t off;
  if (!mn_major)
    off = (mn % 8) * (swizzled ? w : 16) + (mn / 8) * sbo + (k / 8) * (swizzled ? 16 : lbo) + (k % 8) * 2;
  else if (!swizzled)
    off = (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  else
    off = (mn % (w / 2)) * 2 + (mn / (w / 2)) * lbo + (k % 8) * w + (k / 8) * sbo;
  return mgsm90_swizzle(start + off, w);
}

inline uint16_t mgsm90_read16(mgshim::Block& b, uint32_t addr) {
  if (addr + 2 > b.smem_bytes)
    mgshim::fail(mgshim::kSmemOutOfBounds, "wgmma reads shared byte %u, outside the %zu bytes of dynamic shared "
                 "memory", addr, b.smem_bytes);
  uint16_t v;
  std::memcpy(&v, b.smem + addr, 2);
  return v;
}

// D (64 x n) = A (64 x 16) B (16 x n) + (scale_d ? D : 0), fp32 accumulation with one fma per product in k order.
inline void mgshim::execute_wgmma(Block& b, const WgmmaOp& op) {
  static thread_local float A[64][16], B[16][256], D[64][256];  // per worker OS thread: not on a fiber's stack
  float (*cvt)(unsigned short) = op.bf16 ? +[](unsigned short x) { return mg_b2f(x); }
                                         : +[](unsigned short x) { return mg_h2f(x); };
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4 && op.a_regs; ++r)
      for (int h = 0; h < 2; ++h) A[mgsm90_a_row(t, r, h)][mgsm90_a_col(t, r, h)] = cvt(op.a[t][r] >> (16 * h));
  for (int m = 0; m < 64 && !op.a_regs; ++m)
    for (int k = 0; k < 16; ++k) A[m][k] = cvt(mgsm90_read16(b, mgsm90_desc_address(op.desc_a, op.trans_a, m, k)));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < op.n; ++n) B[k][n] = cvt(mgsm90_read16(b, mgsm90_desc_address(op.desc_b, op.trans_b, n, k)));
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < op.n / 2; ++i) D[mgsm90_d_row(t, i)][mgsm90_d_col(t, i)] = op.scale_d ? op.d[t][i] : 0.0f;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < op.n; ++n) {
      float acc = D[m][n];
      for (int k = 0; k < 16; ++k) acc = std::fma(A[m][k], B[k][n], acc);
      D[m][n] = acc;
    }
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < op.n / 2; ++i) op.d[t][i] = D[mgsm90_d_row(t, i)][mgsm90_d_col(t, i)];
}

// Check builds: the operand bytes of `op` are read by the async proxy (+1 at issue, -1 at completion).
// Runs in a thread of the issuing warpgroup (the collective's last one): the warpgroup's threads all reached the
// instruction, so what any of them acquired orders writes before the reads.
inline void mgshim::mark_wgmma_reads(Block& b, const WgmmaOp& op, int delta) {
  std::vector<uint32_t> seen(b.unit->vc, 0);
  const int base = self().linear / 128 * 128;
  for (int k = 0; k < 128 && delta > 0; ++k)
    for (size_t j = 0; j < seen.size(); ++j) seen[j] = std::max(seen[j], b.threads[base + k].seen[j]);
  const int first_id = b.rank * b.unit->threads_per_block + base;
  for (int m = 0; m < 64 && !op.a_regs; ++m)
    for (int k = 0; k < 16; ++k)
      async_read(b, b.smem + mgsm90_desc_address(op.desc_a, op.trans_a, m, k), 2, delta, seen, first_id);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < op.n; ++n)
      async_read(b, b.smem + mgsm90_desc_address(op.desc_b, op.trans_b, n, k), 2, delta, seen, first_id);
}

// The issue: every thread of the warpgroup stages its registers and the (uniform) operands; the last one records
// the operation in the warpgroup's open wgmma-group. It runs when a wait_group requires it.
inline void mgsm90_wgmma_issue(mgshim::WarpGroup& g) {
  mgshim::Block& b = *mgshim::self().block;
  mgshim::WgmmaOp op;
  for (int k = 1; k < 128; ++k)
    if (g.u[k][0] != g.u[0][0] || g.u[k][1] != g.u[0][1] || std::memcmp(g.i[k], g.i[0], sizeof g.i[0]))
      mgshim::fail(mgshim::kBadArgument, "wgmma.mma_async: thread %d of the warpgroup passed other descriptors or "
                   "operands than thread 0 (they must be the same in every warp)", k);
  op.desc_a = g.u[0][0];
  op.desc_b = g.u[0][1];
  op.n = g.i[0][0];
  op.scale_d = g.i[0][1];
  op.trans_a = g.i[0][2] & 1;
  op.trans_b = (g.i[0][2] >> 1) & 1;
  op.bf16 = (g.i[0][2] >> 2) & 1;
  op.a_regs = (g.i[0][2] >> 3) & 1;
  for (int k = 0; k < 128; ++k) {
    op.d[k] = g.d[k];
    std::memcpy(op.a[k], g.a[k], sizeof op.a[k]);
  }
  op.group = g.open;
  g.pending.push_back(op);
  if (b.shadow) mgshim::mark_wgmma_reads(b, g.pending.back(), +1);
}

// One wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{f16,bf16}: A from a descriptor (a_regs null) or registers.
inline void mgsm90_wgmma(float* d, int n, const unsigned* a_regs, unsigned long long desc_a, unsigned long long desc_b,
                         int scale_d, int trans_a, int trans_b, bool bf16, const char* op) {
  mgshim::Thread& t = mgshim::self();
  if (!t.wg_fenced)
    mgshim::fail(mgshim::kBadArgument, "%s without a wgmma.fence since the last wgmma.wait_group (the accumulator "
                 "registers must be fenced)", op);
  if (n % 8 || n < 8 || n > 256) mgshim::fail(mgshim::kBadArgument, "%s: n = %d", op, n);
  mgshim::WarpGroup& g = mgshim::warpgroup();
  const int k = t.linear % 128;
  g.d[k] = d;
  for (int r = 0; r < 4; ++r) g.a[k][r] = a_regs ? a_regs[r] : 0u;
  g.u[k][0] = a_regs ? 0ull : desc_a;
  g.u[k][1] = desc_b;
  g.i[k][0] = n;
  g.i[k][1] = scale_d != 0;
  g.i[k][2] = (trans_a & 1) | (trans_b & 1) << 1 | (int)bf16 << 2 | (a_regs ? 1 : 0) << 3;
  g.i[k][3] = 0;
  mgshim::warpgroup_collective(op, mgsm90_wgmma_issue);
}

inline void mg_wgmma_fence() {
  mgshim::self().wg_fenced = true;
  mgshim::warp_collective("wgmma.fence", [](mgshim::Warp&) {});
}
inline void mg_wgmma_commit() {
  mgshim::warpgroup_collective("wgmma.commit_group", [](mgshim::WarpGroup& g) { mgshim::wgmma_committed(g); });
}
template <int N>
inline void mg_wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  mgshim::warpgroup_collective("wgmma.wait_group", [](mgshim::WarpGroup& g) {
    mgshim::wgmma_retire(*mgshim::self().block, g, (uint32_t)N);
  });
}
#endif

// ---- setmaxnreg: the producer warpgroup gives registers back, consumers take them --------------------------------
#if defined(__CUDACC__)
template <int N>
MG_DEVICE void mg_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
MG_DEVICE void mg_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
#else
template <int N>
void mgsm90_setmaxnreg(const char* op) {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in 24..256");
  mgshim::WarpGroup& g = mgshim::warpgroup();
  g.i[mgshim::self().linear % 128][0] = N;
  mgshim::warpgroup_collective(op, [](mgshim::WarpGroup& w) {
    for (int k = 1; k < 128; ++k)
      if (w.i[k][0] != w.i[0][0])
        mgshim::fail(mgshim::kBadArgument, "setmaxnreg: the warps of a warpgroup asked for %d and %d registers",
                     w.i[0][0], w.i[k][0]);
  });
}
template <int N>
inline void mg_setmaxnreg_inc() {
  mgsm90_setmaxnreg<N>("setmaxnreg.inc");
}
template <int N>
inline void mg_setmaxnreg_dec() {
  mgsm90_setmaxnreg<N>("setmaxnreg.dec");
}
#endif

// ---- named barriers: bar.sync id, count (whole warps; the threads of other roles go on) --------------------------
#if defined(__CUDACC__)
MG_DEVICE void mg_bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
#else
inline void mg_bar_sync(int id, int count) { mgshim::named_barrier(id, count); }
#endif

// ---- thread-block clusters: ranks, distributed shared memory (mapa), barrier.cluster ---------------------------
#if defined(__CUDACC__)
MG_DEVICE unsigned mg_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
MG_DEVICE unsigned mg_cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
MG_DEVICE void mg_cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
MG_DEVICE void mg_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// The generic address in cluster block `rank`'s shared memory of `p` in this block's (plain loads/stores reach it).
template <class T>
MG_DEVICE T* mg_mapa(T* p, unsigned rank) {
  unsigned long long r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(p), "r"(rank));
  return (T*)r;
}
MG_DEVICE float mg_ld_dsmem(const float* p) { return *(const volatile float*)p; }
MG_DEVICE void mg_st_dsmem(float* p, float v) { *(volatile float*)p = v; }
#else
inline unsigned mg_cluster_rank() { return (unsigned)mgshim::self().block->rank; }
inline unsigned mg_cluster_size() { return (unsigned)mgshim::self().block->unit->size; }
inline void mg_cluster_arrive() { mgshim::cluster_arrive(); }
inline void mg_cluster_wait() { mgshim::cluster_wait(); }
template <class T>
inline T* mg_mapa(T* p, unsigned rank) {
  return (T*)mgshim::map_shared((const void*)p, rank);
}
inline float mg_ld_dsmem(const float* p) {
  mgshim::memory_access(p, 4, false, "ld.shared::cluster");
  return *p;
}
inline void mg_st_dsmem(float* p, float v) {
  mgshim::memory_access(p, 4, true, "st.shared::cluster");
  *p = v;
}
#endif
MG_DEVICE void mg_cluster_sync() {
  mg_cluster_arrive();
  mg_cluster_wait();
}
