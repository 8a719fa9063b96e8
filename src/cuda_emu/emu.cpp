// cuda-emu's engine: fibers, blocks, the queue, device memory and the runtime API (emu.h).
#include "cuda_emu/emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if !defined(__x86_64__)
#error "cuda-emu switches its fibers with x86-64 code (meson builds it only there)"
#endif

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

namespace cuda_emu {

Options& options() {
  static Options o = [] {
    Options x;
    if (const char* e = std::getenv("MANTIS_CUDA_EMU_ORDER")) {
      const std::string s = e;
      const bool seeded = s.rfind("shuffle:", 0) == 0 && s.size() > 8 &&
                          s.find_first_not_of("0123456789", 8) == std::string::npos;
      if (s == "reverse") x.order = Order::reverse;
      else if (s == "shuffle" || seeded) {
        x.order = Order::shuffle;
        if (seeded) x.seed = std::strtoull(s.c_str() + 8, nullptr, 10);
      } else if (s != "forward") {
        std::fprintf(stderr, "MANTIS_CUDA_EMU_ORDER=%s: expected forward, reverse or shuffle:SEED\n", e);
        std::exit(2);
      }
    }
    if (const char* e = std::getenv("MANTIS_CUDA_EMU_BLOCKS")) {
      char* end = nullptr;
      const long n = std::strtol(e, &end, 10);
      if (end == e || *end != '\0' || n < 1 || n > 256) {
        std::fprintf(stderr, "MANTIS_CUDA_EMU_BLOCKS=%s: expected 1..256\n", e);
        std::exit(2);
      }
      x.concurrent_blocks = unsigned(n);
    }
    return x;
  }();
  return o;
}

namespace {

// ---------------------------------------------------------------- errors
std::mutex g_error_mutex;
cudaError_t g_sticky = cudaSuccess;   // an execution error, until clear_error()
std::string g_detail;
thread_local cudaError_t t_last = cudaSuccess;  // cudaGetLastError's

void set_sticky(const std::string& what) {
  std::lock_guard<std::mutex> l(g_error_mutex);
  if (g_sticky == cudaSuccess) g_sticky = cudaErrorLaunchFailure, g_detail = what;
}
cudaError_t sticky() {
  std::lock_guard<std::mutex> l(g_error_mutex);
  return g_sticky;
}
cudaError_t fail_now(cudaError_t e) { return t_last = e; }

std::string str(dim3 d) { return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")"; }
std::string str(uint3 d) { return str(dim3(d)); }
std::string fmt_hex(unsigned x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", x);
  return buf;
}

// ---------------------------------------------------------------- device memory
constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xA5, kFresh = 0xFF;

struct Allocation {
  size_t bytes;
};
std::mutex g_mem_mutex;
std::map<const char*, Allocation> g_allocs;  // by user pointer

// The allocation holding [p, p + n) (n ≥ 1), or none.
bool in_allocation(const void* p, size_t n) {
  std::lock_guard<std::mutex> l(g_mem_mutex);
  const char* c = static_cast<const char*>(p);
  auto it = g_allocs.upper_bound(c);
  if (it == g_allocs.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second.bytes;
}

// A guard zone that is no longer intact: its allocation described, else "". The zones are restored,
// so that each such write is reported once.
std::string broken_guards() {
  std::lock_guard<std::mutex> l(g_mem_mutex);
  std::string what;
  for (const auto& [p, a] : g_allocs) {
    char* c = const_cast<char*>(p);
    for (size_t i = 0; i < kGuard && what.empty(); ++i) {
      if (static_cast<unsigned char>(p[-1 - ptrdiff_t(i)]) != kGuardByte)
        what = "a write " + std::to_string(i + 1) + " bytes before the device allocation of " +
               std::to_string(a.bytes) + " bytes";
      else if (static_cast<unsigned char>(p[a.bytes + i]) != kGuardByte)
        what = "a write " + std::to_string(i) + " bytes past the end of the device allocation of " +
               std::to_string(a.bytes) + " bytes";
    }
    if (!what.empty()) {
      std::memset(c - kGuard, kGuardByte, kGuard);
      std::memset(c + a.bytes, kGuardByte, kGuard);
      return what;
    }
  }
  return "";
}

// ---------------------------------------------------------------- the queue
// Every stream is this one queue: work runs in the order it was queued, at the next synchronising
// call, on the calling host thread.
std::mutex g_queue_mutex;
std::deque<std::function<void()>> g_queue;

void enqueue(std::function<void()> f) {
  std::lock_guard<std::mutex> l(g_queue_mutex);
  g_queue.push_back(std::move(f));
}

// Runs what is queued (work queued by a sticky-failed context is dropped, as CUDA's is); returns the
// sticky error.
cudaError_t drain() {
  for (;;) {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> l(g_queue_mutex);
      if (g_queue.empty()) break;
      f = std::move(g_queue.front());
      g_queue.pop_front();
    }
    if (sticky() == cudaSuccess) f();
  }
  return sticky();
}

// ---------------------------------------------------------------- fibers and blocks
constexpr size_t kStack = 256 * 1024;

enum class State : int { ready, barrier, warp, done, failed };
enum class WarpOp : int { shfl, sync };
const char* op_name(int op) { return op == int(WarpOp::shfl) ? "__shfl_xor_sync" : "__syncwarp"; }

struct Block;

// A field the scheduler and the fibers of a block share. They run on one host thread, one at a time,
// but ThreadSanitizer sees each fiber as a thread of its own: an atomic keeps the emulator's own
// bookkeeping out of its reports, relaxed so that it costs a plain load or store.
template <class T>
struct Shared {
  std::atomic<T> v;
  Shared(T x = T()) : v(x) {}
  operator T() const { return v.load(std::memory_order_relaxed); }
  Shared& operator=(T x) {
    v.store(x, std::memory_order_relaxed);
    return *this;
  }
};

// A CUDA thread's context: its stack (kept by its worker from block to block) and its state.
struct Fiber {
  void* sp = nullptr;      // the saved stack pointer while switched out
  char* region = nullptr;  // guard page + stack
  uint3 tid{};
  unsigned linear = 0;
  Shared<int> state{int(State::ready)};
  Shared<uint64_t> barriers{0};  // the __syncthreads this thread has reached
  Shared<int> op{0};
  Shared<unsigned> mask{0};
  Shared<int> lane_mask{0}, width{32};
  Shared<uint64_t> value{0}, result{0};
#if EMU_TSAN
  void* tsan = nullptr;
  // A __syncwarp's release goes to warp_sync[its number's parity]; peers_parity holds, for each lane
  // of the settled one, the parity its lanes released to. One address for every __syncwarp would
  // let a lane that already went on to the next one release into what a slower lane still acquires
  // from this one, and so order (hide) the races between their accesses after it.
  Shared<uint64_t> warp_ops{0};
  Shared<unsigned> peers_parity{0};
  char warp_sync[2] = {0, 0};
#endif
#if EMU_ASAN
  void* fake = nullptr;
#endif
};

struct Block {
  const char* kernel;
  uint3 id;
  dim3 dim;
  dim3 grid;
  const std::function<void()>* body;
  std::vector<Fiber*> fibers;  // [threads of the block], the worker's
  Shared<Fiber*> current{nullptr};
  void* sched_sp = nullptr;  // the scheduler's, while a fiber runs
  Shared<bool> failed{false};
  std::string error;  // written once, by the failing thread (fail) or the scheduler
  std::vector<unsigned char> shared;
  // ThreadSanitizer sync addresses. A barrier releases to and acquires from barrier_sync[its number's
  // parity]: with one address, the first thread on to the next barrier would release into what the
  // others still acquire from this one, ordering (hiding) every race between the two barriers.
  char done_sync = 0, barrier_sync[2] = {0, 0};
#if EMU_TSAN
  void* sched_tsan = nullptr;
#endif
#if EMU_ASAN
  void* sched_fake = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
#endif
};

thread_local Block* t_block = nullptr;

// ---------------------------------------------------------------- the context switch
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save and continues on `to` (a stack saved the same way, or primed by
// prime()). No system call: swapcontext's signal mask made each switch one.
extern "C" void cuda_emu_switch(void** save, void* to);
asm(R"(
  .text
  .p2align 4
  .globl cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

void fiber_main();

// f's stack made to start fiber_main at the next switch to it: the frame cuda_emu_switch pops
// (the worker's MXCSR and x87 control word, six zero registers, fiber_main as the return address),
// aligned as after a call.
void prime(Fiber& f) {
  // Tops staggered by a few cache lines: stacks a page-multiple apart would all map to the same
  // cache sets, and a block's threads run in turn.
  const size_t color = (size_t(f.linear) * 192) % 4096;
  auto* top = reinterpret_cast<uint64_t*>(f.region + size_t(sysconf(_SC_PAGESIZE)) + kStack - color);
  uint64_t* sp = top - 9;
  uint32_t csr;
  uint16_t cw;
  asm volatile("stmxcsr %0" : "=m"(csr));
  asm volatile("fnstcw %0" : "=m"(cw));
  sp[0] = uint64_t(csr) | uint64_t(cw) << 32;
  for (int i = 1; i <= 6; ++i) sp[i] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&fiber_main);
  sp[8] = 0;
  f.sp = sp;
}

std::string where(const Block& b, const Fiber& f) {
  return std::string("kernel ") + b.kernel + ", block " + str(b.id) + ", thread " + str(f.tid);
}

// Fiber → scheduler. `final`: the fiber will not run again.
void to_scheduler(Block& b, Fiber& f, bool final) {
  void* const to = b.sched_sp;
#if EMU_TSAN
  void* const sched = b.sched_tsan;  // read before the release below: its last access as this thread
  // A thread that will not run again hands its whole history to the block's end (run_block).
  if (final) __tsan_release(&b.done_sync);
  __tsan_switch_to_fiber(sched, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASAN
  __sanitizer_start_switch_fiber(final ? nullptr : &f.fake, b.sched_bottom, b.sched_size);
#endif
  (void)final;
  cuda_emu_switch(&f.sp, to);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake, nullptr, nullptr);
#endif
}

// Scheduler → fiber f, until it blocks or ends.
[[gnu::noinline]] void to_fiber(Block& b, Fiber& f) {
  b.current = &f;
  void* const to = f.sp;  // read as the scheduler, before ThreadSanitizer is told of the switch
#if EMU_TSAN
  __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&b.sched_fake, f.region + sysconf(_SC_PAGESIZE), kStack);
#endif
  cuda_emu_switch(&b.sched_sp, to);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(b.sched_fake, nullptr, nullptr);
#endif
}

// Thrown by fail() to the thread's fiber_main, so that the thread's stack is unwound (its frames'
// objects destroyed) before it is left for good.
struct ThreadFailed {};

// An error in the running thread: recorded for the block, and the thread never resumes.
[[noreturn]] void fail(const std::string& what) {
  Block& b = *t_block;
  Fiber& f = *static_cast<Fiber*>(b.current);
  b.error = where(b, f) + ": " + what;  // the first error: the scheduler runs no thread after it
#if EMU_TSAN
  __tsan_release(&b.error);
#endif
  b.failed = true;
  throw ThreadFailed{};
}

void fiber_main() {
#if EMU_TSAN
  __tsan_acquire(&t_block);  // the block as run_block set it up
#endif
  Block& b = *t_block;
  Fiber& f = *static_cast<Fiber*>(b.current);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.sched_bottom, &b.sched_size);
#endif
  try {
    (*b.body)();
    f.state = int(State::done);
  } catch (const ThreadFailed&) {
    f.state = int(State::failed);
  }
  to_scheduler(b, f, true);
  std::abort();  // not reached: an ended fiber is never resumed
}

// Warp operations whose lanes have all arrived: completed. A lane that cannot arrive: an error.
// Returns whether any completed.
bool settle_warps(Block& b) {
  bool any = false;
  const size_t n = b.fibers.size();
  for (size_t w = 0; w * 32 < n; ++w) {
    const size_t lo = w * 32, hi = std::min(n, lo + 32);
    Fiber* first = nullptr;
    for (size_t i = lo; i < hi; ++i)
      if (b.fibers[i]->state == int(State::warp)) {
        first = b.fibers[i];
        break;
      }
    if (!first) continue;
    const unsigned mask = first->mask;
    const int op = first->op;
    bool all = true;
    for (unsigned l = 0; l < 32; ++l) {
      if (!(mask >> l & 1)) continue;
      const size_t i = lo + l;
      if (i >= hi) {
        b.failed = true;
        b.error = where(b, *first) + ": a warp operation's mask 0x" + fmt_hex(mask) + " names lane " +
                  std::to_string(l) + ", which this block does not have";
        return false;
      }
      Fiber& g = *b.fibers[i];
      const int st = g.state;
      if (st == int(State::warp) && (g.mask != mask || g.op != op)) {
        b.failed = true;
        b.error = where(b, g) + ": " + op_name(g.op) +
                  " with mask 0x" + fmt_hex(g.mask) + " while lane " + std::to_string(first->linear % 32) +
                  " waits in " + op_name(op) + " with mask 0x" +
                  fmt_hex(mask);
        return false;
      }
      if (st != int(State::warp)) all = false;
    }
    if (!all) continue;  // the scheduler decides whether the missing lanes can still come
#if EMU_TSAN
    unsigned parity = 0;
    for (unsigned l = 0; l < 32; ++l)
      if (mask >> l & 1) parity |= unsigned(b.fibers[lo + l]->warp_ops & 1) << l;
#endif
    for (unsigned l = 0; l < 32; ++l) {
      if (!(mask >> l & 1)) continue;
      Fiber& g = *b.fibers[lo + l];
      if (op == int(WarpOp::shfl)) {
        const int width = g.width;
        unsigned src = l ^ unsigned(g.lane_mask);
        if (src / unsigned(width) != l / unsigned(width) || src >= 32) src = l;
        if (!(mask >> src & 1)) {
          b.failed = true;
          b.error = where(b, g) + ": __shfl_xor_sync reads lane " + std::to_string(src) + ", outside its mask 0x" +
                    fmt_hex(mask);
          return false;
        }
        g.result = uint64_t(b.fibers[lo + src]->value);
      }
#if EMU_TSAN
      g.peers_parity = parity;
#endif
      g.state = int(State::ready);
    }
    any = true;
  }
  return any;
}

// The order of n things (a block's threads, a grid's blocks) under options(): forward, reverse, or
// shuffled by the seed and `salt` (which launch, which block).
std::vector<size_t> schedule(size_t n, uint64_t salt) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  const Options& o = options();
  if (o.order == Order::reverse) std::reverse(order.begin(), order.end());
  if (o.order == Order::shuffle) {
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull ^ salt);
    std::shuffle(order.begin(), order.end(), rng);
  }
  return order;
}

