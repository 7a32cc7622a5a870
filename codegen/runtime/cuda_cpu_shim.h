// cuda_cpu_shim.h -- the CUDA execution model on the CPU, for kernels written against tc_intrin.cuh.
// Every CUDA thread is a fiber; a block's fibers run on one worker OS thread, blocks are shared out over workers.
// Faults (misalignment, deadlock, shared-memory overruns) stop the launch and are reported through LaunchConfig:
// the shim never aborts its host process, because Python loads it with ctypes.
//
// Included by tc_intrin.cuh when not compiling for the device; the instruction semantics (ldmatrix, mma, shfl
// fragment maps) live next to their PTX in tc_intrin.cuh, this file only provides the machinery they run on.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
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
};

constexpr uint64_t kMaxSmemBytes = 227 * 1024;  // sm_90's opt-in maximum per block
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
  long nblocks = 0;
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
struct Thread {
  Dim3 tid;
  int linear = 0, lane = 0, warp_id = 0;
  Warp* warp = nullptr;
  Block* block = nullptr;
  const char* waiting = nullptr;  // the barrier or collective it is blocked in, for deadlock reports
  bool done = false;
  std::vector<Copy> copies;  // issued cp.async copies that have not landed yet
  uint32_t group = 0;        // id of the open cp.async group; groups below it are committed
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

struct Block {
  Dim3 bid;
  int nthreads = 0, expected = 0, arrived = 0, live = 0;
  unsigned gen = 0;
  long progress = 0;  // barriers completed plus threads exited: a round that adds none is a deadlock
  bool failed = false;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  Thread* threads = nullptr;
  Warp* warps = nullptr;
  int nwarps = 0;
  Launch* launch = nullptr;
  std::mt19937_64 rng;
  Landing landing = kLandAtWait;
  struct Shadow* shadow = nullptr;  // check builds: one record per byte of dynamic shared memory
};

// Check builds: who last wrote and read each shared byte, and in which barrier interval (epoch = the block's
// barrier generation + 1, so 0 means never); a cp.async in flight marks its bytes pending until it lands.
struct Shadow {
  uint32_t write_epoch = 0, read_epoch = 0;
  int16_t writer = -1, reader = -1, pending = -1;
  bool readers = false;  // more than one thread read it in read_epoch
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
inline bool in_smem(const void* p) {
  const Block& b = *self().block;
  return (uintptr_t)p >= (uintptr_t)b.smem && (uintptr_t)p < (uintptr_t)b.smem + b.smem_bytes;
}

[[noreturn]] inline void race(const char* what, size_t byte, int other, const char* op) {
  fail(kRace, "%s: shared-memory byte %zu %s thread %d between the same barriers (a missing __syncthreads or "
       "cp.async wait)", op, byte, what, other);
}

// A thread reads or writes `bytes` bytes of dynamic shared memory at `p` (pending: a cp.async issued, landing later).
inline void shared_access(const void* p, size_t bytes, bool write, const char* op) {
  Thread& t = self();
  Block& b = *t.block;
  if (!b.shadow) return;
  const uint32_t epoch = b.gen + 1;
  const int16_t me = (int16_t)t.linear;
  const size_t first = (uintptr_t)p - (uintptr_t)b.smem;
  for (size_t i = first; i < first + bytes && i < b.smem_bytes; ++i) {
    Shadow& s = b.shadow[i];
    if (s.pending >= 0 && (s.pending != me || !write)) race("has a cp.async in flight from", i, s.pending, op);
    if (s.write_epoch == epoch && s.writer != me) race(write ? "was written by" : "is read after a write by", i,
                                                       s.writer, op);
    if (write) {
      if (s.read_epoch == epoch && (s.readers || s.reader != me)) race("is written after a read by", i, s.reader, op);
      s.write_epoch = epoch;
      s.writer = me;
    } else if (s.read_epoch == epoch && s.reader != me) {
      s.readers = true;
    } else if (s.read_epoch != epoch) {
      s.read_epoch = epoch;
      s.reader = me;
      s.readers = false;
    }
  }
}

inline void shared_pending(const void* p, size_t bytes, bool issued) {
  Thread& t = self();
  Block& b = *t.block;
  if (!b.shadow) return;
  const size_t first = (uintptr_t)p - (uintptr_t)b.smem;
  for (size_t i = first; i < first + bytes && i < b.smem_bytes; ++i) b.shadow[i].pending = issued ? (int16_t)t.linear : -1;
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
  if (in_smem(p))
    shared_access(p, bytes, write, op);
  else
    global_access(p, bytes, op);
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
inline void block_barrier() {
  Thread& t = self();
  Block& b = *t.block;
  const unsigned gen = b.gen;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.gen;
    ++b.progress;
    return;
  }
  t.waiting = "__syncthreads";
  while (b.gen == gen) leave(t.ctx);
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

// ---- the scheduler --------------------------------------------------------------------------------------------
[[noreturn]] inline void thread_exit(Thread& t) {
  land_groups_below(t, UINT32_MAX);  // on the GPU, copies in flight still land after their thread exits
  Block& b = *t.block;
  t.done = true;
  --b.live;
  ++b.progress;
  --b.expected;  // exited threads no longer hold back __syncthreads
  if (b.arrived > 0 && b.arrived == b.expected) {
    b.arrived = 0;
    ++b.gen;
  }
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

class SmemArena {  // [redzone][dynamic shared memory][redzone], 128-byte aligned like the GPU's
 public:
  explicit SmemArena(size_t bytes) : bytes_(bytes), buf_(bytes + 2 * kRedzone + 128) {
    smem_ = (unsigned char*)(((uintptr_t)buf_.data() + kRedzone + 127) & ~(uintptr_t)127);
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

class Worker {  // runs blocks one at a time on one OS thread
 public:
  explicit Worker(Launch& L)
      : L_(L),
        n_(L.block.x * L.block.y * L.block.z),
        threads_(n_),
        warps_((n_ + 31) / 32),
        stacks_(n_ + 1, L.cfg->stack_bytes),
        smem_(L.cfg->smem_bytes),
        order_(n_),
        warp_order_(warps_.size()) {
    std::iota(order_.begin(), order_.end(), 0);
    if (L.cfg->schedule == kReverse) std::reverse(order_.begin(), order_.end());
    std::iota(warp_order_.begin(), warp_order_.end(), 0);
  }

  void run_all() {
    if (!stacks_.ok()) {
      report(L_, kBadLaunch, "could not map %d fiber stacks of %llu bytes", n_,
             (unsigned long long)L_.cfg->stack_bytes);
      return;
    }
    for (long k; L_.fault.load() == kOk && (k = L_.next_block++) < L_.nblocks;)
      run_block(L_.cfg->blocks ? (long)L_.cfg->blocks[k] : k);
  }

 private:
  void init_block(long id) {
    const Dim3 g = L_.grid;
    b_ = Block();
    b_.bid = {unsigned(id % g.x), unsigned(id / g.x % g.y), unsigned(id / ((long)g.x * g.y))};
    b_.nthreads = b_.expected = b_.live = n_;
    b_.threads = threads_.data();
    b_.warps = warps_.data();
    b_.nwarps = (int)warps_.size();
    b_.launch = &L_;
    b_.rng.seed(L_.cfg->seed * 0x9E3779B97F4A7C15ull + (uint64_t)id);  // per block: independent of worker count
    b_.landing = (Landing)L_.cfg->landing;
    smem_.reset();
    b_.smem = smem_.smem();
    b_.smem_bytes = L_.cfg->smem_bytes;
#if defined(MG_SHIM_CHECK)
    shadow_.assign(b_.smem_bytes, Shadow());
    b_.shadow = shadow_.data();
#endif
    for (int w = 0; w < b_.nwarps; ++w) {
      warps_[w] = Warp();
      warps_[w].size = std::min(32, n_ - 32 * w);
    }
    for (int i = 0; i < n_; ++i) init_thread(i);
  }

  void init_thread(int i) {
    const Dim3 bd = L_.block;
    Thread& t = threads_[i];
    t.tid = {i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
    t.linear = i;
    t.lane = i % 32;
    t.warp_id = i / 32;
    t.warp = &warps_[t.warp_id];
    t.block = &b_;
    t.waiting = nullptr;
    t.done = false;
    t.copies.clear();
    t.group = 0;
    t.stack_lo = stacks_.lo(i + 1);  // stack 0 is slack: an overflow of fiber 0 lands in mapped memory
    write_canary(t);
    prepare(t.ctx, t.stack_lo, L_.cfg->stack_bytes, fiber_main);
  }

  void run_block(long id) {
    init_block(id);
    while (b_.live > 0 && !b_.failed && L_.fault.load() == kOk) {
      const long before = b_.progress;
      if (L_.cfg->schedule == kWarpGreedy) {
        round_warp_greedy(b_, warp_order_);
      } else {
        if (L_.cfg->schedule == kRandom) std::shuffle(order_.begin(), order_.end(), b_.rng);
        round_in_order(b_, order_);
      }
      if (!b_.failed && b_.live > 0 && b_.progress == before) report_deadlock(b_);
    }
    if (!b_.failed) check_redzones();
  }

  void check_redzones() {
    if (const long off = smem_.first_overrun())
      report(L_, kSmemOutOfBounds,
             "block (%u,%u,%u) wrote outside dynamic shared memory: byte offset %ld (size %llu bytes)", b_.bid.x,
             b_.bid.y, b_.bid.z, off, (unsigned long long)L_.cfg->smem_bytes);
  }

  Launch& L_;
  int n_;
  std::vector<Thread> threads_;
  std::vector<Warp> warps_;
  Stacks stacks_;
  SmemArena smem_;
  std::vector<int> order_, warp_order_;
  Block b_;
  std::vector<Shadow> shadow_;
};

inline bool validate(Launch& L) {
  const LaunchConfig& c = *L.cfg;
  const uint64_t threads = (uint64_t)c.block[0] * c.block[1] * c.block[2];
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
  L.nblocks = cfg->blocks ? (long)cfg->nblocks : (long)L.grid.x * L.grid.y * L.grid.z;
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
  else static_assert(kAlwaysFalse<T>, "kernel parameters must be pointers, integers, float or double");
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
