// bootstrap — percentile intervals over independent windows, reproducible.
//
// The study's unit of independence is a window of text: metrics are sums over windows. A
// resample draws n windows with replacement; window k of resample b is Philox word
// (seed, stream = b, index = k) mod n (bias ≤ n/2^32). Every statistic of one Bootstrap uses
// the same resamples, so intervals of paired quantities (a KL ratio of two cells evaluated on the
// same windows) resample the windows jointly. The interval is the percentile one: the 2.5 % and
// 97.5 % order statistics (linear interpolation between the two nearest) of B resampled values.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mantis {

struct Interval {
  double lo = 0, hi = 0;
};

class Bootstrap {
 public:
  // n windows (≥ 1), B resamples (≥ 100).
  explicit Bootstrap(size_t n, int resamples = 2000, uint64_t seed = 0);
  size_t windows() const { return n_; }
  // 95 % interval of Σ_w num[w] / Σ_w den[w] (the point estimate is the same ratio over all
  // windows). num, den: one value per window. A resample whose denominator is 0 gives +inf
  // (0/0: NaN, ordered last); infinite inputs propagate (an inf in num makes hi = inf).
  Interval ratio(std::span<const double> num, std::span<const double> den) const;

 private:
  size_t n_;
  std::vector<uint32_t> draws_;  // [B, n] resampled window indices
};

}  // namespace mantis
