// cublas_v2.h of cuda-emu: the part of cuBLAS that src/cuda uses (SGEMM), computed by Eigen's float
// GEMM as a stand-in (its summation order is neither cuBLAS's nor the CPU path's: the contracts
// against it keep their tolerance).
#pragma once

#include "cuda_runtime.h"

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2 };

cublasStatus_t cublasCreate(cublasHandle_t* h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
// Column-major C [m,n] = alpha · op(A) [m,k] · op(B) [k,n] + beta · C, as cuBLAS.
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
