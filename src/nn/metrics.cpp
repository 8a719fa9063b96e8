#include "nn/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/format.h"  // defines: InputError

namespace mantis {

namespace {

// log Σ_j e^(x_j − max) and max, in binary64.
template <class T>
std::pair<double, double> log_sum_exp(std::span<const T> x) {
  double mx = -std::numeric_limits<double>::infinity();
  for (T v : x) mx = std::max(mx, double(v));
  double s = 0;
  for (T v : x) s += std::exp(double(v) - mx);
  return {mx, std::log(s)};
}

template <class T>
bool all_finite(std::span<const T> x) {
  return std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
}

template <class T>
double kl_impl(std::span<const T> ref, std::span<const T> test) {
  if (ref.size() != test.size() || ref.empty())
    throw InputError(fmt::format("KL: rows of {} and {} logits", ref.size(), test.size()));
  if (!all_finite(ref) || !all_finite(test)) return std::numeric_limits<double>::infinity();
  const auto [mp, lp] = log_sum_exp(ref);
  const auto [mq, lq] = log_sum_exp(test);
  double kl = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double logp = double(ref[i]) - mp - lp, logq = double(test[i]) - mq - lq;  // log-softmax
    const double p = std::exp(logp);
    if (p > 0) kl += p * (logp - logq);
  }
  return kl;
}

template <class T>
double nll_impl(std::span<const T> x, int32_t target) {
  if (target < 0 || size_t(target) >= x.size())
    throw InputError(fmt::format("target token {} is outside the vocabulary [0, {})", target, x.size()));
  if (!all_finite(x)) return std::numeric_limits<double>::infinity();
  const auto [mx, ls] = log_sum_exp(x);
  return -(double(x[size_t(target)]) - mx - ls);
}

template <class T>
int64_t argmax_impl(std::span<const T> x) {
  return int64_t(std::max_element(x.begin(), x.end()) - x.begin());  // first of the largest
}

template <class T>
using Logits = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
std::span<const T> row(const Logits<T>& m, Eigen::Index t) {
  return {m.data() + t * m.cols(), size_t(m.cols())};
}

template <class T>
void check_shapes(const Logits<T>& ref, const Logits<T>& test) {
  if (ref.rows() != test.rows() || ref.cols() != test.cols() || ref.size() == 0)
    throw InputError(fmt::format("metrics: reference logits [{},{}] and test logits [{},{}] differ in shape (or are empty)",
                                 ref.rows(), ref.cols(), test.rows(), test.cols()));
}

template <class T>
std::vector<double> kl_rows(const Logits<T>& ref, const Logits<T>& test) {
  check_shapes(ref, test);
  std::vector<double> kl(size_t(ref.rows()));  // [T]
  for (Eigen::Index t = 0; t < ref.rows(); ++t) kl[size_t(t)] = kl_impl(row(ref, t), row(test, t));
  return kl;
}

}  // namespace

double kl_divergence(std::span<const float> ref, std::span<const float> test) { return kl_impl(ref, test); }
double kl_divergence(std::span<const double> ref, std::span<const double> test) { return kl_impl(ref, test); }
double nll(std::span<const float> x, int32_t target) { return nll_impl(x, target); }
double nll(std::span<const double> x, int32_t target) { return nll_impl(x, target); }
int64_t argmax(std::span<const float> x) { return argmax_impl(x); }
int64_t argmax(std::span<const double> x) { return argmax_impl(x); }
std::vector<double> kl_per_position(const LogitsF& ref, const LogitsF& test) { return kl_rows(ref, test); }
std::vector<double> kl_per_position(const LogitsD& ref, const LogitsD& test) { return kl_rows(ref, test); }

template <class T>
void MetricsAccumulator::add_impl(const Logits<T>& ref, const Logits<T>& test, std::span<const int32_t> targets) {
  check_shapes(ref, test);
  const Eigen::Index T_ = ref.rows();
  if (!targets.empty() && targets.size() != size_t(T_))
    throw InputError(fmt::format("metrics: {} targets for {} positions", targets.size(), T_));
  // Validate everything before accumulating anything, so a bad call leaves the totals intact.
  for (int32_t y : targets)
    if (y < -1 || y >= ref.cols())
      throw InputError(fmt::format("metrics: target token {} is outside the vocabulary [0, {})", y, ref.cols()));
  for (Eigen::Index t = 0; t < T_; ++t) {
    const auto r = row(ref, t), q = row(test, t);
    const bool finite = all_finite(r) && all_finite(q);
    nonfinite_ += !finite;
    kl_sum_ += kl_impl(r, q);
    flips_ += argmax_impl(r) != argmax_impl(q);
    if (!finite) max_abs_ = std::numeric_limits<double>::infinity();
    for (size_t i = 0; finite && i < r.size(); ++i) max_abs_ = std::max(max_abs_, std::abs(double(r[i]) - double(q[i])));
    if (!targets.empty() && targets[size_t(t)] >= 0) {
      nll_ref_sum_ += nll_impl(r, targets[size_t(t)]);
      nll_test_sum_ += nll_impl(q, targets[size_t(t)]);
      ++targets_;
    }
  }
  positions_ += size_t(T_);
  ++sequences_;
}

void MetricsAccumulator::add(const LogitsF& ref, const LogitsF& test, std::span<const int32_t> targets) {
  add_impl<float>(ref, test, targets);
}
void MetricsAccumulator::add(const LogitsD& ref, const LogitsD& test, std::span<const int32_t> targets) {
  add_impl<double>(ref, test, targets);
}

double MetricsAccumulator::mean_kl() const {
  return positions_ ? kl_sum_ / double(positions_) : std::numeric_limits<double>::quiet_NaN();
}
double MetricsAccumulator::flip_rate() const {
  return positions_ ? double(flips_) / double(positions_) : std::numeric_limits<double>::quiet_NaN();
}
double MetricsAccumulator::ppl_ref() const {
  return targets_ ? std::exp(nll_ref_sum_ / double(targets_)) : std::numeric_limits<double>::quiet_NaN();
}
double MetricsAccumulator::ppl_test() const {
  return targets_ ? std::exp(nll_test_sum_ / double(targets_)) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace mantis
