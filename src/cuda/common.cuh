// Internal to src/cuda: error checking, device buffers, launch shapes (mode dispatch: round.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/round.h"
#include "cuda/device.h"
#include "cuda/launch.cuh"

namespace mantis::cuda_detail {

[[noreturn]] inline void fail(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                           cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) fail(e, what, file, line);
}
#define MANTIS_CUDA_CHECK(expr) ::mantis::cuda_detail::check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define MANTIS_CUDA_CHECK_LAUNCH() \
  ::mantis::cuda_detail::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Owning device allocation: the backend's array (device.h).
template <class T> using DeviceBuffer = gpu::Array<T>;

inline cudaStream_t native(const gpu::Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

// a's memory grown (never shrunk) to at least n elements: scratch kept between calls. The old
// buffer is freed first (the two need not coexist); the caller has synchronised its last use.
template <class T>
T* at_least(DeviceBuffer<T>& a, size_t n) {
  if (a.size() < n) a = DeviceBuffer<T>();
  if (a.size() < n) a = DeviceBuffer<T>(n);
  return a.get();
}

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t(1) << 20;  // grid-stride loops above this

inline unsigned blocks_for(size_t work) {
  const size_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < kMaxBlocks ? (b ? b : 1) : kMaxBlocks);
}

// Rounds the device array d[0..n) in place to target t; element i uses
// sr_word(seed, stream, index0 + i, pack) (philox.h). Defined in round_array.cu.
void round_device(float* d, size_t n, const Target<float>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0, int pack, cudaStream_t cs = 0);
void round_device(double* d, size_t n, const Target<double>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0, int pack, cudaStream_t cs = 0);

}  // namespace mantis::cuda_detail

// ---------------------------------------------------------------- scaled formats, block absmax (scheme.cu)
#include "core/quant.h"
#include "core/scheme_block.h"

namespace mantis::cuda_detail {

// One quantize_scheme_device call's scratch and counts (device memory; the call zeroes it).
struct SchemeWork {
  unsigned long long amax_bits;  // two-level: the tensor's amax, as the bits of a binary64 ≥ +0
  unsigned int tensor_nan;       // two-level: a NaN or ±inf in the tensor
  unsigned long long nan_blocks, zero_blocks, clipped;  // SchemeStats' counts
};

// quantize_scheme on device arrays x, y [p.rows × p.cols] (may alias) with the plan of
// plan_scheme_blocks; scales / zero_points (device, p.nbr·p.nbc, or null) receive each block's.
// Element (i, j) uses sr_word(p.elem.seed, stream, index0 + i·cols + j, p.elem.sr_pack). Queued on cs.
void quantize_scheme_device(const SchemeBlockPlan& p, const float* x, float* y, uint64_t stream, uint64_t index0,
                            double* scales, double* zero_points, SchemeWork* w, cudaStream_t cs);
void quantize_scheme_device(const SchemeBlockPlan& p, const double* x, double* y, uint64_t stream, uint64_t index0,
                            double* scales, double* zero_points, SchemeWork* w, cudaStream_t cs);

// quantize_absmax on device arrays (out may alias x), queued on cs.
void quantize_absmax_device(const float* x, float* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                            uint64_t stream, cudaStream_t cs);
void quantize_absmax_device(const double* x, double* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                            uint64_t stream, cudaStream_t cs);

}  // namespace mantis::cuda_detail

// ---------------------------------------------------------------- attention (attention.cu)
#include "cuda/cuda.h"  // defines: AttentionKernel, PolicyPlan
#include "nn/site_health.h"

namespace mantis::cuda_detail {

// Attention (cuda.h cuda_attention_forward) on device arrays q, k, v, out; counts
// [NH, T] (device, zeroed by the caller), probs [NH, T, T] (device) or null, health: the three
// sites' (device memory; each may be null). Synchronises cs before returning (its workspace is the
// host thread's, reused by its next call). attention_validate: the host checks, once.
void attention_validate(const PolicyPlan& pol, int layer, size_t NH, size_t NKV, size_t HS, AttentionKernel kernel);
void attention_device(const PolicyPlan& pol, int layer, const float* q, const float* k, const float* v, size_t T,
                      size_t NH, size_t NKV, size_t HS, float* out, uint64_t* counts, float* probs,
                      AttentionKernel kernel, cudaStream_t cs, const AttentionHealth& health = {});

}  // namespace mantis::cuda_detail
