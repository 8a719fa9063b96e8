// reduce — sums in one fixed order that the compiler vectorises: the same bits for any thread
// count and machine, without the adder-latency bound of a single sequential sum.
#pragma once

#include <cstddef>

namespace mantis {

// Σ f(i) over i < n in binary64, in 8 interleaved partial sums (term i into sum i mod 8, each in
// order), combined as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
template <class F>
double lane_sum(size_t n, F f) {
  double s[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t k = 0; k < 8; ++k) s[k] += f(i + k);
  for (size_t k = 0; i + k < n; ++k) s[k] += f(i + k);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Σ x[i]² over i < n (binary32 x, exact squares in binary64), in lane_sum's order.
inline double sum_squares(const float* x, size_t n) {
  return lane_sum(n, [x](size_t i) { return double(x[i]) * double(x[i]); });
}

}  // namespace mantis
