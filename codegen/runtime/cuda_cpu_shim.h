// cuda_cpu_shim.h -- the CUDA execution model on the CPU, for kernels written against tc_intrin.cuh.
// Every CUDA thread is a fiber; a block's fibers run on one worker OS thread, blocks are shared out over workers.
// Faults (misalignment, deadlock, shared-memory overruns) stop the launch and are reported through LaunchConfig:
// the shim never aborts its host process, because Python loads it with ctypes.
//
// Included by tc_intrin.cuh when not compiling for the device; the instruction semantics (ldmatrix, mma, shfl
// fragment maps; sm_90's mbarrier, TMA, wgmma and clusters in sm90_intrin.cuh) live next to their PTX, this file
// only provides the machinery they run on: fibers, barriers (named ones too), warp and warpgroup collectives,
// mbarrier state, copies in flight, thread-block clusters run together, and the check builds' race model.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <climits>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#if defined(MG_SHIM_FASTSWITCH) && defined(__x86_64__)
#define MGSHIM_FAST_SWITCH_ 1
#else
#include <ucontext.h>
#endif

// ---- CUDA keywords -------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local  // one block per worker OS thread at a time, so TLS is per block

namespace mgshim {

// ---- the launch ABI shared with codegen/cpu.py -----------------------------------------------------------------
enum Fault : int32_t {
  kOk = 0,
  kMisaligned = 1,
  kDeadlock = 2,
  kSmemOutOfBounds = 3,
  kDivergentCollective = 4,
  kBadLaunch = 5,
  kStackOverflow = 6,
  kBadArgument = 7,
  kRace = 8,                // check builds: two threads touch a shared byte between the same barriers
  kGlobalOutOfBounds = 9,   // check builds: an access outside every buffer passed to the launch
};
enum Schedule : int32_t { kRoundRobin = 0, kReverse = 1, kRandom = 2, kWarpGreedy = 3 };
// When a committed cp.async group lands in shared memory: at the wait_group that requires it (exposes missing
// waits), at its commit (exposes copies that overwrite data other warps still read), or a seeded coin flip.
enum Landing : int32_t { kLandAtWait = 0, kLandAtCommit = 1, kLandRandom = 2 };

// Mirrored field by field by codegen/cpu.py (ctypes); mg_shim_config_bytes() lets Python check the layout.
struct LaunchConfig {
  uint32_t grid[3];
  uint32_t block[3];
  uint64_t smem_bytes;
  uint64_t seed;
  uint64_t stack_bytes;
  int32_t schedule;
  int32_t landing;
  int32_t workers;
  int32_t fault;      // out: a Fault
  char message[2048]; // out: what went wrong and where
  const uint64_t* blocks;  // linear block ids to run (x fastest), or null for the whole grid
  uint64_t nblocks;        // how many ids `blocks` holds
  const uint64_t* ranges;  // check builds: [lo, hi) byte ranges of the global buffers the kernel may touch
  uint64_t nranges;        // how many ranges (pairs) `ranges` holds
  uint32_t cluster[3];     // thread-block cluster dims (1, 1, 1: none); the blocks of a cluster run together
  uint32_t reserved_;
};

constexpr uint64_t kMaxSmemBytes = 227 * 1024;  // sm_90's opt-in maximum per block
constexpr int kMaxClusterBlocks = 16;           // sm_90's non-portable maximum cluster size
constexpr size_t kSmemAlign = 1024;             // dynamic shared memory starts on a 1024-byte boundary (swizzles)
constexpr size_t kRedzone = 1024;               // guard bytes on each side of dynamic shared memory
constexpr unsigned char kRedzoneByte = 0xA5;
constexpr unsigned char kPoisonByte = 0xFF;     // fresh shared memory reads as NaN in f16, bf16 and f32
constexpr uint64_t kStackCanary = 0x6d67736869667421ull;
constexpr int kCanaryWords = 8;  // spread over the lowest 256 bytes of a fiber stack: frame padding can skip a word

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

// ---- fibers: a fast x86-64 user-space switch, ucontext elsewhere ----------------------------------------------
#if defined(MGSHIM_FAST_SWITCH_)
// Saves the System V callee-saved registers on the current stack, swaps stack pointers, restores. No syscall,
// unlike swapcontext, which makes one (rt_sigprocmask) per switch and is 6x slower here.
__attribute__((naked, noinline)) static void mgshim_switch(void** /*save_sp*/, void* /*load_sp*/) {
  asm volatile(
      "pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
      "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
      "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
struct Context {
  void* sp = nullptr;
};
inline thread_local void* t_scheduler_sp = nullptr;
inline void enter(Context& c) { mgshim_switch(&t_scheduler_sp, c.sp); }
inline void leave(Context& c) { mgshim_switch(&c.sp, t_scheduler_sp); }
inline void prepare(Context& c, char* lo, size_t size, void (*entry)()) {
  void** sp = (void**)(((uintptr_t)(lo + size)) & ~(uintptr_t)15);
  *--sp = nullptr;         // fake return address of entry: keeps the ABI's 16-byte alignment at its first insn
  *--sp = (void*)entry;    // popped by the first switch's `ret`
  for (int r = 0; r < 6; ++r) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
inline thread_local ucontext_t t_scheduler_uc;
inline void enter(Context& c) { swapcontext(&t_scheduler_uc, &c.uc); }
inline void leave(Context& c) { swapcontext(&c.uc, &t_scheduler_uc); }
inline void prepare(Context& c, char* lo, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = lo;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

// ---- the state of one launch, block, warp and thread -----------------------------------------------------------
struct Launch {
  const LaunchConfig* cfg;
  void (*body)(const void*);
  const void* args;
  Dim3 grid, block;
  long nblocks = 0;         // units to run: blocks, or clusters of unit_blocks blocks
  int unit_blocks = 1;
  std::atomic<long> next_block{0};
  std::atomic<int32_t> fault{kOk};
  char message[sizeof(LaunchConfig::message)] = {0};
};

struct Copy {  // one cp.async in flight
  void* dst;
  const void* src;
  uint32_t src_bytes;
  uint32_t group;
};

struct Warp;
struct Block;
struct Unit;
struct Thread {
  Dim3 tid;
  int linear = 0, lane = 0, warp_id = 0;
  int id = 0;  // index in its unit's clock vectors: rank of its block * threads per block + linear
  Warp* warp = nullptr;
  Block* block = nullptr;
  const char* waiting = nullptr;  // the barrier or collective it is blocked in, for deadlock reports
  bool done = false;
  std::vector<Copy> copies;  // issued cp.async copies that have not landed yet
  uint32_t group = 0;        // id of the open cp.async group; groups below it are committed
  // check builds: this thread's release count (every access it makes carries it) and the release counts of the
  // others it has acquired (through barriers, mbarrier waits, the cluster barrier): happens-before, as clocks
  uint32_t clock = 1;
  std::vector<uint32_t> seen;
  uint32_t fences = 0;       // fence.proxy.async executed (a generic write must be fenced before wgmma reads it)
  bool wg_fenced = false;    // a wgmma.fence since this thread's last wgmma.wait_group
  uint32_t cluster_phase = 0;  // 1 + the cluster barrier phase it arrived in and has not waited for (0: none)
  Context ctx;
  char* stack_lo = nullptr;
};

struct Warp {
  int size = 0, arrived = 0;
  unsigned gen = 0;
  const char* op = nullptr;  // the collective the arrived lanes wait in
  // Staging area of a collective: each lane writes its operands, the last lane to arrive writes all results.
  const void* ptr[32];
  uint32_t in_u[32][6];
  float in_f[32][4];
  int in_i[32];
  uint32_t out_u[32][4];
  float out_f[32][4];
};

// One wgmma.mma_async issued by a warpgroup: its operands as issued, executed when a wait_group requires it.
struct WgmmaOp {
  float* d[128];         // each thread's accumulator registers (its N/2 floats), written at completion
  uint32_t a[128][4];    // A from registers (a_regs), as each thread held them at issue
  bool a_regs = false, bf16 = false;
  uint64_t desc_a = 0, desc_b = 0;
  int n = 0, scale_d = 1, trans_a = 0, trans_b = 0;
  uint32_t group = 0;    // the wgmma-group it belongs to
};

struct WarpGroup {  // 4 warps: a warpgroup collective's staging area and its wgmma operations in flight
  int size = 0, arrived = 0;
  unsigned gen = 0;
  const char* op = nullptr;
  float* d[128];
  uint32_t a[128][4];
  uint64_t u[128][2];
  int32_t i[128][4];
  std::vector<WgmmaOp> pending;
  uint32_t open = 0;     // id of the open wgmma-group; groups below it are committed
};

struct NamedBarrier {  // bar.sync id, count
  int arrived = 0, count = 0;
  unsigned gen = 0;
  std::vector<int> who;  // check builds: the threads that arrived in this generation
};

struct MBarrier {  // an mbarrier object's state (PTX: phase, pending and expected arrivals, transaction count)
  const void* addr = nullptr;
  uint32_t phase = 0;
  int32_t pending = 0, expected = 0;
  int64_t tx = 0;
  std::vector<uint32_t> acc, done[2];  // check builds: clocks released into the current / last completed phases
};

struct TensorMap {  // the CPU harness's encoding of a CUtensorMap (codegen/tma.py encode_cpu writes it)
  uint64_t magic;
  uint64_t global;
  uint32_t rank, elem_bytes, swizzle, reserved;
  uint32_t dims[5];     // innermost first
  uint32_t box[5];
  uint64_t strides[5];  // bytes; strides[0] is the element size
};
constexpr uint64_t kTensorMapMagic = 0x31304d414d544d47ull;  // "GMTMAM01" little-endian: "MGTMAP01"

struct BulkCopy {  // one TMA box in flight: lands in shared memory, then completes `bytes` on its mbarrier
  unsigned char* dst;
  TensorMap map;
  int32_t coord[5];
  const void* mbar;
  uint32_t bytes;
  int issuer;
};

struct Block {
  Dim3 bid;
  int nthreads = 0, expected = 0, arrived = 0, live = 0;
  unsigned gen = 0;
  uint32_t epoch = 0;  // barrier intervals completed (__syncthreads and named barriers): the race check's epoch
  long progress = 0;  // barriers completed plus threads exited: a round that adds none is a deadlock
  bool failed = false;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  Thread* threads = nullptr;
  Warp* warps = nullptr;
  int nwarps = 0;
  WarpGroup* groups = nullptr;
  int ngroups = 0;
  NamedBarrier bars[16];
  std::deque<MBarrier> mbars;  // stable references: threads hold them while others initialise more
  std::vector<BulkCopy> bulk;  // TMA copies issued and not landed
  uint32_t tma_clock = 1;      // check builds: the TMA agent's release count
  Unit* unit = nullptr;
  int rank = 0;                // rank in the cluster (0 without one)
  Launch* launch = nullptr;
  std::mt19937_64 rng;
  Landing landing = kLandAtWait;
  struct Shadow* shadow = nullptr;  // check builds: one record per byte of dynamic shared memory
};

// The blocks that run together on one worker: one block, or every block of a thread-block cluster.
struct Unit {
  int size = 1;
  Block* blocks = nullptr;
  int threads_per_block = 0;
  int arrived = 0, expected = 0;  // barrier.cluster: arrivals of the current phase, threads that must arrive
  unsigned gen = 0;
  int vc = 0;                     // clock vector length: every thread of every block, then one TMA agent per block
  std::vector<uint32_t> acc, done;
  bool checks = false;
};

// Check builds: per byte of dynamic shared memory, who last wrote and read it and when. Generic accesses between
// the same barriers are judged by epoch (the block's barrier count + 1, so 0 means never); accesses ordered by
// other means (TMA copies and their mbarriers, another block of the cluster) by clocks: an access carries its
// thread's clock, and a later access by another thread is ordered after it when that thread has acquired it.
// A copy in flight marks its bytes pending until it lands; a wgmma in flight counts itself among their readers.
struct Shadow {
  uint32_t write_epoch = 0, read_epoch = 0;
  int16_t writer = -1, reader = -1, pending = -1;
  bool readers = false;  // more than one thread read it in read_epoch
  bool pending_tma = false;  // the copy in flight is a TMA box (else a cp.async)
  uint8_t async_readers = 0;
  int16_t vreader = -1;  // the last reader, with its clock
  uint32_t wclock = 0, vrclock = 0, wfence = 0;
};

inline thread_local Thread* t_current = nullptr;
inline Thread& self() { return *t_current; }

// ---- faults ---------------------------------------------------------------------------------------------------
inline void vreport(Launch& L, Fault f, const char* fmt, va_list ap) {
  int32_t none = kOk;
  if (!L.fault.compare_exchange_strong(none, f)) return;  // the first fault of a launch wins
  vsnprintf(L.message, sizeof L.message, fmt, ap);
}
__attribute__((format(printf, 3, 4))) inline void report(Launch& L, Fault f, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(L, f, fmt, ap);
  va_end(ap);
}

// Records the fault, marks the block failed and leaves the fiber for good: the scheduler never resumes it, which
// is how a fault unwinds a kernel without exceptions or longjmp across C++ frames.
[[noreturn]] __attribute__((format(printf, 2, 3))) inline void fail(Fault f, const char* fmt, ...) {
  Thread& t = self();
  char what[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const Dim3 b = t.block->bid;
  report(*t.block->launch, f, "block (%u,%u,%u) thread (%u,%u,%u) [warp %d lane %d]: %s", b.x, b.y, b.z, t.tid.x,
         t.tid.y, t.tid.z, t.warp_id, t.lane, what);
  t.block->failed = true;
  for (;;) leave(t.ctx);
}

inline void check_aligned(const void* p, unsigned align, const char* op, const char* what) {
  if ((uintptr_t)p % align == 0) return;
  const Block& b = *self().block;
  const uintptr_t off = (uintptr_t)p - (uintptr_t)b.smem;
  if (off < b.smem_bytes)
    fail(kMisaligned, "%s: %s at dynamic shared memory byte %zu is not %u-byte aligned", op, what, (size_t)off,
         align);
  fail(kMisaligned, "%s: %s %p is not %u-byte aligned (address %% %u = %u)", op, what, p, align, align,
       (unsigned)((uintptr_t)p % align));
}

// Catches accesses that spill just past either end of dynamic shared memory (into the redzones). Addresses far
// away (static __shared__ arrays, which live elsewhere) are not judged.
inline void check_smem(const void* p, size_t bytes, const char* op) {
  const Block& b = *self().block;
  const intptr_t off = (intptr_t)p - (intptr_t)b.smem, size = (intptr_t)b.smem_bytes;
  const bool near = off + (intptr_t)bytes > -(intptr_t)kRedzone && off < size + (intptr_t)kRedzone;
  if (near && (off < 0 || off + (intptr_t)bytes > size))
    fail(kSmemOutOfBounds, "%s: shared-memory bytes [%lld, %lld) are outside the %lld bytes of dynamic shared memory",
         op, (long long)off, (long long)(off + (intptr_t)bytes), (long long)size);
}

// ---- check builds: shared-memory races and global bounds ---------------------------------------------------------
inline bool in_block_smem(const Block& b, const void* p) {
  return (uintptr_t)p >= (uintptr_t)b.smem && (uintptr_t)p < (uintptr_t)b.smem + b.smem_bytes;
}
inline bool in_smem(const void* p) { return in_block_smem(*self().block, p); }

// The block of this thread's unit (itself, or a block of its cluster) whose shared memory holds `p`, or null.
inline Block* smem_owner(const void* p) {
  Block& b = *self().block;
  if (in_block_smem(b, p)) return &b;
  for (int r = 0; b.unit && r < b.unit->size; ++r)
    if (in_block_smem(b.unit->blocks[r], p)) return &b.unit->blocks[r];
  return nullptr;
}

[[noreturn]] inline void race(const char* what, size_t byte, int other, const char* op) {
  fail(kRace, "%s: shared-memory byte %zu %s thread %d between the same barriers (a missing __syncthreads or "
       "cp.async wait)", op, byte, what, other);
}

[[noreturn]] inline void unordered(const char* what, size_t byte, int other, const char* op, const char* fix) {
  fail(kRace, "%s: shared-memory byte %zu %s %d with nothing ordering the two (%s)", op, byte, what, other, fix);
}

// Check builds: whether thread t has acquired the access that agent `who` made at clock `clock`.
inline bool ordered(const Thread& t, int who, uint32_t clock) { return who == t.id || t.seen[who] > clock; }
// Whether agent `who` (a thread id or a TMA agent) is a thread of t's own block.
inline bool same_block(const Thread& t, int who) {
  const int n = t.block->unit->threads_per_block;
  return who < t.block->unit->size * n && who / n == t.block->rank;
}

// A thread reads or writes `bytes` bytes of dynamic shared memory at `p` (its own block's, or through mapa a block
// of its cluster): a generic-proxy access. Accesses between the same barriers of one block conflict by epoch; an
// access after one from another block or from a TMA copy must have acquired it (clocks).
inline void shared_access(const void* p, size_t bytes, bool write, const char* op) {
  Thread& t = self();
  Block* owner = smem_owner(p);
  if (!owner || !owner->shadow) return;
  Block& b = *owner;
  const bool local = &b == t.block;
  const uint32_t epoch = b.epoch + 1;
  const int16_t me = (int16_t)t.id;
  const size_t first = (uintptr_t)p - (uintptr_t)b.smem;
  const char* fix = "a wait on the mbarrier that completes the copy, or barrier.cluster between the blocks";
  for (size_t i = first; i < first + bytes && i < b.smem_bytes; ++i) {
    Shadow& s = b.shadow[i];
    if (s.pending >= 0 && (s.pending != me || !write || s.pending_tma))
      race(s.pending_tma ? "has a TMA copy in flight (wait on its mbarrier) from" : "has a cp.async in flight from", i,
           s.pending, op);
    if (write && s.async_readers) race("is still read by a wgmma in flight (wgmma.wait_group first) of", i, me, op);
    if (s.writer >= 0 && s.writer != me) {
      if (!local || !same_block(t, s.writer)) {
        if (!ordered(t, s.writer, s.wclock)) unordered(write ? "was written by" : "is read after a write by", i,
                                                       s.writer, op, fix);
      } else if (s.write_epoch == epoch) {
        race(write ? "was written by" : "is read after a write by", i, s.writer, op);
      }
    }
    if (write) {
      if (s.vreader >= 0 && s.vreader != me && (!local || !same_block(t, s.vreader))) {
        if (!ordered(t, s.vreader, s.vrclock)) unordered("is written after a read by", i, s.vreader, op, fix);
      } else if (local && s.read_epoch == epoch && (s.readers || s.reader != me)) {
        race("is written after a read by", i, s.reader, op);
      }
      s.write_epoch = local ? epoch : 0;
      s.writer = me;
      s.wclock = t.clock;
      s.wfence = t.fences;
      s.read_epoch = local ? s.read_epoch : 0;
    } else {
      if (local && s.read_epoch == epoch && s.reader != me) {
        s.readers = true;
      } else if (local && s.read_epoch != epoch) {
        s.read_epoch = epoch;
        s.reader = me;
        s.readers = false;
      }
      s.vreader = me;
      s.vrclock = t.clock;
    }
  }
}

inline void shared_pending(const void* p, size_t bytes, bool issued) {
  Thread& t = self();
  Block& b = *t.block;
  if (!b.shadow) return;
  const size_t first = (uintptr_t)p - (uintptr_t)b.smem;
  for (size_t i = first; i < first + bytes && i < b.smem_bytes; ++i) b.shadow[i].pending = issued ? (int16_t)t.id : -1;
}

// Global memory: an access must lie inside one of the launch's buffers (check builds pass their ranges).
inline void global_access(const void* p, size_t bytes, const char* op) {
  const LaunchConfig& c = *self().block->launch->cfg;
  if (!c.ranges) return;
  const uint64_t lo = (uintptr_t)p, hi = lo + bytes;
  for (uint64_t k = 0; k < c.nranges; ++k)
    if (lo >= c.ranges[2 * k] && hi <= c.ranges[2 * k + 1]) return;
  fail(kGlobalOutOfBounds, "%s: global bytes [%p, +%zu) are outside every buffer of the launch", op, p, bytes);
}

inline void memory_access(const void* p, size_t bytes, bool write, const char* op) {
  if (smem_owner(p))
    shared_access(p, bytes, write, op);
  else
    global_access(p, bytes, op);
}

// ---- check builds: acquiring clocks -----------------------------------------------------------------------------
inline void acquire(Thread& t, const std::vector<uint32_t>& released) {
  for (size_t k = 0; k < released.size(); ++k) t.seen[k] = std::max(t.seen[k], released[k]);
}
inline void release_into(Thread& t, std::vector<uint32_t>& acc) {
  ++t.clock;
  acc[t.id] = std::max(acc[t.id], t.clock);
}
// A barrier among `who` completed: each released what it did before and acquired what the others did.
inline void join(Block& b, const int* who, int n) {
  if (!b.shadow) return;
  std::vector<uint32_t> acc(b.unit->vc, 0);
  for (int k = 0; k < n; ++k) release_into(b.threads[who[k]], acc);
  for (int k = 0; k < n; ++k) acquire(b.threads[who[k]], acc);
}

// Checked pointers: what MG_PARAM / MG_SPTR declare in check builds; every element access is judged.
template <class T>
struct CheckedRef {
  T* p;
  operator T() const {
    memory_access(p, sizeof(T), false, "load");
    return *p;
  }
  const CheckedRef& operator=(T v) const {
    memory_access(p, sizeof(T), true, "store");
    *p = v;
    return *this;
  }
  const CheckedRef& operator=(const CheckedRef& o) const { return *this = (T)o; }
  T* operator&() const { return p; }
};
template <class T>
struct Checked {
  T* p;
  Checked(T* q = nullptr) : p(q) {}
  CheckedRef<T> operator[](long long i) const { return {p + i}; }
  Checked operator+(long long i) const { return {p + i}; }
  operator T*() const { return p; }
};
template <class T>
inline constexpr bool kIsChecked = false;
template <class T>
inline constexpr bool kIsChecked<Checked<T>> = true;

// ---- barriers and warp collectives ----------------------------------------------------------------------------
// The threads of `b` still running: the participants of a __syncthreads.
inline void complete_block_barrier(Block& b) {
  b.arrived = 0;
  ++b.gen;
  ++b.epoch;
  ++b.progress;
  if (b.shadow) {
    std::vector<int> who;
    for (int i = 0; i < b.nthreads; ++i)
      if (!b.threads[i].done) who.push_back(i);
    join(b, who.data(), (int)who.size());
  }
}

inline void block_barrier() {
  Thread& t = self();
  Block& b = *t.block;
  const unsigned gen = b.gen;
  if (++b.arrived == b.expected) {
    complete_block_barrier(b);
    return;
  }
  t.waiting = "__syncthreads";
  while (b.gen == gen) leave(t.ctx);
  t.waiting = nullptr;
}

// bar.sync id, count: the first `count` threads to arrive at barrier `id` (whole warps) wait for each other. A
// barrier interval of the race check ends for the whole block (the threads left out touch no shared bytes the
// others do, in the kernels generated with named barriers: a producer warp that only issues TMA copies).
inline void named_barrier(int id, int count) {
  Thread& t = self();
  Block& b = *t.block;
  if (id < 0 || id >= 16) fail(kBadArgument, "bar.sync %d: barrier ids are 0..15", id);
  if (count <= 0 || count % 32 || count > b.nthreads)
    fail(kBadArgument, "bar.sync %d, %d: the thread count must be a multiple of 32 up to the block's %d", id, count,
         b.nthreads);
  NamedBarrier& nb = b.bars[id];
  if (nb.arrived == 0)
    nb.count = count;
  else if (nb.count != count)
    fail(kBadArgument, "bar.sync %d, %d while other threads wait at it with count %d", id, count, nb.count);
  const unsigned gen = nb.gen;
  if (b.shadow) nb.who.push_back(t.linear);
  if (++nb.arrived == count) {
    nb.arrived = 0;
    ++nb.gen;
    ++b.epoch;
    ++b.progress;
    if (b.shadow) join(b, nb.who.data(), (int)nb.who.size());
    nb.who.clear();
    return;
  }
  t.waiting = "bar.sync (named barrier)";
  while (nb.gen == gen) leave(t.ctx);
  t.waiting = nullptr;
}

// Every lane of the warp calls this with the same `op` after staging its operands; the last lane to arrive runs
// `complete`, which reads every lane's operands and writes every lane's results.
inline void warp_collective(const char* op, void (*complete)(Warp&)) {
  Thread& t = self();
  Warp& w = *t.warp;
  if (w.arrived == 0)
    w.op = op;
  else if (std::strcmp(w.op, op) != 0)
    fail(kDivergentCollective, "%s while other lanes of the warp wait in %s; every lane must reach the same one", op,
         w.op);
  const unsigned gen = w.gen;
  if (++w.arrived == w.size) {
    w.arrived = 0;
    complete(w);
    ++w.gen;
    ++t.block->progress;
    return;
  }
  t.waiting = op;
  while (w.gen == gen) leave(t.ctx);
  t.waiting = nullptr;
}

inline WarpGroup& warpgroup() {
  Thread& t = self();
  return t.block->groups[t.linear / 128];
}

// The same for the 128 threads of a warpgroup (wgmma, setmaxnreg): `complete` runs once all have staged.
inline void warpgroup_collective(const char* op, void (*complete)(WarpGroup&)) {
  Thread& t = self();
  WarpGroup& g = warpgroup();
  if (g.size != 128)
    fail(kBadLaunch, "%s needs a whole warpgroup (128 threads), but this one has %d (block size not a multiple of "
         "128)", op, g.size);
  if (g.arrived == 0)
    g.op = op;
  else if (std::strcmp(g.op, op) != 0)
    fail(kDivergentCollective, "%s while other threads of the warpgroup wait in %s; all 128 must reach the same one",
         op, g.op);
  const unsigned gen = g.gen;
  if (++g.arrived == g.size) {
    g.arrived = 0;
    complete(g);
    ++g.gen;
    ++t.block->progress;
    return;
  }
  t.waiting = op;
  while (g.gen == gen) leave(t.ctx);
  t.waiting = nullptr;
}

inline void require_full_warp(const Warp& w, const char* op) {
  if (w.size != 32) fail(kBadLaunch, "%s needs all 32 lanes, but this warp has %d (block size not a multiple of 32)",
                         op, w.size);
}

// ---- cp.async: issued copies wait in a per-thread queue until they land ---------------------------------------
inline void land(const Copy& c) {
  shared_pending(c.dst, 16, false);
  shared_access(c.dst, 16, true, "cp.async landing");
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset((char*)c.dst + c.src_bytes, 0, 16 - c.src_bytes);
}
inline void land_groups_below(Thread& t, uint32_t limit) {
  auto keep = t.copies.begin();
  for (const Copy& c : t.copies) {
    if (c.group < limit)
      land(c);
    else
      *keep++ = c;
  }
  t.copies.erase(keep, t.copies.end());
}
inline void cp_async(void* dst, const void* src, unsigned src_bytes, const char* op) {
  check_aligned(dst, 16, op, "shared destination");
  check_aligned(src, 16, op, "global source");
  check_smem(dst, 16, op);
  if (src_bytes > 16) fail(kBadArgument, "%s: src_bytes = %u, must be 0..16", op, src_bytes);
  if (src_bytes) global_access(src, src_bytes, op);
  shared_access(dst, 16, true, op);
  shared_pending(dst, 16, true);
  Thread& t = self();
  t.copies.push_back({dst, src, src_bytes, t.group});
}
inline void cp_async_commit() {
  Thread& t = self();
  Block& b = *t.block;
  const bool now = b.landing == kLandAtCommit || (b.landing == kLandRandom && (b.rng() & 1));
  if (now) land_groups_below(t, t.group + 1);
  ++t.group;
}
inline void cp_async_wait(uint32_t pending) {  // all but the `pending` most recent committed groups land
  Thread& t = self();
  if (t.group > pending) land_groups_below(t, t.group - pending);
}

inline unsigned char* dynamic_smem() { return self().block->smem; }

// ---- sm_90 machinery: mbarrier state, TMA copies in flight, wgmma groups, clusters --------------------------------
// The instructions' semantics (a box copy with its swizzle, a descriptor's addresses, the product) are in
// sm90_intrin.cuh next to their PTX; these hooks are defined there.
inline void land_bulk(Block& b, const BulkCopy& c);
inline void execute_wgmma(Block& b, const WgmmaOp& op);
inline void mark_wgmma_reads(Block& b, const WgmmaOp& op, int delta);

inline int tma_agent(const Block& b) { return b.unit->size * b.unit->threads_per_block + b.rank; }
inline size_t smem_offset(const Block& b, const void* p) { return (size_t)((uintptr_t)p - (uintptr_t)b.smem); }

inline MBarrier* find_mbarrier(Block& b, const void* addr) {
  for (MBarrier& m : b.mbars)
    if (m.addr == addr) return &m;
  return nullptr;
}

inline MBarrier& mbarrier(const void* addr, const char* op) {
  Block& b = *self().block;
  check_aligned(addr, 8, op, "mbarrier address");
  if (!in_block_smem(b, addr) || smem_offset(b, addr) + 8 > b.smem_bytes)
    fail(kBadArgument, "%s: the mbarrier %p is not in this block's dynamic shared memory", op, addr);
  MBarrier* m = find_mbarrier(b, addr);
  if (!m) fail(kBadArgument, "%s: the mbarrier at shared byte %zu was never initialised (mbarrier.init)", op,
               smem_offset(b, addr));
  return *m;
}

inline void mbarrier_init(const void* addr, int count) {
  Block& b = *self().block;
  check_aligned(addr, 8, "mbarrier.init", "mbarrier address");
  if (!in_block_smem(b, addr)) fail(kBadArgument, "mbarrier.init: %p is not in dynamic shared memory", addr);
  if (count < 1 || count >= (1 << 20)) fail(kBadArgument, "mbarrier.init: count %d is outside 1..2^20-1", count);
  MBarrier* m = find_mbarrier(b, addr);
  if (!m) m = &b.mbars.emplace_back();
  *m = MBarrier();
  m->addr = addr;
  m->pending = m->expected = count;
  if (b.shadow) {
    m->acc.assign(b.unit->vc, 0);
    m->done[0] = m->done[1] = m->acc;
  }
}

inline void mbarrier_try_complete(Block& b, MBarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  if (b.shadow) {
    m.done[m.phase & 1] = m.acc;
    std::fill(m.acc.begin(), m.acc.end(), 0u);
  }
  ++m.phase;
  m.pending = m.expected;
  ++b.progress;
}

// mbarrier.arrive[.expect_tx]: adds `tx_bytes` to the transaction count, then one arrival (a release).
inline void mbarrier_arrive(const void* addr, uint32_t tx_bytes, const char* op) {
  Thread& t = self();
  Block& b = *t.block;
  MBarrier& m = mbarrier(addr, op);
  if (m.pending <= 0) fail(kBadArgument, "%s: more arrivals than the mbarrier's count (%d) in one phase", op, m.expected);
  m.tx += tx_bytes;
  if (b.shadow) release_into(t, m.acc);
  --m.pending;
  ++b.progress;
  mbarrier_try_complete(b, m);
}

inline void mbarrier_expect_tx(const void* addr, uint32_t tx_bytes) {
  MBarrier& m = mbarrier(addr, "mbarrier.expect_tx");
  m.tx += tx_bytes;
}

// complete_tx by a TMA copy that landed: a release by the block's TMA agent at `clock`.
inline void mbarrier_complete_tx(Block& b, const void* addr, uint32_t bytes, uint32_t clock) {
  MBarrier& m = mbarrier(addr, "cp.async.bulk.tensor (complete_tx)");
  m.tx -= bytes;
  if (b.shadow) m.acc[tma_agent(b)] = std::max(m.acc[tma_agent(b)], clock + 1);
  ++b.progress;
  mbarrier_try_complete(b, m);
}

// Lands every TMA copy that completes on mbarrier `addr` (copies the landing mode left for a waiter).
inline void land_bulk_on(Block& b, const void* addr) {
  for (size_t i = 0; i < b.bulk.size();) {
    if (b.bulk[i].mbar == addr) {
      const BulkCopy c = b.bulk[i];
      b.bulk.erase(b.bulk.begin() + (long)i);
      land_bulk(b, c);
    } else {
      ++i;
    }
  }
}

// mbarrier.try_wait.parity in a loop: returns once the phase of parity `parity` has completed, i.e. the
// mbarrier's current phase has the other parity (an acquire of what that phase's arrivals released).
inline void mbarrier_wait(const void* addr, uint32_t parity, const char* op) {
  Thread& t = self();
  Block& b = *t.block;
  parity &= 1u;
  for (;;) {
    if ((mbarrier(addr, op).phase & 1u) != parity) break;
    land_bulk_on(b, addr);
    if ((mbarrier(addr, op).phase & 1u) != parity) break;
    t.waiting = op;
    leave(t.ctx);
    t.waiting = nullptr;
  }
  if (b.shadow) acquire(t, mbarrier(addr, op).done[parity]);
}

// mbarrier.test_wait.parity: whether that phase has completed (an acquire when it has); copies are not landed.
inline bool mbarrier_test(const void* addr, uint32_t parity, const char* op) {
  Thread& t = self();
  MBarrier& m = mbarrier(addr, op);
  const bool done = (m.phase & 1u) != (parity & 1u);
  if (done && t.block->shadow) acquire(t, m.done[parity & 1u]);
  return done;
}

// A TMA copy is issued onto shared bytes [dst, dst + bytes): they must be free of copies and of wgmma reads in flight,
// and every thread that read or wrote them must have released that to the issuer (an mbarrier it waited on).
inline void bulk_issue(const BulkCopy& c) {
  Thread& t = self();
  Block& b = *t.block;
  if (b.shadow) {
    const size_t first = smem_offset(b, c.dst);
    const char* op = "cp.async.bulk.tensor";
    const char* fix = "the issuer waits on an mbarrier the readers arrive on after their last read";
    for (size_t i = first; i < first + c.bytes && i < b.smem_bytes; ++i) {
      Shadow& s = b.shadow[i];
      if (s.pending >= 0) race(s.pending_tma ? "has another TMA copy in flight from" : "has a cp.async in flight from",
                               i, s.pending, op);
      if (s.async_readers) unordered("is overwritten while a wgmma reads it, issued by warpgroup of thread", i, t.id,
                                     op, "wgmma.wait_group before the stage is released");
      if (s.vreader >= 0 && !ordered(t, s.vreader, s.vrclock))
        unordered("is overwritten by a TMA copy after a read by thread", i, s.vreader, op, fix);
      if (s.writer >= 0 && !ordered(t, s.writer, s.wclock))
        unordered("is overwritten by a TMA copy after a write by", i, s.writer, op, fix);
      s.pending = (int16_t)t.id;
      s.pending_tma = true;
    }
  }
  const bool now = b.landing == kLandAtCommit || (b.landing == kLandRandom && (b.rng() & 1));
  if (now)
    land_bulk(b, c);
  else
    b.bulk.push_back(c);
}

// Check builds: the bytes a TMA copy just wrote, as the TMA agent's at `clock` (no generic writer or reader).
inline void bulk_landed(Block& b, unsigned char* dst, uint32_t bytes, uint32_t clock) {
  if (!b.shadow) return;
  const size_t first = smem_offset(b, dst);
  for (size_t i = first; i < first + bytes && i < b.smem_bytes; ++i) {
    Shadow& s = b.shadow[i];
    s = Shadow();
    s.writer = (int16_t)tma_agent(b);
    s.wclock = clock;
  }
}

// Check builds: a wgmma reads shared bytes [p, p + n) (the async proxy): not while a copy is in flight, after every
// write to them was ordered before the issue (by the threads of the warpgroup or their acquisitions) and made
// visible to the async proxy (fence.proxy.async by a generic writer); `delta` counts the read in flight (+1 at
// issue, -1 at completion).
inline void async_read(Block& b, const unsigned char* p, size_t n, int delta, const std::vector<uint32_t>& seen,
                       int first_thread) {
  const size_t first = smem_offset(b, p);
  const char* op = "wgmma.mma_async";
  for (size_t i = first; i < first + n && i < b.smem_bytes; ++i) {
    Shadow& s = b.shadow[i];
    if (delta > 0) {
      if (s.pending >= 0) race(s.pending_tma ? "has a TMA copy in flight (wait on its mbarrier) from"
                                             : "has a cp.async in flight from", i, s.pending, op);
      const bool mine = s.writer >= first_thread && s.writer < first_thread + 128;
      if (s.writer >= 0 && !mine && seen[s.writer] <= s.wclock)
        unordered("is read by a wgmma after a write by", i, s.writer, op,
                  "a barrier, or a wait on the mbarrier of the copy, before the wgmma");
      const int tpb = b.unit->threads_per_block;
      if (s.writer >= 0 && s.writer < b.unit->size * tpb &&
          b.unit->blocks[s.writer / tpb].threads[s.writer % tpb].fences <= s.wfence)
        unordered("is read by a wgmma (async proxy) after a generic-proxy write by", i, s.writer, op,
                  "fence.proxy.async after the write, before the barrier");
    }
    s.async_readers = (uint8_t)(s.async_readers + delta);
  }
}

// ---- wgmma: the warpgroup's operations in flight ---------------------------------------------------------------
inline void wgmma_committed(WarpGroup& g) { ++g.open; }

// Executes every committed wgmma-group but the `keep` most recent ones (wgmma.wait_group keep).
inline void wgmma_retire(Block& b, WarpGroup& g, uint32_t keep) {
  const uint32_t limit = g.open > keep ? g.open - keep : 0;
  auto it = g.pending.begin();
  while (it != g.pending.end()) {
    if (it->group < limit) {
      execute_wgmma(b, *it);
      if (b.shadow) mark_wgmma_reads(b, *it, -1);
      it = g.pending.erase(it);
    } else {
      ++it;
    }
  }
  const int base = (int)(&g - b.groups) * 128;
  for (int k = 0; k < g.size; ++k) b.threads[base + k].wg_fenced = false;
}

// ---- thread-block clusters ---------------------------------------------------------------------------------------
inline void complete_cluster_barrier(Unit& u) {
  u.arrived = 0;
  if (u.checks) {
    u.done = u.acc;
    std::fill(u.acc.begin(), u.acc.end(), 0u);
  }
  ++u.gen;
  for (int r = 0; r < u.size; ++r) {
    ++u.blocks[r].epoch;
    ++u.blocks[r].progress;
  }
}

// barrier.cluster.arrive.release: this thread's accesses so far are released to every thread of the cluster.
inline void cluster_arrive() {
  Thread& t = self();
  Unit& u = *t.block->unit;
  if (t.cluster_phase) fail(kBadArgument, "barrier.cluster.arrive twice without a barrier.cluster.wait between");
  t.cluster_phase = u.gen + 1;
  if (u.checks) release_into(t, u.acc);
  if (++u.arrived == u.expected) complete_cluster_barrier(u);
}

// barrier.cluster.wait.acquire: until every non-exited thread of the cluster arrived in this thread's phase.
inline void cluster_wait() {
  Thread& t = self();
  Unit& u = *t.block->unit;
  if (!t.cluster_phase) fail(kBadArgument, "barrier.cluster.wait without a barrier.cluster.arrive before it");
  const unsigned gen = t.cluster_phase - 1;
  t.waiting = "barrier.cluster.wait";
  while (u.gen == gen) leave(t.ctx);
  t.waiting = nullptr;
  t.cluster_phase = 0;
  if (u.checks) acquire(t, u.done);
}

// mapa: the address in the shared memory of cluster block `rank` that corresponds to `p` in this block's.
inline void* map_shared(const void* p, unsigned rank) {
  Block& b = *self().block;
  if (!in_block_smem(b, p)) fail(kBadArgument, "mapa: %p is not in this block's dynamic shared memory", p);
  if (rank >= (unsigned)b.unit->size)
    fail(kBadArgument, "mapa: rank %u is outside the cluster's %d blocks", rank, b.unit->size);
  return b.unit->blocks[rank].smem + smem_offset(b, p);
}

// ---- the scheduler --------------------------------------------------------------------------------------------
[[noreturn]] inline void thread_exit(Thread& t) {
  land_groups_below(t, UINT32_MAX);  // on the GPU, copies in flight still land after their thread exits
  Block& b = *t.block;
  Unit& u = *b.unit;
  t.done = true;
  --b.live;
  ++b.progress;
  --b.expected;  // exited threads no longer hold back __syncthreads
  if (b.arrived > 0 && b.arrived == b.expected) complete_block_barrier(b);
  if (t.cluster_phase == u.gen + 1) --u.arrived;  // the phase it arrived in no longer waits for it, as for the next
  --u.expected;
  if (u.arrived > 0 && u.arrived == u.expected) complete_cluster_barrier(u);
  for (;;) leave(t.ctx);
}

inline void fiber_main() {
  Thread& t = self();
  try {
    t.block->launch->body(t.block->launch->args);
  } catch (const std::exception& e) {  // e.g. bad_alloc; one escaping the fiber's stack would terminate
    fail(kBadLaunch, "C++ exception in the kernel: %s", e.what());
  }
  thread_exit(t);
}

inline void write_canary(Thread& t) {
  for (int i = 0; i < kCanaryWords; ++i) ((uint64_t*)t.stack_lo)[4 * i] = kStackCanary;
}
inline bool canary_intact(const Thread& t) {
  for (int i = 0; i < kCanaryWords; ++i)
    if (((const uint64_t*)t.stack_lo)[4 * i] != kStackCanary) return false;
  return true;
}

inline void resume(Block& b, Thread& t) {
  t_current = &t;
  enter(t.ctx);
  t_current = nullptr;
  if (!canary_intact(t) && !b.failed) {
    report(*b.launch, kStackOverflow,
           "block (%u,%u,%u) thread %d overflowed its fiber stack; pass a larger stack_bytes", b.bid.x, b.bid.y,
           b.bid.z, t.linear);
    b.failed = true;
  }
}

inline void round_in_order(Block& b, const std::vector<int>& order) {
  for (int i : order) {
    Thread& t = b.threads[i];
    if (t.done) continue;
    resume(b, t);
    if (b.failed) return;
  }
}

// One warp at a time, in a seeded random order; each runs until it can get no further on its own (it waits at a
// __syncthreads), so it gets as far ahead of the others as CUDA allows. Exposes missing-barrier races.
inline void round_warp_greedy(Block& b, std::vector<int>& warps) {
  std::shuffle(warps.begin(), warps.end(), b.rng);
  for (int w : warps) {
    long before;
    do {
      before = b.progress;
      const int end = std::min(b.nthreads, 32 * w + 32);
      for (int i = 32 * w; i < end; ++i) {
        if (b.threads[i].done) continue;
        resume(b, b.threads[i]);
        if (b.failed) return;
      }
    } while (b.progress != before);
  }
}

// Names each warp's lanes by what they wait in, merging runs of lanes and of identical warps.
inline void describe_warp(const Block& b, int w, char* out, size_t cap) {
  size_t len = 0;
  const int lo = 32 * w, hi = std::min(b.nthreads, lo + 32);
  auto state = [](const Thread& t) { return t.done ? "exited" : t.waiting ? t.waiting : "running"; };
  for (int i = lo; i < hi && len < cap;) {
    const char* what = state(b.threads[i]);
    int j = i;
    while (j + 1 < hi && std::strcmp(state(b.threads[j + 1]), what) == 0) ++j;
    len += snprintf(out + len, cap - len, "%slanes %d-%d %s%s", len ? ", " : "", i - lo, j - lo,
                    b.threads[i].waiting ? "wait in " : "", what);
    i = j + 1;
  }
}

inline void report_deadlock(Block& b) {
  char msg[sizeof(LaunchConfig::message)];
  size_t len = snprintf(msg, sizeof msg,
                        "deadlock in block (%u,%u,%u): no barrier can complete (%d of %d threads at __syncthreads)",
                        b.bid.x, b.bid.y, b.bid.z, b.arrived, b.expected);
  char prev[512] = "", cur[512];
  int first = 0;
  for (int w = 0; w <= b.nwarps && len < sizeof msg; ++w) {
    if (w < b.nwarps) describe_warp(b, w, cur, sizeof cur);
    if (w == 0) std::strcpy(prev, cur);
    if (w == b.nwarps || (w > 0 && std::strcmp(cur, prev) != 0)) {
      if (first == w - 1)
        len += snprintf(msg + len, sizeof msg - len, "; warp %d: %s", first, prev);
      else
        len += snprintf(msg + len, sizeof msg - len, "; warps %d-%d: %s", first, w - 1, prev);
      first = w;
    }
    std::strcpy(prev, cur);
  }
  report(*b.launch, kDeadlock, "%s", msg);
  b.failed = true;
}

class Stacks {  // one lazily committed mapping: only the pages a fiber touches become resident
 public:
  Stacks(size_t count, size_t each) : each_(each), bytes_(count * each) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : (char*)p;
  }
  ~Stacks() {
    if (base_) munmap(base_, bytes_);
  }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  char* lo(int i) const { return base_ + (size_t)i * each_; }
  bool ok() const { return base_ != nullptr; }

 private:
  size_t each_, bytes_;
  char* base_;
};

class SmemArena {  // [redzone][dynamic shared memory][redzone], 1024-byte aligned (swizzle patterns follow addresses)
 public:
  explicit SmemArena(size_t bytes) : bytes_(bytes), buf_(bytes + 2 * kRedzone + kSmemAlign) {
    smem_ = (unsigned char*)(((uintptr_t)buf_.data() + kRedzone + kSmemAlign - 1) & ~(uintptr_t)(kSmemAlign - 1));
  }
  unsigned char* smem() const { return smem_; }
  void reset() {
    std::memset(smem_ - kRedzone, kRedzoneByte, kRedzone);
    std::memset(smem_, kPoisonByte, bytes_);
    std::memset(smem_ + bytes_, kRedzoneByte, kRedzone);
  }
  long first_overrun() const {  // offset of the first clobbered redzone byte, or 0 when intact
    for (size_t i = 0; i < kRedzone; ++i)
      if (smem_[-(long)kRedzone + (long)i] != kRedzoneByte) return -(long)kRedzone + (long)i;
    for (size_t i = 0; i < kRedzone; ++i)
      if (smem_[bytes_ + i] != kRedzoneByte) return (long)(bytes_ + i);
    return 0;
  }

 private:
  size_t bytes_;
  std::vector<unsigned char> buf_;
  unsigned char* smem_;
};

// Runs units one at a time on one OS thread: a unit is one block, or every block of a thread-block cluster (their
// threads interleave, as the blocks of a cluster run at once on the GPU).
class Worker {
 public:
  explicit Worker(Launch& L)
      : L_(L),
        k_(L.unit_blocks),
        n_(L.block.x * L.block.y * L.block.z),
        nw_((n_ + 31) / 32),
        ng_((n_ + 127) / 128),
        threads_((size_t)k_ * n_),
        warps_((size_t)k_ * nw_),
        groups_((size_t)k_ * ng_),
        stacks_((size_t)k_ * n_ + 1, L.cfg->stack_bytes),
        blocks_(k_),
        shadows_(k_),
        order_(n_),
        warp_order_(nw_) {
    for (int r = 0; r < k_; ++r) arenas_.emplace_back(L.cfg->smem_bytes);
    std::iota(order_.begin(), order_.end(), 0);
    if (L.cfg->schedule == kReverse) std::reverse(order_.begin(), order_.end());
    std::iota(warp_order_.begin(), warp_order_.end(), 0);
  }

  void run_all() {
    if (!stacks_.ok()) {
      report(L_, kBadLaunch, "could not map %d fiber stacks of %llu bytes", k_ * n_,
             (unsigned long long)L_.cfg->stack_bytes);
      return;
    }
    for (long k; L_.fault.load() == kOk && (k = L_.next_block++) < L_.nblocks;) run_unit(k);
  }

 private:
  // The linear id (x fastest) of block `rank` of unit `unit`.
  long block_id(long unit, int rank) const {
    const LaunchConfig& c = *L_.cfg;
    if (k_ == 1) return c.blocks ? (long)c.blocks[unit] : unit;
    const long ux = c.grid[0] / c.cluster[0], uy = c.grid[1] / c.cluster[1];
    const long x = unit % ux * c.cluster[0] + rank % c.cluster[0];
    const long y = unit / ux % uy * c.cluster[1] + rank / c.cluster[0] % c.cluster[1];
    const long z = unit / (ux * uy) * c.cluster[2] + rank / (c.cluster[0] * c.cluster[1]);
    return x + (long)c.grid[0] * (y + (long)c.grid[1] * z);
  }

  void init_unit(long id) {
    unit_ = Unit();
    unit_.size = k_;
    unit_.blocks = blocks_.data();
    unit_.threads_per_block = n_;
    unit_.expected = k_ * n_;
    unit_.vc = k_ * n_ + k_;  // every thread, then each block's TMA agent
#if defined(MG_SHIM_CHECK)
    unit_.checks = true;
    unit_.acc.assign(unit_.vc, 0);
    unit_.done = unit_.acc;
#endif
    for (int r = 0; r < k_; ++r) init_block(r, block_id(id, r));
  }

  void init_block(int r, long id) {
    const Dim3 g = L_.grid;
    Block& b = blocks_[r];
    b = Block();
    b.bid = {unsigned(id % g.x), unsigned(id / g.x % g.y), unsigned(id / ((long)g.x * g.y))};
    b.nthreads = b.expected = b.live = n_;
    b.threads = threads_.data() + (size_t)r * n_;
    b.warps = warps_.data() + (size_t)r * nw_;
    b.nwarps = nw_;
    b.groups = groups_.data() + (size_t)r * ng_;
    b.ngroups = ng_;
    b.unit = &unit_;
    b.rank = r;
    b.launch = &L_;
    b.rng.seed(L_.cfg->seed * 0x9E3779B97F4A7C15ull + (uint64_t)id);  // per block: independent of worker count
    b.landing = (Landing)L_.cfg->landing;
    arenas_[r].reset();
    b.smem = arenas_[r].smem();
    b.smem_bytes = L_.cfg->smem_bytes;
#if defined(MG_SHIM_CHECK)
    shadows_[r].assign(b.smem_bytes, Shadow());
    b.shadow = shadows_[r].data();
#endif
    for (int w = 0; w < nw_; ++w) {
      b.warps[w] = Warp();
      b.warps[w].size = std::min(32, n_ - 32 * w);
    }
    for (int w = 0; w < ng_; ++w) {
      b.groups[w] = WarpGroup();
      b.groups[w].size = std::min(128, n_ - 128 * w);
    }
    for (int i = 0; i < n_; ++i) init_thread(b, r, i);
  }

  void init_thread(Block& b, int r, int i) {
    const Dim3 bd = L_.block;
    Thread& t = b.threads[i];
    t.tid = {i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
    t.linear = i;
    t.id = r * n_ + i;
    t.lane = i % 32;
    t.warp_id = i / 32;
    t.warp = &b.warps[t.warp_id];
    t.block = &b;
    t.waiting = nullptr;
    t.done = false;
    t.copies.clear();
    t.group = 0;
    t.clock = 1;
    t.fences = 0;
    t.wg_fenced = false;
    t.cluster_phase = 0;
    if (unit_.checks) t.seen.assign(unit_.vc, 0);
    t.stack_lo = stacks_.lo((size_t)r * n_ + i + 1);  // stack 0 is slack: an overflow of fiber 0 lands in mapped memory
    write_canary(t);
    prepare(t.ctx, t.stack_lo, L_.cfg->stack_bytes, fiber_main);
  }

  bool unit_failed() const {
    for (const Block& b : blocks_)
      if (b.failed) return true;
    return false;
  }

  void round(Block& b) {
    if (L_.cfg->schedule == kWarpGreedy) {
      round_warp_greedy(b, warp_order_);
    } else {
      if (L_.cfg->schedule == kRandom) std::shuffle(order_.begin(), order_.end(), b.rng);
      round_in_order(b, order_);
    }
  }

  void run_unit(long id) {
    init_unit(id);
    for (;;) {
      long before = 0, live = 0;
      for (const Block& b : blocks_) before += b.progress, live += b.live;
      if (live == 0 || unit_failed() || L_.fault.load() != kOk) break;
      for (Block& b : blocks_) {
        if (b.live > 0) round(b);
        if (b.failed) break;
      }
      long after = 0;
      live = 0;
      for (const Block& b : blocks_) after += b.progress, live += b.live;
      if (!unit_failed() && live > 0 && after == before)
        for (Block& b : blocks_)
          if (b.live > 0) {
            report_deadlock(b);
            break;
          }
    }
    if (!unit_failed())
      for (int r = 0; r < k_; ++r) check_redzones(blocks_[r], arenas_[r]);
  }

  void check_redzones(const Block& b, const SmemArena& arena) {
    if (const long off = arena.first_overrun())
      report(L_, kSmemOutOfBounds,
             "block (%u,%u,%u) wrote outside dynamic shared memory: byte offset %ld (size %llu bytes)", b.bid.x,
             b.bid.y, b.bid.z, off, (unsigned long long)L_.cfg->smem_bytes);
  }

  Launch& L_;
  int k_, n_, nw_, ng_;
  std::vector<Thread> threads_;
  std::vector<Warp> warps_;
  std::vector<WarpGroup> groups_;
  Stacks stacks_;
  std::deque<SmemArena> arenas_;
  std::vector<Block> blocks_;
  std::vector<std::vector<Shadow>> shadows_;
  std::vector<int> order_, warp_order_;
  Unit unit_;
};

inline bool validate(Launch& L) {
  const LaunchConfig& c = *L.cfg;
  const uint64_t threads = (uint64_t)c.block[0] * c.block[1] * c.block[2];
  const uint64_t cluster = (uint64_t)c.cluster[0] * c.cluster[1] * c.cluster[2];
  if (!c.grid[0] || !c.grid[1] || !c.grid[2] || !threads)
    report(L, kBadLaunch, "grid and block dimensions must be >= 1");
  else if (threads > 1024)
    report(L, kBadLaunch, "a block has at most 1024 threads, got %llu", (unsigned long long)threads);
  else if (c.smem_bytes > kMaxSmemBytes)
    report(L, kBadLaunch, "%llu bytes of dynamic shared memory exceed the %llu-byte maximum",
           (unsigned long long)c.smem_bytes, (unsigned long long)kMaxSmemBytes);
  else if (c.schedule < kRoundRobin || c.schedule > kWarpGreedy || c.landing < kLandAtWait || c.landing > kLandRandom)
    report(L, kBadLaunch, "unknown schedule %d or landing %d", c.schedule, c.landing);
  else if (c.stack_bytes < 16384 || c.stack_bytes % 4096)
    report(L, kBadLaunch, "stack_bytes must be a multiple of 4096 and >= 16384, got %llu",
           (unsigned long long)c.stack_bytes);
  else if (!cluster || cluster > kMaxClusterBlocks)
    report(L, kBadLaunch, "a cluster has 1 to %d blocks, got %u x %u x %u", kMaxClusterBlocks, c.cluster[0],
           c.cluster[1], c.cluster[2]);
  else if (c.grid[0] % c.cluster[0] || c.grid[1] % c.cluster[1] || c.grid[2] % c.cluster[2])
    report(L, kBadLaunch, "grid (%u,%u,%u) is not a whole number of clusters (%u,%u,%u)", c.grid[0], c.grid[1],
           c.grid[2], c.cluster[0], c.cluster[1], c.cluster[2]);
  else if (cluster > 1 && c.blocks)
    report(L, kBadLaunch, "a block list cannot sample a clustered launch (its blocks run by whole clusters)");
  for (uint64_t k = 0; c.blocks && k < c.nblocks && L.fault.load() == kOk; ++k)
    if (c.blocks[k] >= (uint64_t)c.grid[0] * c.grid[1] * c.grid[2])
      report(L, kBadLaunch, "block %llu of the block list is outside the grid", (unsigned long long)c.blocks[k]);
  return L.fault.load() == kOk;
}

inline void run_workers(Launch& L, long nworkers) {
  if (nworkers <= 1) {
    Worker(L).run_all();
    return;
  }
  std::vector<std::thread> pool;
  for (long i = 0; i < nworkers; ++i) pool.emplace_back([&L] {
    try {
      Worker(L).run_all();
    } catch (const std::exception& e) {
      report(L, kBadLaunch, "shim worker failed: %s", e.what());
    }
  });
  for (auto& th : pool) th.join();
}

// The body of every MG_CPU_ENTRY: validates, runs all blocks, copies the first fault into cfg. Never throws.
inline int32_t run_launch(void (*body)(const void*), const void* args, LaunchConfig* cfg) {
  Launch L;
  L.cfg = cfg;
  L.body = body;
  L.args = args;
  L.grid = {cfg->grid[0], cfg->grid[1], cfg->grid[2]};
  L.block = {cfg->block[0], cfg->block[1], cfg->block[2]};
  for (int d = 0; d < 3; ++d) cfg->cluster[d] = std::max(cfg->cluster[d], 1u);  // 0: no cluster
  L.unit_blocks = (int)(cfg->cluster[0] * cfg->cluster[1] * cfg->cluster[2]);
  const long blocks = (long)L.grid.x * L.grid.y * L.grid.z;
  L.nblocks = cfg->blocks ? (long)cfg->nblocks : blocks / std::max(L.unit_blocks, 1);
  try {
    if (validate(L)) run_workers(L, std::min<long>(std::max(cfg->workers, 1), L.nblocks));
  } catch (const std::exception& e) {
    report(L, kBadLaunch, "shim failed: %s", e.what());
  }
  cfg->fault = L.fault.load();
  std::memcpy(cfg->message, L.message, sizeof cfg->message);
  return cfg->fault;
}

// ---- kernel parameters: unpacked from a cuLaunchKernel-style `void** args` ------------------------------------
template <class>
inline constexpr bool kAlwaysFalse = false;

template <class T>
constexpr char type_code() {
  if constexpr (std::is_pointer_v<T> || kIsChecked<T>) return 'p';
  else if constexpr (std::is_same_v<T, float>) return 'f';
  else if constexpr (std::is_same_v<T, double>) return 'd';
  else if constexpr (std::is_same_v<T, bool>) return '?';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) return std::is_signed_v<T> ? 'b' : 'B';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 2) return std::is_signed_v<T> ? 'h' : 'H';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return std::is_signed_v<T> ? 'i' : 'I';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return std::is_signed_v<T> ? 'q' : 'Q';
  else if constexpr (std::is_class_v<T> && std::is_trivially_copyable_v<T> && sizeof(T) == 128 && alignof(T) == 64)
    return 'T';  // a tensor map (CUtensorMap: 128 bytes, 64-byte aligned), passed by value
  else static_assert(kAlwaysFalse<T>, "kernel parameters must be pointers, integers, float, double or tensor maps");
}

template <class... P>
const char* signature(void (*)(P...)) {  // one struct-module type code per parameter, e.g. "ppii"
  static constexpr char codes[] = {type_code<std::decay_t<P>>()..., '\0'};
  return codes;
}

template <class... T, size_t... I>
std::tuple<T...> unpack(void** args, std::index_sequence<I...>) {
  return std::tuple<T...>{*static_cast<T*>(args[I])...};
}

template <class... P>
int32_t launch(void (*kernel)(P...), void** args, LaunchConfig* cfg) {
  struct Packed {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
  };
  const Packed packed{kernel, unpack<std::decay_t<P>...>(args, std::index_sequence_for<P...>{})};
  auto body = +[](const void* p) {
    const Packed& pk = *static_cast<const Packed*>(p);
    std::apply(pk.kernel, pk.args);
  };
  return run_launch(body, &packed, cfg);
}

}  // namespace mgshim

extern "C" __attribute__((visibility("default"), weak)) int mg_shim_config_bytes() {
  return (int)sizeof(mgshim::LaunchConfig);
}

// The CPU entry point of one kernel: `int mg_cpu_launch_<kernel>(void** args, LaunchConfig* cfg)` launches it
// with cuLaunchKernel-style arguments; `const char* mg_cpu_signature_<kernel>()` gives its parameter type codes.
#define MG_CPU_ENTRY(kernel)                                                                                   \
  extern "C" __attribute__((visibility("default"))) int mg_cpu_launch_##kernel(void** args,                     \
                                                                              mgshim::LaunchConfig* cfg) {     \
    return mgshim::launch(kernel, args, cfg);                                                                   \
  }                                                                                                             \
  extern "C" __attribute__((visibility("default"))) const char* mg_cpu_signature_##kernel() {                 \
    return mgshim::signature(kernel);                                                                           \
  }

// CUDA's built-in variables and barriers, for hand-written kernels; generated code uses tc_intrin.cuh's mg_* names.
#define threadIdx (mgshim::self().tid)
#define blockIdx (mgshim::self().block->bid)
#define blockDim (mgshim::self().block->launch->block)
#define gridDim (mgshim::self().block->launch->grid)
inline void __syncthreads() { mgshim::block_barrier(); }
