// adamw_step — one element of AdamW's update (adamw.h), written once for the CPU optimizer and the
// CUDA kernel (MANTIS_HD). Binary32 operations only (×, +, −, ÷, √: correctly rounded on both
// sides, nothing contracted into an FMA: -ffp-contract=off, nvcc --fmad=false), so the two agree
// bit for bit. The step's scalars are computed once on the host in binary64, then rounded to
// binary32 (PyTorch's order).
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "core/hd.h"

namespace mantis {

struct AdamWScalars {
  float b1, b2;        // β1, β2
  float a1, a2;        // 1 − β1, 1 − β2
  float step_size;     // lr / (1 − β1^t)
  float bc2_sqrt;      // √(1 − β2^t)
  float eps;
  float decay;         // 1 − lr·wd
};

// The scalars of step t (t ≥ 1).
inline AdamWScalars adamw_scalars(double beta1, double beta2, double eps, double weight_decay, double lr,
                                  uint64_t t) {
  const double bc1 = 1 - std::pow(beta1, double(t)), bc2 = 1 - std::pow(beta2, double(t));
  return {float(beta1),     float(beta2),           float(1 - beta1), float(1 - beta2),
          float(lr / bc1),  float(std::sqrt(bc2)),  float(eps),       float(1 - lr * weight_decay)};
}

// p, m, v of one parameter after the step with gradient g; decay: weight decay applies.
MANTIS_HD void adamw_element(float& p, float& m, float& v, float g, const AdamWScalars& c, bool decay) {
  if (decay) p *= c.decay;
  m = c.b1 * m + c.a1 * g;
  v = c.b2 * v + c.a2 * g * g;
  const float denom = hd_sqrt(v) / c.bc2_sqrt + c.eps;
  p -= c.step_size * (m / denom);
}

}  // namespace mantis
