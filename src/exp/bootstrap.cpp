#include "exp/bootstrap.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/format.h"  // defines: InputError
#include "core/philox.h"

namespace mantis {

Bootstrap::Bootstrap(size_t n, int resamples, uint64_t seed) : n_(n) {
  if (n == 0 || n > UINT32_MAX || resamples < 100)
    throw InputError(fmt::format("bootstrap: {} windows and {} resamples (need ≥ 1 and ≥ 100)", n, resamples));
  draws_.resize(size_t(resamples) * n);
  for (size_t b = 0; b < size_t(resamples); ++b)
    for (size_t k = 0; k < n; ++k) draws_[b * n + k] = uint32_t(random_word(seed, b, k) % uint64_t(n));
}

namespace {
// Percentile of sorted values (NaN sorted last), interpolating linearly.
double percentile(const std::vector<double>& v, double q) {
  const double pos = q * double(v.size() - 1);
  const size_t i = size_t(pos);
  const double f = pos - double(i);
  if (i + 1 >= v.size() || f == 0) return v[i];
  if (std::isinf(v[i]) || std::isinf(v[i + 1])) return f < 0.5 ? v[i] : v[i + 1];
  return v[i] + f * (v[i + 1] - v[i]);
}
}  // namespace

Interval Bootstrap::ratio(std::span<const double> num, std::span<const double> den) const {
  if (num.size() != n_ || den.size() != n_)
    throw InputError(fmt::format("bootstrap: {} and {} values for {} windows", num.size(), den.size(), n_));
  const size_t B = draws_.size() / n_;
  std::vector<double> stat(B);
  for (size_t b = 0; b < B; ++b) {
    double sn = 0, sd = 0;
    for (size_t k = 0; k < n_; ++k) sn += num[draws_[b * n_ + k]], sd += den[draws_[b * n_ + k]];
    stat[b] = sd == 0 && sn != 0 ? std::numeric_limits<double>::infinity() : sn / sd;
  }
  std::sort(stat.begin(), stat.end(), [](double a, double b) { return std::isnan(b) ? !std::isnan(a) : a < b; });
  return {percentile(stat, 0.025), percentile(stat, 0.975)};
}

}  // namespace mantis