// ---------------------------------------------------------------- one block
// A host thread that runs blocks, one at a time; its fibers' stacks are kept for the next block.
struct Worker {
  std::vector<std::unique_ptr<Fiber>> fibers;
};

// Runs block `id` of a launch on this worker; returns its error ("" when none).
std::string run_block(Worker& w, const char* kernel, dim3 grid, dim3 dim, uint3 id, size_t shared,
                      const std::function<void()>& body, uint64_t launch_no) {
  Block b;
  b.kernel = kernel, b.id = id, b.dim = dim, b.grid = grid, b.body = &body;
  b.shared.assign(shared, kFresh);
  const size_t n = size_t(dim.x) * dim.y * dim.z;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  while (w.fibers.size() < n) {
    auto f = std::make_unique<Fiber>();
    void* r = mmap(nullptr, page + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return std::string("kernel ") + kernel + ": cuda-emu could not map a thread's stack";
    f->region = static_cast<char*>(r);
    mprotect(f->region, page, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
#if EMU_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
    w.fibers.push_back(std::move(f));
  }
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = *w.fibers[i];
    f.linear = unsigned(i);
    f.tid = uint3{unsigned(i % dim.x), unsigned(i / dim.x % dim.y), unsigned(i / (size_t(dim.x) * dim.y))};
    f.state = int(State::ready);
    f.barriers = 0;
    prime(f);
    b.fibers.push_back(&f);
  }
  t_block = &b;
#if EMU_TSAN
  b.sched_tsan = __tsan_get_current_fiber();
  __tsan_release(&t_block);  // everything above, for the fibers (fiber_main)
#endif
  // The order in which ready threads run between barriers.
  const std::vector<size_t> order =
      schedule(n, launch_no * 0xBF58476D1CE4E5B9ull ^ (uint64_t(id.x) << 32 | uint64_t(id.y) << 16 | id.z));
  for (;;) {
    for (size_t i : order) {
      Fiber& f = *b.fibers[i];
      if (f.state == int(State::ready)) to_fiber(b, f);
      if (b.failed) break;
    }
    if (b.failed) break;
    if (settle_warps(b)) continue;
    if (b.failed) break;
    size_t done = 0, at_barrier = 0, in_warp = 0;
    const Fiber* waiting = nullptr;
    const Fiber* ended = nullptr;
    const Fiber* other_site = nullptr;
    for (const Fiber* f : b.fibers) {
      const int st = f->state;
      if (st == int(State::done)) ++done, ended = ended ? ended : f;
      if (st == int(State::barrier)) {
        ++at_barrier;
        if (!waiting) waiting = f;
        else if (f->barriers != waiting->barriers && !other_site) other_site = f;
      }
      if (st == int(State::warp)) ++in_warp;
    }
    if (done == n) break;
    if (at_barrier == n && !other_site) {  // every thread at the same barrier: all go on
      for (Fiber* f : b.fibers) f->state = int(State::ready);
      continue;
    }
    // Nothing can run: a deadlock, described.
    if (other_site)
      b.error = where(b, *other_site) + ": waits at its __syncthreads number " +
                std::to_string(uint64_t(other_site->barriers)) + " while thread " + str(waiting->tid) +
                " waits at its number " + std::to_string(uint64_t(waiting->barriers)) +
                " (a barrier in code that not every thread runs alike)";
    else if (at_barrier && done)
      b.error = where(b, *waiting) + ": __syncthreads is not reached by every thread of the block (" +
                std::to_string(done) + " of " + std::to_string(n) + " ended first, e.g. thread " + str(ended->tid) +
                "): a deadlock on a GPU";
    else if (in_warp) {
      for (const Fiber* f : b.fibers)
        if (f->state == int(State::warp)) {
          b.error = where(b, *f) + ": a warp operation with mask 0x" + fmt_hex(f->mask) +
                    " waits for lanes that never reach it (ended, or at a barrier): a deadlock on a GPU";
          break;
        }
    } else {
      b.error = std::string("kernel ") + kernel + ", block " + str(id) + ": no thread can run (a deadlock)";
    }
    break;
  }
#if EMU_TSAN
  // Threads left waiting (the block failed) hand their history over too, as if they had ended.
  void* const sched = b.sched_tsan;
  char* const done = &b.done_sync;
  for (Fiber* f : b.fibers)
    if (f->state != int(State::done) && f->state != int(State::failed)) {
      void* const t = f->tsan;
      __tsan_switch_to_fiber(t, __tsan_switch_to_fiber_no_sync);
      __tsan_release(done);  // nothing else read in between: that would be that thread's read
      __tsan_switch_to_fiber(sched, __tsan_switch_to_fiber_no_sync);
    }
  __tsan_acquire(&b.done_sync);
  __tsan_acquire(&b.error);
#endif
  t_block = nullptr;
  return b.error;
}

// ---------------------------------------------------------------- grids
// The blocks of one launch, handed to the workers in the schedule's order.
struct Grid {
  const char* kernel;
  dim3 grid, block;
  size_t shared;
  const std::function<void()>* body;
  uint64_t launch_no;
  std::vector<size_t> order;
  std::vector<std::string> errors;
  size_t next = 0, finished = 0;
};

// options().concurrent_blocks host threads, started at the first launch and kept (never joined:
// they wait for work until the process ends). Blocks of a grid run on them concurrently.
struct Pool {
  std::mutex m;
  std::condition_variable work, done;
  Grid* grid = nullptr;
  size_t started = 0;

  void loop() {
    Worker w;
    std::unique_lock<std::mutex> l(m);
    for (;;) {
      work.wait(l, [&] { return grid && grid->next < grid->order.size(); });
      Grid& g = *grid;
      const size_t bi = g.order[g.next++];
      l.unlock();
      const uint3 id{unsigned(bi % g.grid.x), unsigned(bi / g.grid.x % g.grid.y),
                     unsigned(bi / (size_t(g.grid.x) * g.grid.y))};
      std::string e = run_block(w, g.kernel, g.grid, g.block, id, g.shared, *g.body, g.launch_no);
      l.lock();
      g.errors[bi] = std::move(e);
      if (++g.finished == g.order.size()) done.notify_all();
    }
  }
  void run(Grid& g) {
    std::unique_lock<std::mutex> l(m);
    while (started < options().concurrent_blocks) {
      std::thread([this] { loop(); }).detach();
      ++started;
    }
    grid = &g;
    work.notify_all();
    done.wait(l, [&] { return g.finished == g.order.size(); });
    grid = nullptr;
  }
};

std::atomic<uint64_t> g_launches{0};

// Every block of a grid, up to options().concurrent_blocks at a time, in the schedule's order.
void run_grid(const char* kernel, dim3 grid, dim3 block, size_t shared, const std::function<void()>& body) {
  static Pool* pool = new Pool;  // never destroyed: its threads outlive static destruction
  Grid g{kernel, grid, block, shared, &body, g_launches++, {}, {}};
  const size_t nb = size_t(grid.x) * grid.y * grid.z;
  g.order = schedule(nb, g.launch_no * 0xD6E8FEB86659FD93ull);
  g.errors.resize(nb);
  pool->run(g);
  for (const std::string& e : g.errors)
    if (!e.empty()) return set_sticky("cuda-emu: " + e);
  const std::string gz = broken_guards();
  if (!gz.empty()) set_sticky(std::string("cuda-emu: kernel ") + kernel + ": " + gz + " (out of bounds)");
}

}  // namespace

