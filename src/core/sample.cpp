#include "core/sample.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/philox.h"

namespace mantis {

namespace {
// u in [0,1): top 24 bits of the word, an exact binary32 value.
inline double unit(uint32_t w) { return double(w >> 8) * 0x1p-24; }

template <class T>
void fill_impl(T* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  if (d == Distribution::uniform01) {
    for (size_t i = 0; i < n; ++i) x[i] = T(float(unit(random_word(seed, stream, i))));
    return;
  }
  // Box–Muller on words 2i, 2i+1: u1 in (0,1], u2 in [0,1).
  for (size_t i = 0; i < n; ++i) {
    const double u1 = double((random_word(seed, stream, 2 * i) >> 8) + 1) * 0x1p-24;
    const double u2 = unit(random_word(seed, stream, 2 * i + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    x[i] = T(float(z));
  }
}
}  // namespace

void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + m, v.end());
  if (v.size() % 2) return v[m];
  const double hi = v[m];
  const double lo = *std::max_element(v.begin(), v.begin() + m);
  return lo + (hi - lo) / 2;
}

}  // namespace mantis
