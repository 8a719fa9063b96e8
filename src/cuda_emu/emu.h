// cuda-emu — CUDA's execution model on the CPU, so that the kernel sources of src/cuda run (and are
// checked) where there is no GPU. The .cu files are compiled unchanged by the host compiler against
// cuda_emu/include/cuda_runtime.h; every launch goes through cuda/launch.cuh, which calls launch()
// here instead of <<<…>>>.
//
// Execution model (what runs where):
//   * Each CUDA thread is a fiber of its own (a hand-written x86-64 context switch, a 256 KiB stack
//     behind a guard page). The threads of a block run on one host thread, cooperatively: a thread
//     runs until it reaches __syncthreads, a warp operation or its end, then the next one runs, in
//     the order of MANTIS_CUDA_EMU_ORDER (below). So a thread that reads shared memory before the
//     barrier that should order it sees a different value under another order (the tests run both),
//     and under ThreadSanitizer (fibers switched without synchronisation; a barrier is a release by
//     every arriving thread and an acquire by every leaving one, on an address of the barrier's
//     parity so that a thread already at the next barrier does not order the slower ones) the read
//     is reported as a race.
//   * __syncthreads: every thread of the block must reach it, as often as the others (counted per
//     thread: code the host compiler duplicated has several addresses for one barrier). One that
//     ends first, or waits at a barrier the others passed, is an error naming the kernel, the block
//     and the threads — never a hang.
//   * Warp operations (__shfl_xor_sync, __syncwarp): a rendezvous of the lanes named by the mask,
//     which must include the calling lane, be the same on every lane, and (shuffles) contain the
//     lane read from; a lane of the mask that never arrives is a deadlock, reported.
//   * Blocks run on host threads of their own (__shared__ is a static thread_local: one copy per
//     block), up to MANTIS_CUDA_EMU_BLOCKS at a time, unordered among themselves (ThreadSanitizer
//     sees races between them), in the order of MANTIS_CUDA_EMU_ORDER.
//   * Device memory is host memory from malloc, filled with 0xFF bytes (a NaN in every float
//     format) so that reading what was never written shows, with a 64-byte guard zone at each end
//     checked after every kernel and copy (a write out of bounds is an error naming the kernel);
//     AddressSanitizer sees reads out of bounds too. Copies are checked against their allocations.
//   * Streams and events: one ordered queue for all streams; queued work runs at the next
//     synchronising call (stream or device synchronise, a synchronous copy or memset, cudaFree),
//     where its errors are returned, as CUDA returns execution errors. An execution error is
//     sticky (as CUDA's) until clear_error().
//   * Atomics are the host's (blocks run concurrently); cuBLAS SGEMM is Eigen's float GEMM.
// What it cannot show: tensor-core instructions (cuda_tensor_core_probe finds none here; the
// matrix-unit models of core/matrix_unit.h stand in), the GPU's memory model beyond barriers and
// atomics (no weak ordering, no caches), warp-synchronous code that relies on lockstep execution
// without a __syncwarp, device-side code paths under __CUDA_ARCH__ (the shared MANTIS_HD headers
// take their host branches here), and speed. Results are labelled "cuda-emu" wherever reported.
//
// MANTIS_CUDA_EMU_ORDER   forward (default) | reverse | shuffle:SEED — threads between barriers
//                         and blocks within a grid
// MANTIS_CUDA_EMU_BLOCKS  blocks run at once (default 4)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "include/cuda_runtime.h"

namespace cuda_emu {

// Defects a test plants in the kernels (cuda/launch.cuh MANTIS_PLANTED): 0 in every other run.
inline unsigned planted = 0;

enum class Order : uint8_t { forward, reverse, shuffle };
struct Options {
  Order order = Order::forward;
  uint64_t seed = 0;              // shuffle
  unsigned concurrent_blocks = 4;
};
// The schedule (from the environment at first use; tests may change it between launches).
Options& options();

// Queues kernel `name` on stream s: body (the kernel called with its arguments) runs once in every
// CUDA thread of the grid. A bad configuration is returned at once (cudaErrorInvalidConfiguration,
// as cudaGetLastError after <<<…>>>).
cudaError_t launch(const char* name, dim3 grid, dim3 block, size_t shared, cudaStream_t s,
                   std::function<void()> body);

// Queues host work `f` (a library call such as cuBLAS's) in stream order.
cudaError_t enqueue_host(const char* name, std::function<void()> f);

// The running block's dynamic shared memory (`extern __shared__`): the launch's `shared` bytes.
void* dynamic_shared();

// The sticky execution error, described ("" when none), and clearing it (as a device reset would).
std::string error_detail();
void clear_error();

}  // namespace cuda_emu