// ---------------------------------------------------------------- device-side calls
void syncthreads() {
  Block* b = t_block;
  Fiber& f = *static_cast<Fiber*>(b->current);
  f.barriers = f.barriers + 1;
#if EMU_TSAN
  char* const sync = &b->barrier_sync[f.barriers & 1];
  __tsan_release(sync);
#endif
  f.state = int(State::barrier);
  to_scheduler(*b, f, false);
#if EMU_TSAN
  __tsan_acquire(sync);
#endif
}

namespace {
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t bits, int lane_mask, int width) {
  Block* b = t_block;
  Fiber& f = *static_cast<Fiber*>(b->current);
  const unsigned lane = f.linear % 32;
  if (!(mask >> lane & 1))
    fail(std::string(op_name(int(op))) + " with mask 0x" + fmt_hex(mask) +
         ", which leaves out the calling lane " + std::to_string(lane));
  if (op == WarpOp::shfl && (width < 1 || width > 32 || (width & (width - 1))))
    fail("__shfl_xor_sync with width " + std::to_string(width) + " (a power of two ≤ 32)");
  f.op = int(op), f.mask = mask, f.value = bits, f.lane_mask = lane_mask, f.width = width;
  // ThreadSanitizer: __syncwarp orders the lanes' memory as a barrier among them does; a shuffle
  // exchanges registers only and orders no memory (CUDA's memory model: a lane that reads what
  // another wrote before a shuffle, with no __syncwarp between, races).
#if EMU_TSAN
  const bool orders = op == WarpOp::sync;
  if (orders) {
    f.warp_ops = f.warp_ops + 1;
    __tsan_release(&f.warp_sync[f.warp_ops & 1]);
  }
#endif
  f.state = int(State::warp);
  to_scheduler(*b, f, false);
#if EMU_TSAN
  const unsigned base = f.linear - lane;
  if (orders)
    for (unsigned l = 0; l < 32; ++l)
      if (mask >> l & 1) __tsan_acquire(&b->fibers[base + l]->warp_sync[unsigned(f.peers_parity) >> l & 1]);
#endif
  return f.result;
}
}  // namespace

