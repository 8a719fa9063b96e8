// schedule — the learning rate of each step (llm.c's): linear warm-up lr·(s+1)/warmup for
// s < warmup, then cosine decay from lr to min_lr over the remaining steps:
//   min_lr + ½(lr − min_lr)(1 + cos(π·(s − warmup)/(steps − warmup))), min_lr from step `steps` on.
#pragma once

#include <cstdint>

namespace mantis {

struct Schedule {
  double lr = 1e-3, min_lr = 1e-4;
  uint64_t warmup = 0, steps = 1;
  double at(uint64_t step) const;  // step 0-based
};

}  // namespace mantis
