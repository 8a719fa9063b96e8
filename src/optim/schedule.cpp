#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mantis {

double Schedule::at(uint64_t s) const {
  if (s < warmup) return lr * double(s + 1) / double(warmup);
  if (steps <= warmup) return lr;
  const double frac = std::min(1.0, double(s - warmup) / double(steps - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(std::numbers::pi * frac));
}

}  // namespace mantis