void syncwarp(unsigned mask) { warp_op(WarpOp::sync, mask, 0, 0, 32); }
uint64_t shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width) {
  return warp_op(WarpOp::shfl, mask, bits, lane_mask, width);
}

uint3 thread_index() { return static_cast<Fiber*>(t_block->current)->tid; }
uint3 block_index() { return t_block->id; }
dim3 block_dim() { return t_block->dim; }
dim3 grid_dim() { return t_block->grid; }

void* dynamic_shared() {
  Block* b = t_block;
  return b->shared.empty() ? nullptr : b->shared.data();
}

cudaError_t launch(const char* name, dim3 grid, dim3 block, size_t shared, cudaStream_t, std::function<void()> body) {
  const size_t threads = size_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.z > 64 ||
      grid.y > 65535 || grid.z > 65535 || shared > 48 * 1024) {
    std::lock_guard<std::mutex> l(g_error_mutex);
    if (g_detail.empty())
      g_detail = std::string("cuda-emu: kernel ") + name + ": launch configuration grid " + str(grid) + ", block " +
                 str(block) + ", " + std::to_string(shared) + " bytes of shared memory";
    return fail_now(cudaErrorInvalidConfiguration);
  }
  enqueue([name, grid, block, shared, body = std::move(body)] { run_grid(name, grid, block, shared, body); });
  return cudaSuccess;
}

