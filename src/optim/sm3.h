// sm3 — SM3-II (Anil, Gupta, Koren & Singer 2019) as google-research's sm3/sm3.py SM3Optimizer
// (dense path): accumulators only — one per row and one per column of a matrix, a full one for a
// vector — sums of squares, not moving averages.
//
// One step, per tensor, in binary32 (scalars in binary64, rounded to binary32 once):
//   matrix [R, C]:  ν_ij = min(ar_i, ac_j) + g_ij·g_ij
//                   then ar_i = max_j ν_ij, ac_j = max_i ν_ij      (after ν is formed from the old ones)
//   vector [n]:     acc = acc + g·g,  ν = acc
//   x    = g·(1/√(ν + f32(1e-30)))          (sm3.py's rsqrt(accumulator + 1e-30); TF's CPU rsqrt is
//                                           Eigen's approximation refined by Newton, here 1/√ in
//                                           binary32 — a last-bit difference; 0/0 cannot arise)
//   momentum μ > 0 (a full buffer m):  x = (1 − f32(μ))·x,  m = m + (m·(f32(μ) − 1) + x),  x = m
//                                       (sm3.py's assign_add form, binary32)
//   p    = p·f32(1 − lr·wd)                 (decoupled, decays() tensors, only when wd > 0; sm3.py
//                                           has no weight decay)
//   p    = p − f32(lr)·x
// Optax differs: optax.sm3(lr, momentum = 0.9) defaults to momentum 0.9 and always allocates a
// full-size buffer nu (≈ 4 bytes per parameter even with momentum 0), keeps an EMA of the update
// nu = (1 − b1)·x + b1·nu rather than sm3.py's form, uses eps = 1e-8 inside rsqrt(ν + eps) with
// x = 0 where ν = 0, and also accepts b2 < 1 (decayed sums); its 1-D accumulator is the same.
// Our tensors are ≤ 2-D (more is an InputError); a 0-D one is a vector of 1.
// State: <param>.acc_row f32 [R], <param>.acc_col f32 [C] for matrices; <param>.acc f32 [n] for
// vectors; <param>.m f32 [param shape] only with momentum; + the step count.
// [optimizer] keys: name = "sm3", momentum (0 = none, the "accumulators only" default),
// weight_decay (0).
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct SM3Config {
  double momentum = 0.0, weight_decay = 0.0;
};

// InputError unless 0 ≤ momentum < 1 and wd ≥ 0.
void validate(const SM3Config& c);
std::unique_ptr<Optimizer> make_sm3(const ParamSet& p, const SM3Config& c);
OptimizerEntry sm3_entry();

}  // namespace mantis
