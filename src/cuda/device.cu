// device — see device.h: memory, streams, and the element-wise operations (rounding: round_array.cu).
#include <cublas_v2.h>

#include "common.cuh"
#include "cuda/device.h"
#include "optim/adamw_step.h"
#include "optim/gefen_block.h"

namespace mantis::gpu {

using cuda_detail::blocks_for;
using cuda_detail::kThreads;
using cuda_detail::native;

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  MANTIS_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}
void copy_to_device(void* dst, const void* src, size_t bytes) {
  MANTIS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  MANTIS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

Stream Stream::create() {
  Stream s;
  cudaStream_t cs;
  // A blocking stream: it is ordered with the legacy default stream, on which Array's synchronous
  // copies run, both ways (a non-blocking one would race them).
  MANTIS_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamDefault));
  s.s_ = cs;
  return s;
}
Stream::~Stream() {
  if (s_) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}
void Stream::synchronize() const { MANTIS_CUDA_CHECK(cudaStreamSynchronize(native(*this))); }

void round(float* x, size_t n, const RoundPlan& p, uint64_t stream, uint64_t index0, const Stream& s) {
  cuda_detail::round_device(x, n, p.tf, p.mode, p.seed, stream, index0, p.sr_pack, native(s));
}
void round(double* x, size_t n, const RoundPlan& p, uint64_t stream, uint64_t index0, const Stream& s) {
  cuda_detail::round_device(x, n, p.td, p.mode, p.seed, stream, index0, p.sr_pack, native(s));
}

namespace {

__global__ void adamw_kernel(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                             const float* __restrict__ g, size_t n, AdamWScalars c, bool decay) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    adamw_element(p[i], m[i], v[i], g[i], c, decay);
}

}  // namespace

void adamw_step(float* p, float* m, float* v, const float* g, size_t n, const AdamWScalars& c, bool decay,
                const Stream& s) {
  if (n == 0) return;
  cuda_detail::launch("adamw_kernel", adamw_kernel, blocks_for(n), kThreads, 0, native(s), p, m, v, g, n, c, decay);
  MANTIS_CUDA_CHECK_LAUNCH();
}

namespace {

// gefen_nearest for each element: the reference rule, which the CPU's NearestCode table equals.
struct NearestCodes {
  const float* C;
  MANTIS_HD void operator()(const float* x, size_t n, uint32_t* out) const {
    for (size_t e = 0; e < n; ++e) out[e] = gefen_nearest(C, 256, x[e]);
  }
};

__global__ void gefen_kernel(float* p, const float* g, uint8_t* idx, float* mag, float* v, size_t nq, size_t P,
                             size_t Q, const float* C, GefenScalars k, float* m, uint32_t* c, float* st) {
  const size_t stride = size_t(gridDim.x) * blockDim.x, nv = Q / P;
  for (size_t q = size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < nq; q += stride)
    gefen_update_block(q, P, Q, p, g, idx, mag, v, C, k, m + q * Q, c + q * Q, st + q * nv, NearestCodes{C});
}

}  // namespace

void gefen_step(float* p, const float* g, uint8_t* idx, float* mag, float* v, size_t n, size_t P, size_t Q,
                const float* C, const GefenScalars& k, float* m, uint32_t* c, float* st, const Stream& s) {
  if (n == 0) return;
  if (P == 0 || Q == 0 || n % Q != 0 || Q % P != 0 || (P != 1 && P != Q))
    throw std::invalid_argument("gefen_step: P must be 1 or Q, and Q must divide n");
  cuda_detail::launch("gefen_kernel", gefen_kernel, blocks_for(n / Q), kThreads, 0, native(s), p, g, idx, mag, v, n / Q, P, Q, C, k, m, c, st);
  MANTIS_CUDA_CHECK_LAUNCH();
}

namespace {
// One cuBLAS handle per process and device thread (created on first use; cuBLAS handles are not
// thread-safe to share, so each host thread gets its own).
cublasHandle_t blas() {
  thread_local cublasHandle_t h = [] {
    cublasHandle_t x;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    if (cublasSetMathMode(x, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)  // binary32 throughout, no TF32
      throw std::runtime_error("cublasSetMathMode failed");
    return x;
  }();
  return h;
}
}  // namespace

void sgemm(const float* A, const float* B, float* C, size_t M, size_t N, size_t K, const Stream& s, bool bt) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // the empty sum (cuBLAS rejects a leading dimension of 0)
    MANTIS_CUDA_CHECK(cudaMemsetAsync(C, 0, M * N * sizeof(float), native(s)));
    return;
  }
  cublasHandle_t h = blas();
  if (cublasSetStream(h, native(s)) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasSetStream failed");
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: cuBLAS sees A as [K,M] and B as [N,K] (or, when
  // bt, as [K,N], used transposed).
  const cublasStatus_t st = cublasSgemm(h, bt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one,
                                        B, bt ? int(K) : int(N), A, int(K), &zero, C, int(N));
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasSgemm failed: status " + std::to_string(int(st)));
}

void copy_device(void* dst, const void* src, size_t bytes, const Stream& s) {
  MANTIS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, native(s)));
}

}  // namespace mantis::gpu
