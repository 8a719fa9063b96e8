// Internal to src/cuda: error checking, device buffers, launch shapes (mode dispatch: round.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/round.h"

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

// Owning device allocation (cudaMalloc; never managed memory).
template <class T> class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) MANTIS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const T* host, size_t n, size_t offset = 0) {
    if (n) MANTIS_CUDA_CHECK(cudaMemcpy(p_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host, size_t n, size_t offset = 0) const {
    if (n) MANTIS_CUDA_CHECK(cudaMemcpy(host, p_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t(1) << 20;  // grid-stride loops above this

inline unsigned blocks_for(size_t work) {
  const size_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < kMaxBlocks ? (b ? b : 1) : kMaxBlocks);
}

// Rounds the device array d[0..n) in place to target t; element i uses
// random_word(seed, stream, index0 + i). Defined in round_array.cu.
void round_device(float* d, size_t n, const Target<float>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0);
void round_device(double* d, size_t n, const Target<double>& t, Rounding m, uint64_t seed,
                  uint64_t stream, uint64_t index0);

}  // namespace mantis::cuda_detail
