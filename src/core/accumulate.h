// accumulate — the k-step semantics of the emulated accumulation (gemm.h) and the random-word
// index of every rounding in it, written once for the CPU GEMM (gemm.cpp, vectorised across j),
// the GPU one (src/cuda/gemm.cu, one thread per output) and the MPFR oracle (oracle.cpp, which
// does the same steps in MPFR but takes its random words from the same indices).
//
// Output o = i·N + j of a GEMM of depth K, accumulator acc (a binary64 value of the accumulator
// format), `round` = rounding to that format in its mode:
//   strict:     acc ← round(strict_value(acc, a_k, b_k))                       word strict_index(o, K, k)
//   unfused:    p ← round(exact_product(a_k, b_k))                             word unfused_product_index(o, K, k)
//               acc ← round(sum_value(acc, p))                                 word unfused_sum_index(o, K, k)
//   blocked:    c ← chunk_step(c, a_k, b_k) over the chunk's k in order (c₀ = 0),
//               acc ← round(sum_value(acc, c))                                 word blocked_index(o, chunk_count(K, kb), chunk)
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/hd.h"
#include "core/round.h"

namespace mantis {

// Random streams of the operand rounding (input format): A[i,k] uses index i·K + k of
// (seed, stream + kStreamA), B[k,j] index k·N + j of (seed, stream + kStreamB).
constexpr uint64_t kStreamA = 1, kStreamB = 2;

MANTIS_HD double exact_product(float a, float b) { return double(a) * double(b); }

// strict: a·b + acc, rounded to odd in binary64 (exact for one more rounding to μ ≤ 50).
MANTIS_HD double strict_value(double acc, float a, float b) {
  return add_round_odd(exact_product(a, b), acc);
}

// unfused and blocked: acc + x (x: the rounded product, or the chunk's binary32 sum), likewise.
MANTIS_HD double sum_value(double acc, double x) { return add_round_odd(acc, x); }

// blocked: one step of the chunk's sum, c + a·b rounded once to binary32 (RNE).
MANTIS_HD float chunk_step(float c, float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

MANTIS_HD size_t chunk_count(size_t K, size_t kb) { return (K + kb - 1) / kb; }

// The random-word index (in (seed, stream)) of each rounding of output o.
MANTIS_HD uint64_t strict_index(uint64_t o, uint64_t K, uint64_t k) { return o * K + k; }
MANTIS_HD uint64_t unfused_product_index(uint64_t o, uint64_t K, uint64_t k) { return 2 * (o * K + k); }
MANTIS_HD uint64_t unfused_sum_index(uint64_t o, uint64_t K, uint64_t k) { return 2 * (o * K + k) + 1; }
MANTIS_HD uint64_t blocked_index(uint64_t o, uint64_t nchunks, uint64_t chunk) { return o * nchunks + chunk; }

}  // namespace mantis
