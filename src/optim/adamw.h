// adamw — AdamW (Loshchilov & Hutter; PyTorch 1.13's torch.optim.AdamW, foreach=False), per
// element, in binary32 with the scalars computed in binary64 and then rounded to binary32,
// step t = 1, 2, …:
//   p ← p·(1 − lr·wd)                       (wd only on tensors with ≥ 2 dimensions)
//   m ← β1·m + (1 − β1)·g
//   v ← β2·v + (1 − β2)·g·g
//   p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
// State: m and v, 8 bytes per parameter (+ the step count).
// [optimizer] keys: name = "adamw", beta1, beta2, eps, weight_decay (defaults below).
#pragma once

#include <memory>

#include "optim/optimizer.h"

namespace mantis {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// InputError unless 0 ≤ β < 1, ε > 0, wd ≥ 0.
void validate(const AdamWConfig& c);
std::unique_ptr<Optimizer> make_adamw(const ParamSet& p, const AdamWConfig& c);
// The registry's entry (optimizer.h).
OptimizerEntry adamw_entry();

}  // namespace mantis
