// site — a GEMM site of the forward pass (nn/linear.h site_gemm) on device arrays. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/device.h"
#include "nn/policy.h"
#include "nn/site_health.h"

namespace mantis::gpu {

// out [M,N] = round_output((A [M,K] · B) / divisor + bias), B [K,N] or, when bt, [N,K]; bias: N
// values or null; every pointer on the device. The order, roundings, random streams and health
// counts (into *health, in device memory, when given) of site_gemm (linear.h): operand roundings
// (input: A's (i, k) index i·K + k of stream + 1, B's (k, j) in [K,N] orientation index k·N + j
// of stream + 2; input_a / input_b likewise), the emulated GEMM (gpu::gemm: the CPU's bits) or cuBLAS SGEMM (native: within
// a tolerance of the CPU's Eigen product), its binary64 result rounded to binary32, ÷ divisor,
// + bias, output rounding ((i, j): index i·N + j of stream + 3).
void site_gemm(const SitePlan& p, const float* A, const float* B, bool bt, float* out, size_t M, size_t N, size_t K,
               uint64_t stream, float divisor = 1.0f, const float* bias = nullptr, const Stream& s = Stream(),
               SiteHealth* health = nullptr);

}  // namespace mantis::gpu
