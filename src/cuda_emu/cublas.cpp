// cuda-emu's cuBLAS (include/cublas_v2.h): SGEMM by Eigen's float GEMM, queued in stream order.
#include <cublas_v2.h>

#include <Eigen/Core>

#include "cuda_emu/emu.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int ar = ta == CUBLAS_OP_N ? m : k, br = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ar) || ldb < std::max(1, br) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float a = *alpha, b = *beta;  // host scalars, read at the call (cuBLAS's host pointer mode)
  // Through the queue, in stream order, as a kernel: a plain host function, not emulated threads.
  return cuda_emu::enqueue_host("cublasSgemm", [=] {
    using Map = Eigen::Map<const Eigen::MatrixXf, 0, Eigen::OuterStride<>>;
    const Map Am(A, ar, ta == CUBLAS_OP_N ? k : m, Eigen::OuterStride<>(lda));
    const Map Bm(B, br, tb == CUBLAS_OP_N ? n : k, Eigen::OuterStride<>(ldb));
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> Cm(C, m, n, Eigen::OuterStride<>(ldc));
    Eigen::MatrixXf P(m, n);
    if (ta == CUBLAS_OP_N && tb == CUBLAS_OP_N) P.noalias() = Am * Bm;
    else if (ta == CUBLAS_OP_N) P.noalias() = Am * Bm.transpose();
    else if (tb == CUBLAS_OP_N) P.noalias() = Am.transpose() * Bm;
    else P.noalias() = Am.transpose() * Bm.transpose();
    if (b == 0.0f) Cm = a * P;  // beta = 0: C is not read (it may hold NaN), as cuBLAS
    else Cm = a * P + b * Cm;
  }) == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
