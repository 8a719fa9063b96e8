#include "nn/lamp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/philox.h"

namespace mantis {

LampRule lamp_rule_from_string(const std::string& s) {
  if (s == "strict") return LampRule::strict;
  if (s == "relaxed") return LampRule::relaxed;
  throw InputError(fmt::format("unknown LAMP rule '{}' (known: strict, relaxed)", s));
}

const char* to_string(LampRule r) { return r == LampRule::strict ? "strict" : "relaxed"; }

double lamp_tau(const LampSpec& s, int64_t row) {
  if (!s.length_scaled) return s.tau;
  return std::min(1.0, s.tau * std::sqrt(1024.0 / double(row + 1)));
}

size_t lamp_select_row(const LampSpec& s, std::span<const float> y, int64_t row, std::span<uint8_t> mark,
                       uint64_t stream) {
  const size_t n = y.size();
  const double tau = lamp_tau(s, row);
  size_t count = 0;
  if (s.rule == LampRule::strict) {
    double mx = -INFINITY;
    for (float v : y) mx = std::max(mx, double(v));
    std::vector<double> e(n);
    double sum = 0;
    for (size_t j = 0; j < n; ++j) sum += e[j] = std::exp(double(y[j]) - mx);
    for (size_t j = 0; j < n; ++j) {
      const double z = e[j] / sum;
      mark[j] = tau <= 0 || 2 * z * (1 - z) * std::abs(double(y[j])) > tau;
      count += mark[j];
    }
  } else {
    // log|y_j| + (y_j − max y): both sides scaled by e^(−max y), so that log τ is not absorbed
    // when |y| is huge (3e38 + log τ == 3e38 in binary64); log 0 = −inf (never above a finite
    // bound)
    double my = -INFINITY;
    for (float v : y) my = std::max(my, double(v));
    std::vector<double> a(n);
    double mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) mx = std::max(mx, a[j] = std::log(std::abs(double(y[j]))) + (double(y[j]) - my));
    const double bound = std::log(tau) + mx;  // τ = 0: −inf
    for (size_t j = 0; j < n; ++j) {
      mark[j] = tau <= 0 || a[j] > bound;
      count += mark[j];
    }
  }
  if (s.random_control && count > 0 && count < n) {
    // the same count, uniformly among the n causal positions: partial Fisher–Yates
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0u);
    for (size_t k = 0; k < count; ++k) {
      const uint64_t w = random_word64(s.seed, stream, k);
      const size_t pick = k + size_t(w % uint64_t(n - k));  // bias ≤ n/2^64
      std::swap(idx[k], idx[pick]);
    }
    std::fill(mark.begin(), mark.begin() + std::ptrdiff_t(n), uint8_t(0));
    for (size_t k = 0; k < count; ++k) mark[idx[k]] = 1;
  }
  return count;
}

size_t lamp_select_activation(std::span<const double> y, std::span<const double> dsigma, double tau,
                              std::span<uint8_t> mark) {
  size_t count = 0;
  for (size_t j = 0; j < y.size(); ++j) {
    mark[j] = tau <= 0 || std::abs(dsigma[j]) * std::abs(y[j]) > tau;
    count += mark[j];
  }
  return count;
}

size_t lamp_select_layernorm(std::span<const double> y, std::span<const double> gamma, double eps, double tau,
                             std::span<uint8_t> mark) {
  const size_t n = y.size();
  double mean = 0, var = 0;
  for (double v : y) mean += v;
  mean /= double(n);
  for (double v : y) var += (v - mean) * (v - mean);
  const double sigma = std::sqrt(var / double(n) + eps);
  std::vector<double> k(n);
  for (size_t j = 0; j < n; ++j) k[j] = std::abs(y[j]) * std::abs(gamma[j]) / sigma;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return k[a] > k[b]; });
  // rest[m] = Σ κ over order[m..n−1] (summed from the smallest): select the shortest prefix
  // order[0..m−1] with rest[m] ≤ τ
  std::vector<double> rest_from(n + 1, 0.0);
  for (size_t m = n; m-- > 0;) rest_from[m] = rest_from[m + 1] + k[order[m]];
  std::fill(mark.begin(), mark.begin() + std::ptrdiff_t(n), uint8_t(0));
  size_t count = 0;
  while (count < n && rest_from[count] > tau) mark[order[count++]] = 1;
  return count;
}

}  // namespace mantis
