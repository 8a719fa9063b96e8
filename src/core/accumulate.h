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
//   promoted:   per chunk of kb: p ← round(strict_value(p, a_k, b_k)) over its k (p₀ = 0)   word strict_index(o, K, k)
//               then f ← promote_step(f, p), the binary32 accumulator (f₀ = 0; the output is f)
//   tensor_core: per block of kb products, s ← tc_block_sum(acc, the block's a_k·b_k, F),
//               acc ← round(s)                                                 word blocked_index(o, chunk_count(K, kb), chunk)
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/hd.h"
#include "core/round.h"

namespace mantis {

enum class Accumulation : uint8_t { strict, unfused, blocked, promoted, tensor_core };

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
MANTIS_HD float chunk_step(float c, float a, float b) { return hd_fma(a, b, c); }

MANTIS_HD size_t chunk_count(size_t K, size_t kb) { return (K + kb - 1) / kb; }

// promoted: f + p rounded to nearest binary32 (DeepSeek-V3's promotion of a chunk's limited-
// precision sum into an FP32 accumulator), from the exact sum's round-to-odd value.
MANTIS_HD double promote_step(double f, double p) { return double(float(sum_value(f, p))); }

// ⌊log2 |t|⌋ of a finite nonzero t.
MANTIS_HD int floor_log2(double t) {
  int e;
#if defined(__CUDA_ARCH__)
  frexp(t, &e);
#else
  std::frexp(t, &e);
#endif
  return e - 1;
}

// t truncated toward zero to a multiple of 2^g (exact: the quotient's integer part, scaled back).
MANTIS_HD double truncate_to(double t, int g) {
#if defined(__CUDA_ARCH__)
  return ldexp(trunc(ldexp(t, -g)), g);
#else
  return std::ldexp(std::trunc(std::ldexp(t, -g)), g);
#endif
}

// tensor_core (the block-FMA model of Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of
// NVIDIA tensor cores", 2021): the n exact products a[k]·b[k·ldb] and the accumulator value acc
// are each truncated toward zero to a multiple of 2^(e_max − F), e_max the largest ⌊log2|t|⌋
// among the nonzero terms, and summed exactly (in binary64: gemm.h validates F and the block so
// that the sum fits 53 bits). All terms zero: +0. A non-finite term (an inf or NaN operand, an
// accumulator that overflowed to inf): the plain binary64 sum, which is then ±inf or NaN.
MANTIS_HD double tc_block_sum(double acc, const float* a, const float* b, size_t ldb, size_t n, int F) {
  double plain = acc;
  for (size_t k = 0; k < n; ++k) plain += exact_product(a[k], b[k * ldb]);
  if (!(plain - plain == 0)) return plain;  // not finite (no finite terms sum past binary64's range)
  int emax = acc != 0 ? floor_log2(acc) : -100000;
  for (size_t k = 0; k < n; ++k) {
    const double t = exact_product(a[k], b[k * ldb]);
    if (t != 0) {
      const int e = floor_log2(t);
      emax = e > emax ? e : emax;
    }
  }
  if (emax == -100000) return 0.0;
  const int g = emax - F;
  double s = 0.0;  // from +0, as an exact sum (truncated −0 terms leave it +0)
  s += truncate_to(acc, g);
  for (size_t k = 0; k < n; ++k) s += truncate_to(exact_product(a[k], b[k * ldb]), g);
  return s;
}

// The random-word index (in (seed, stream)) of each rounding of output o.
MANTIS_HD uint64_t strict_index(uint64_t o, uint64_t K, uint64_t k) { return o * K + k; }
MANTIS_HD uint64_t unfused_product_index(uint64_t o, uint64_t K, uint64_t k) { return 2 * (o * K + k); }
MANTIS_HD uint64_t unfused_sum_index(uint64_t o, uint64_t K, uint64_t k) { return 2 * (o * K + k) + 1; }
MANTIS_HD uint64_t blocked_index(uint64_t o, uint64_t nchunks, uint64_t chunk) { return o * nchunks + chunk; }

// The rounding words of (seed, stream) read at increasing indices, 2^pack per random word
// (philox.h sr_word), one Philox block per 4·2^pack (an output's indices are consecutive, so each
// block is generated once). kOn = false: zeros, and no state (the GPU kernels keep many of these
// in registers).
template <bool kOn>
struct WordCache {
  WordCache() = default;
  MANTIS_HD WordCache(uint64_t, uint64_t, int = 0) {}
  MANTIS_HD uint32_t at(uint64_t) { return 0u; }
};
template <>
struct WordCache<true> {
  uint64_t seed = 0, stream = 0;
  uint64_t block = ~uint64_t(0);  // the block held in blk; ~0: none yet (idx >> 2 < 2^62)
  Philox4 blk{};
  int pack = 0;
  WordCache() = default;
  MANTIS_HD WordCache(uint64_t seed_, uint64_t stream_, int pack_ = 0) : seed(seed_), stream(stream_), pack(pack_) {}
  MANTIS_HD uint32_t at(uint64_t idx) {
    const uint64_t w = idx >> pack;
    if ((w >> 2) != block) blk = random_block(seed, stream, block = w >> 2);
    return blk.v[w & 3] << ((uint32_t(idx) & ((1u << pack) - 1)) << (5 - pack));
  }
};

// One output's accumulation, fed its products in k order, one at a time, so that a tiled kernel
// can stop at any tile edge and resume (the GPU's shared-memory tiles; tests drive it on the CPU
// tile by tile against gemm()). Every accumulation but tensor_core (which needs a whole block of
// products at once: tc_block_sum). value() is the output after k = K − 1.
template <Rounding M, Accumulation kAcc>
struct OutputAccumulator {
  double acc = 0.0;  // the accumulator (promoted: the binary32 accumulator f)
  double p = 0.0;    // promoted: the chunk's sum in the accumulator format
  float c = 0.0f;    // blocked: the chunk's binary32 sum
  WordCache<is_stochastic(M)> words;

