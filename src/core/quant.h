// quant — symmetric block-absmax quantisation to k bits (saved activations; later 8-bit states).
//
// x [rows, cols] row-major is cut along each row into groups of `block` consecutive elements
// (0: the whole row; a row's last group may be shorter). Per group, in the container T:
//   s = T(absmax / Q), Q = 2^(k−1) − 1          the stored scale
//   q = clamp(round(x / s), −Q, Q), x̃ = T(q)·s   (an all-zero group, s = 0, stays 0)
// round: rne = nearest, ties to even (nearbyint); sr = floor(x/s + u), u = w·2^-32 with
// w = random_word(seed, stream, row·cols + col) (philox.h), so results do not depend on threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/format.h"

namespace mantis {

struct AbsmaxQuant {
  int bits = 8;                       // k, 2..24 (Q must be exact in binary32)
  size_t block = 0;                   // elements per scale within a row; 0: one scale per row
  Rounding rounding = Rounding::rne;  // rne or sr (any other mode rounds as rne)
  uint64_t seed = 0;                  // sr's random words
};

// out may alias x. The caller validates q (nn/backward.h: SavedQuant), so this cannot throw.
template <class T>
void quantize_absmax(const T* x, T* out, size_t rows, size_t cols, const AbsmaxQuant& q,
                     uint64_t stream) noexcept;

extern template void quantize_absmax<float>(const float*, float*, size_t, size_t, const AbsmaxQuant&,
                                            uint64_t) noexcept;
extern template void quantize_absmax<double>(const double*, double*, size_t, size_t, const AbsmaxQuant&,
                                             uint64_t) noexcept;

}  // namespace mantis
