#include "nn/lamp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "nn/attention_row.h"  // defines: lamp_row_tau, lamp_row_select

namespace mantis {

LampRule lamp_rule_from_string(const std::string& s) {
  if (s == "strict") return LampRule::strict;
  if (s == "relaxed") return LampRule::relaxed;
  throw InputError(fmt::format("unknown LAMP rule '{}' (known: strict, relaxed)", s));
}

const char* to_string(LampRule r) { return r == LampRule::strict ? "strict" : "relaxed"; }

double lamp_tau(const LampSpec& s, int64_t row) { return lamp_row_tau(s.tau, s.length_scaled, row); }

size_t lamp_select_row(const LampSpec& s, std::span<const float> y, int64_t row, std::span<uint8_t> mark,
                       uint64_t stream) {
  std::vector<uint32_t> idx(s.random_control ? y.size() : 0);  // [n] the random control's shuffle
  return lamp_row_select(s.rule == LampRule::strict, lamp_tau(s, row), s.random_control, s.seed, y.data(), y.size(),
                         mark.data(), idx.data(), stream);
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
