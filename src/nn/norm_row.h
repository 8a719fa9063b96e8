// norm_row — one row of LayerNorm / RMSNorm (norm.h), the element math shared verbatim with the
// CUDA forward (MANTIS_HD): the sums run sequentially in T, in index order, so the bits are the
// same on every machine and on the GPU (one thread per row there).
//   LayerNorm: mean = Σx / C, var = Σ(x − mean)² / C, out = (x − mean)·(1/√(var + ε))·w + b
//   RMSNorm:   ms = Σx² / C, out = (x·(1/√(ms + ε)))·w
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/hd.h"

namespace mantis::detail {

template <class T>
MANTIS_HD T norm_sqrt(T v) {
#if defined(__CUDA_ARCH__)
  return sqrt(v);  // IEEE (--prec-sqrt=true) in both float and double
#else
  return std::sqrt(v);
#endif
}

// x [C] → out [C]; b null: RMSNorm.
template <class T>
MANTIS_HD void norm_row(const T* x, T* out, const T* w, const T* b, T eps, int64_t C) {
  if (b) {
    T mean = 0;
    for (int64_t i = 0; i < C; ++i) mean += x[i];
    mean /= T(C);
    T var = 0;
    for (int64_t i = 0; i < C; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= T(C);
    const T rstd = T(1) / norm_sqrt(var + eps);
    for (int64_t i = 0; i < C; ++i) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
  } else {
    T ms = 0;
    for (int64_t i = 0; i < C; ++i) ms += x[i] * x[i];
    ms /= T(C);
    const T rrms = T(1) / norm_sqrt(ms + eps);
    for (int64_t i = 0; i < C; ++i) out[i] = (x[i] * rrms) * w[i];
  }
}

}  // namespace mantis::detail
