// health — site health (nn/site_health.h) counted on the device: the counts of nn/ops.h over
// device arrays, added into a SiteHealth that lives in device memory. Queued on the stream; a null
// SiteHealth* counts nothing. Plain C++, plus (under nvcc) the kernels' atomic add.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/device.h"
#include "nn/policy.h"  // defines: RoundStep
#include "nn/site_health.h"

namespace mantis::gpu {

// x [n]: values a rounding to a format with largest finite value max_finite sends out of range.
void count_overflow(const float* x, size_t n, double max_finite, SiteHealth* h, const Stream& s);
// x [n]: a site's output; its NaNs and infinities.
void count_nonfinite(const float* x, size_t n, SiteHealth* h, const Stream& s);
// One rounding step of a site on x [n] in place (nn/ops.h round_step): counts, then rounds;
// element i uses index i of `stream`.
void round_step(float* x, size_t n, const RoundStep& r, uint64_t stream, SiteHealth* h, const Stream& s);
// h->overflow += *count (a device counter: a scheme's clipped elements).
void add_overflow(SiteHealth* h, const unsigned long long* count, const Stream& s);

}  // namespace mantis::gpu

#if defined(__CUDACC__) || defined(__CUDA_EMU__)
namespace mantis::cuda_detail {

// A thread's counts added into the device's *dst (each nonzero field, atomically).
__device__ inline void health_add(SiteHealth* dst, const SiteHealth& local) {
  static_assert(sizeof(uint64_t) == sizeof(unsigned long long));
  if (!dst) return;
  if (local.overflow) atomicAdd(reinterpret_cast<unsigned long long*>(&dst->overflow), (unsigned long long)local.overflow);
  if (local.nan) atomicAdd(reinterpret_cast<unsigned long long*>(&dst->nan), (unsigned long long)local.nan);
  if (local.inf) atomicAdd(reinterpret_cast<unsigned long long*>(&dst->inf), (unsigned long long)local.inf);
}

}  // namespace mantis::cuda_detail
#endif
