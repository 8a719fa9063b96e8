// quant_block — the arithmetic of one group of block-absmax k-bit quantisation (quant.h), written
// once for the CPU (quant.cpp: quantize_absmax) and the GPU (src/cuda/scheme.cu), MANTIS_HD.
// Per group of a row: amax = absmax_step(amax, x) over its elements from T(0) (any order: a NaN
// is ignored, so the maximum is exact), s = absmax_scale(amax, Q), then each element
// absmax_element(x, s, Q, sr, word) with word = random_word(seed, stream, row·cols + col) under sr.
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/bits.h"
#include "core/hd.h"

namespace mantis {

// Q = 2^(k−1) − 1, the largest level of k bits.
MANTIS_HD double absmax_levels(int bits) { return double((1 << (bits - 1)) - 1); }

// std::max(amax, |x|): a NaN x leaves amax.
template <class T>
MANTIS_HD T absmax_step(T amax, T x) {
  const T a = x < T(0) ? -x : x;  // |x| (a −0 stays, but never beats amax ≥ +0)
  return amax < a ? a : amax;
}

// The stored scale s = T(amax / Q).
template <class T>
MANTIS_HD T absmax_scale(T amax, double Q) {
  return T(double(amax) / Q);
}

// x̃ = T(clamp(round(x / s), −Q, Q)) · s; s = 0: 0. sr: floor(x/s + w·2^−32); otherwise nearest, ties
// to even.
template <class T>
MANTIS_HD T absmax_element(T x, T s, double Q, bool sr, uint32_t word) {
  if (s == T(0)) return T(0);
  const double v = double(x) / double(s);
#if defined(__CUDA_ARCH__)
  double k = sr ? ::floor(v + double(word) * 0x1p-32) : ::nearbyint(v);
#else
  double k = sr ? std::floor(v + double(word) * 0x1p-32) : std::nearbyint(v);
#endif
  k = k < -Q ? -Q : (Q < k ? Q : k);  // std::clamp (a NaN passes through)
  return T(k) * s;
}

}  // namespace mantis
