// Block-absmax k-bit quantisation (core/quant.h) == a scalar re-statement of its definition.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "core/philox.h"
#include "core/quant.h"

using namespace mantis;

namespace {

// Nearest integer, ties to even, spelled out (v − floor(v) is exact in binary64 for |v| < 2^52).
double nearest_even(double v) {
  const double f = std::floor(v), frac = v - f;
  if (frac > 0.5) return f + 1;
  if (frac < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

// x̃ of element (r, c) of x [rows, cols], computed on its own from quant.h's definition.
template <class T>
T reference(const std::vector<T>& x, size_t cols, size_t r, size_t c, const AbsmaxQuant& q, uint64_t stream) {
  const size_t g = q.block == 0 ? cols : q.block;
  const size_t g0 = c / g * g, g1 = std::min(cols, g0 + g);
  double amax = 0;
  for (size_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(double(x[r * cols + i])));
  const double Q = std::ldexp(1.0, q.bits - 1) - 1;
  const double s = double(T(amax / Q));
  if (s == 0) return T(0);
  const double v = double(x[r * cols + c]) / s;
  const double u = double(random_word(q.seed, stream, r * cols + c)) / 4294967296.0;
  const double k = std::min(Q, std::max(-Q, q.rounding == Rounding::sr ? std::floor(v + u) : nearest_even(v)));
  return T(T(k) * T(s));
}

template <class T>
void check_random(uint64_t seed) {
  for (int trial = 0; trial < 40; ++trial) {
    const uint64_t w = random_word(seed, 100, uint64_t(trial));
    const size_t rows = 1 + w % 7, cols = 1 + (w >> 3) % 97;
    AbsmaxQuant q;
    q.bits = 2 + int((w >> 10) % 15);  // 2..16
    q.block = (w >> 14) % 3 == 0 ? 0 : 1 + (w >> 16) % 33;
    q.rounding = (w >> 22) % 2 ? Rounding::sr : Rounding::rne;
    q.seed = seed + uint64_t(trial);
    const uint64_t stream = (w >> 24) % 5;
    std::vector<T> x(rows * cols);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t a = random_word(seed, 200 + uint64_t(trial), i);
      const double m = double(a >> 8) * 0x1p-24 * 2 - 1;
      x[i] = a % 11 == 0 ? T(0) : T(std::ldexp(m, int(a % 13) - 6));  // zeros, ties, wide range
    }
    if (rows > 1) std::fill(x.begin() + std::ptrdiff_t(cols), x.begin() + std::ptrdiff_t(2 * cols), T(0));
    std::vector<T> out(x.size()), inplace = x;
    quantize_absmax<T>(x.data(), out.data(), rows, cols, q, stream);
    quantize_absmax<T>(inplace.data(), inplace.data(), rows, cols, q, stream);
    size_t bad = 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        const T want = reference(x, cols, r, c, q, stream);
        bad += !(out[r * cols + c] == want && inplace[r * cols + c] == want);
      }
    INFO("trial " << trial << ": " << rows << "x" << cols << " bits " << q.bits << " block " << q.block << " "
                  << to_string(q.rounding));
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("quantize_absmax == the scalar definition on random inputs (float and double)") {
  check_random<float>(1);
  check_random<double>(2);
}

TEST_CASE("quantize_absmax: levels, the group maximum and exact zeros") {
  // One group of 8: the largest magnitude maps to ±Q·s, every output is T(k)·s for an integer
  // |k| ≤ Q, and an all-zero row stays zero.
  const std::vector<float> x = {0.1f, -0.7f, 0.35f, 0.0f, 0.7f, -0.2f, 0.05f, 0.6f,
                                0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> y(x.size());
  const AbsmaxQuant q{.bits = 4, .block = 0};
  quantize_absmax<float>(x.data(), y.data(), 2, 8, q, 0);
  const float s = float(0.7f / 7.0);
  CHECK(y[1] == -7.0f * s);
  CHECK(y[4] == 7.0f * s);
  for (size_t i = 0; i < 8; ++i) {
    const double k = std::round(double(y[i]) / double(s));
    CHECK(y[i] == float(k) * s);
    CHECK(std::fabs(k) <= 7);
  }
  for (size_t i = 8; i < 16; ++i) CHECK(y[i] == 0.0f);
}
