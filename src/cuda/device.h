// device — the GPU backend's device-resident arrays and streams, and the operations on them.
// Plain C++ (no CUDA headers): CPU code, the contracts and the CLI include it.
//
// An operation on device arrays is queued on a Stream and returns at once; launch errors throw at
// once, execution errors at the next synchronize() or download (std::runtime_error naming the
// file, line and CUDA error). Operations take plans validated on the host (round_array.h RoundPlan,
// gemm.h GemmPlan): nothing is validated or copied to the host per call. The host-pointer API of
// cuda.h is these operations with an upload before and a download after.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/gemm.h"
#include "core/round_array.h"
#include "optim/adamw_step.h"
#include "optim/gefen_block.h"

namespace mantis::gpu {

// Raw device memory (cudaMalloc; never managed memory) and synchronous copies.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);

// A CUDA stream (blocking: ordered with the legacy default stream, where Array's synchronous
// copies run). The default-constructed one is the legacy default stream.
class Stream {
 public:
  Stream() = default;
  static Stream create();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept { std::swap(s_, o.s_); return *this; }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void synchronize() const;  // waits for the queued work; throws its execution errors
  void* handle() const { return s_; }  // a cudaStream_t

 private:
  void* s_ = nullptr;
};

// n elements of T on the device, owned.
template <class T>
class Array {
 public:
  Array() = default;
  explicit Array(size_t n) : p_(n ? static_cast<T*>(device_alloc(n * sizeof(T))) : nullptr), n_(n) {}
  explicit Array(const std::vector<T>& host) : Array(host.size()) { upload(host.data(), host.size()); }
  ~Array() { device_free(p_); }
  Array(Array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Array& operator=(Array&& o) noexcept { std::swap(p_, o.p_), std::swap(n_, o.n_); return *this; }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;

  T* get() const { return p_; }  // the device pointer
  size_t size() const { return n_; }
  // Synchronous copies of n elements at `offset` (they wait for all queued work, as cudaMemcpy).
  void upload(const T* host, size_t n, size_t offset = 0) {
    if (n) copy_to_device(p_ + offset, host, n * sizeof(T));
  }
  void download(T* host, size_t n, size_t offset = 0) const {
    if (n) copy_to_host(host, p_ + offset, n * sizeof(T));
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(n_);
    download(v.data(), n_);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// x[0..n) rounded in place by plan p; element i uses random_word(p.seed, stream, index0 + i).
void round(float* x, size_t n, const RoundPlan& p, uint64_t stream, uint64_t index0, const Stream& s);
void round(double* x, size_t n, const RoundPlan& p, uint64_t stream, uint64_t index0, const Stream& s);

// C [M,N] = C0 + A [M,K] · B [K,N] (row-major, device) by plan p, as gemm(p, …, stream, C0) of
// gemm.h: C0 [M,N] (device, or null: zeros) the addend. A and B are read-only unless p.input,
// which rounds them in place first (their streams as gemm.h).
void gemm(const GemmPlan& p, float* A, float* B, double* C, size_t M, size_t N, size_t K, uint64_t stream,
          const Stream& s, const double* C0 = nullptr);

// C [M,N] = A [M,K] · B in binary32 by cuBLAS SGEMM, B [K,N] or, when bt, [N,K] (row-major,
// device; FP32 math, no TF32): the native GEMM. Its summation order is cuBLAS's own, so it agrees
// with a CPU product only within a tolerance.
void sgemm(const float* A, const float* B, float* C, size_t M, size_t N, size_t K, const Stream& s, bool bt = false);

// One AdamW step on n parameters (adamw_step.h): p, m, v updated in place from g.
void adamw_step(float* p, float* m, float* v, const float* g, size_t n, const AdamWScalars& c, bool decay,
                const Stream& s);

// One Gefen step on one tensor of n elements with period P and magnitude block Q (gefen.h;
// gefen_block.h, one thread per Q-block): p, idx [n], mag [n/Q], v [n/P] updated in place from g
// [n]; C the codebook [256]; scratch m [n] and c [n] (floats / codes), st [n/P]. All device pointers.
void gefen_step(float* p, const float* g, uint8_t* idx, float* mag, float* v, size_t n, size_t P, size_t Q,
                const float* C, const GefenScalars& k, float* m, uint32_t* c, float* st, const Stream& s);

// Device memory copy of n bytes (the rounding benchmark's ceiling).
void copy_device(void* dst, const void* src, size_t bytes, const Stream& s);

}  // namespace mantis::gpu