cudaError_t enqueue_host(const char*, std::function<void()> f) {
  enqueue(std::move(f));
  return cudaSuccess;
}

std::string error_detail() {
  std::lock_guard<std::mutex> l(g_error_mutex);
  return g_detail;
}
void clear_error() {
  drain();
  std::lock_guard<std::mutex> l(g_error_mutex);
  g_sticky = cudaSuccess, g_detail.clear(), t_last = cudaSuccess;
}

}  // namespace cuda_emu

// ---------------------------------------------------------------- runtime API
using namespace cuda_emu;

namespace {
cudaError_t result(cudaError_t e) { return e == cudaSuccess ? e : (t_last = e); }

// A copy's device side: within one allocation, else an error (host pointers are not checked).
cudaError_t check_range(const void* p, size_t n, bool device, const char* what) {
  if (!device || n == 0 || in_allocation(p, n)) return cudaSuccess;
  std::lock_guard<std::mutex> l(g_error_mutex);
  g_detail = std::string("cuda-emu: ") + what + " of " + std::to_string(n) +
             " bytes: the device range is not inside one allocation";
  return cudaErrorInvalidValue;
}
bool dst_device(cudaMemcpyKind k) { return k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice; }
bool src_device(cudaMemcpyKind k) { return k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice; }

cudaError_t after_copy(const char* what) {
  const std::string g = broken_guards();
  if (!g.empty()) set_sticky(std::string("cuda-emu: ") + what + ": " + g);
  return sticky();
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return result(cudaErrorInvalidValue);
  char* raw = static_cast<char*>(std::malloc(bytes + 2 * kGuard));
  if (!raw) return result(cudaErrorMemoryAllocation);
  std::memset(raw, kGuardByte, kGuard);
  std::memset(raw + kGuard, kFresh, bytes);
  std::memset(raw + kGuard + bytes, kGuardByte, kGuard);
  {
    std::lock_guard<std::mutex> l(g_mem_mutex);
    g_allocs[raw + kGuard] = Allocation{bytes};
  }
  *p = raw + kGuard;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  const cudaError_t e = drain();  // cudaFree waits for the device, as CUDA's does
  std::string g = broken_guards();
  {
    std::lock_guard<std::mutex> l(g_mem_mutex);
    auto it = g_allocs.find(static_cast<char*>(p));
    if (it == g_allocs.end()) return result(cudaErrorInvalidValue);
    g_allocs.erase(it);
  }
  if (!g.empty()) set_sticky("cuda-emu: at cudaFree: " + g);
  std::free(static_cast<char*>(p) - kGuard);
  return e == cudaSuccess ? sticky() : e;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (cudaError_t e = drain(); e != cudaSuccess) return e;
  if (cudaError_t e = check_range(dst, bytes, dst_device(kind), "cudaMemcpy destination"); e) return result(e);
  if (cudaError_t e = check_range(src, bytes, src_device(kind), "cudaMemcpy source"); e) return result(e);
  if (bytes) std::memmove(dst, src, bytes);
  return after_copy("cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  if (cudaError_t e = check_range(dst, bytes, dst_device(kind), "cudaMemcpyAsync destination"); e) return result(e);
  if (cudaError_t e = check_range(src, bytes, src_device(kind), "cudaMemcpyAsync source"); e) return result(e);
  enqueue([=] {
    if (bytes) std::memmove(dst, src, bytes);
    after_copy("cudaMemcpyAsync");
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (cudaError_t e = drain(); e != cudaSuccess) return e;
  if (cudaError_t e = check_range(p, bytes, true, "cudaMemset"); e) return result(e);
  if (bytes) std::memset(p, value, bytes);
  return sticky();
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (cudaError_t e = check_range(p, bytes, true, "cudaMemsetAsync"); e) return result(e);
  enqueue([=] {
    if (bytes) std::memset(p, value, bytes);
  });
  return cudaSuccess;
}

struct CUstream_st {
  int unused;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st{0};
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  drain();
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return drain(); }
cudaError_t cudaDeviceSynchronize() { return drain(); }

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  enqueue([e] { e->t = std::chrono::steady_clock::now(); });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return drain(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last != cudaSuccess ? t_last : sticky();
  t_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return t_last != cudaSuccess ? t_last : sticky(); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  // What the emulator found, in words (one per thread: the pointer stays valid until the next call).
  thread_local std::string s;
  s = error_detail();
  if (e == cudaSuccess || s.empty()) s = cudaGetErrorName(e);
  return s.c_str();
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "cuda-emu (CUDA's execution model on the CPU)");
  p->major = 0, p->minor = 0;  // no compute capability: no tensor cores, no FP8
  p->totalGlobalMem = size_t(1) << 34;
  p->sharedMemPerBlock = 48 * 1024;
  p->multiProcessorCount = int(options().concurrent_blocks);
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  return cudaSuccess;
}
