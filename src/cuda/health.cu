// health — see health.h.
#include <algorithm>

#include "common.cuh"
#include "cuda/health.h"

namespace mantis::gpu {

using cuda_detail::blocks_for;
using cuda_detail::kThreads;
using cuda_detail::native;

namespace {

// Grid-stride: each thread counts its elements (site_health.h's rules), then adds once.
__global__ void count_overflow_kernel(const float* x, size_t n, double max_finite, SiteHealth* h) {
  SiteHealth local;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    health_count_overflow(local, x[i], max_finite);
  cuda_detail::health_add(h, local);
}

__global__ void count_nonfinite_kernel(const float* x, size_t n, SiteHealth* h) {
  SiteHealth local;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    health_count_nonfinite(local, x[i]);
  cuda_detail::health_add(h, local);
}

__global__ void add_overflow_kernel(SiteHealth* h, const unsigned long long* count) {
  SiteHealth local;
  local.overflow = *count;
  cuda_detail::health_add(h, local);
}

// Enough threads to hide latency without a thread per element: counting is a read of x.
unsigned count_blocks(size_t n) { return std::min(blocks_for(n), 4096u); }

}  // namespace

void count_overflow(const float* x, size_t n, double max_finite, SiteHealth* h, const Stream& s) {
  if (!h || n == 0) return;
  cuda_detail::launch("count_overflow_kernel", count_overflow_kernel, count_blocks(n), kThreads, 0, native(s), x, n, max_finite, h);
  MANTIS_CUDA_CHECK_LAUNCH();
}

void count_nonfinite(const float* x, size_t n, SiteHealth* h, const Stream& s) {
  if (!h || n == 0) return;
  cuda_detail::launch("count_nonfinite_kernel", count_nonfinite_kernel, count_blocks(n), kThreads, 0, native(s), x, n, h);
  MANTIS_CUDA_CHECK_LAUNCH();
}

void round_step(float* x, size_t n, const RoundStep& r, uint64_t stream, SiteHealth* h, const Stream& s) {
  count_overflow(x, n, r.max_finite, h, s);
  round(x, n, r.plan, stream, 0, s);
}

void add_overflow(SiteHealth* h, const unsigned long long* count, const Stream& s) {
  if (!h) return;
  cuda_detail::launch("add_overflow_kernel", add_overflow_kernel, 1, 1, 0, native(s), h, count);
  MANTIS_CUDA_CHECK_LAUNCH();
}

}  // namespace mantis::gpu
