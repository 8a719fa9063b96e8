// fuzz_scheme — a scaled format's TOML definition (core/scheme.h scheme_from_toml) and, for a short
// input without '/', a scheme name (scheme_lookup). A scheme that validates then quantises a small
// matrix of mixed magnitudes (zeros, a NaN block, tiny and huge values) in rne and sr, float and
// double.
#include <cmath>
#include <limits>
#include <vector>

#include "core/scheme.h"
#include "fuzz.h"

using namespace mantis;

namespace {

template <class T>
void quantize(const Scheme& s, Rounding mode) {
  constexpr int64_t rows = 4, cols = 48;
  std::vector<T> x(size_t(rows * cols));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = T(std::ldexp(double(int(i % 7) - 3), int(i % 23) * 6 - 66));  // 2^-66 … 2^66, signs, zeros
  x[5] = std::numeric_limits<T>::max(), x[6] = -std::numeric_limits<T>::denorm_min();
  x[size_t(3 * cols)] = std::numeric_limits<T>::quiet_NaN();
  for (size_t i = size_t(2 * cols); i < size_t(3 * cols); ++i) x[i] = 0;
  std::vector<T> y(x.size());
  std::vector<double> scales, zero_points;
  fuzz::refused([&] {
    validate_quantize(s, mode, 16);
    quantize_scheme<T>(s, x.data(), y.data(), rows, cols, mode, 16, 1, 2, 3, &scales, &zero_points);
  });
}

void use(const Scheme& s) {
  for (Rounding m : {Rounding::rne, Rounding::sr}) quantize<float>(s, m), quantize<double>(s, m);
}

}  // namespace

MANTIS_FUZZ_TARGET(scheme) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::refused([&] { use(scheme_from_toml(text, "fuzz.toml")); });
  if (size <= 64 && text.find('/') == std::string::npos) fuzz::refused([&] { use(scheme_lookup(text)); });
  return 0;
}