  OutputAccumulator() = default;
  MANTIS_HD OutputAccumulator(uint64_t seed, uint64_t stream, int pack = 0) : words(seed, stream, pack) {}

  // Step k of output o (depth K, chunk size kb, nchunks = chunk_count(K, kb)).
  MANTIS_HD void step(float a, float b, const Target<double>& t, uint64_t o, uint64_t K, uint64_t k, uint64_t kb,
                      uint64_t nchunks) {
    if constexpr (kAcc == Accumulation::strict) {
      acc = round_value<M>(strict_value(acc, a, b), t, words.at(strict_index(o, K, k)));
    } else if constexpr (kAcc == Accumulation::unfused) {
      const double q = round_value<M>(exact_product(a, b), t, words.at(unfused_product_index(o, K, k)));
      acc = round_value<M>(sum_value(acc, q), t, words.at(unfused_sum_index(o, K, k)));
    } else if constexpr (kAcc == Accumulation::blocked) {
      c = chunk_step(c, a, b);
      if ((k + 1) % kb == 0 || k + 1 == K) {
        acc = round_value<M>(sum_value(acc, double(c)), t, words.at(blocked_index(o, nchunks, k / kb)));
        c = 0.0f;
      }
    } else if constexpr (kAcc == Accumulation::promoted) {
      p = round_value<M>(strict_value(p, a, b), t, words.at(strict_index(o, K, k)));
      if ((k + 1) % kb == 0 || k + 1 == K) {
        acc = promote_step(acc, p);
        p = 0.0;
      }
    } else {
      static_assert(kAcc != Accumulation::tensor_core, "tensor_core takes whole blocks: tc_block_sum");
    }
  }
  MANTIS_HD double value() const { return acc; }
};

}  // namespace mantis
