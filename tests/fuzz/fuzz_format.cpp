// fuzz_format — a format's TOML definition (core/format.h format_from_toml) and, for a short input
// without '/', a format name (format_lookup: named formats, aliases, ps<μ>, e<E>m<M>, p3109_p<P>,
// int<B>, …) and a rounding mode's name. A format that validates is then used: its derived values
// and the rounding of boundary values in every mode, in both containers.
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "core/format.h"
#include "core/round_array.h"
#include "fuzz.h"

using namespace mantis;

namespace {

void use(const Format& f) {
  const double v[] = {max_finite(f), min_finite(f), min_normal(f), min_subnormal(f), unit_roundoff(f)};
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x = {0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e300, -1e-300, inf, -inf, nan, DBL_TRUE_MIN, DBL_MAX};
  for (double d : v) x.insert(x.end(), {d, -d, d * 0.75, d * 1.5, std::nextafter(d, 0.0), d / 2});
  std::vector<double> y(x.size());
  const std::vector<float> xf(x.begin(), x.end());
  std::vector<float> yf(x.size());
  for (int m = 0; m < kRoundingCount; ++m) {
    RoundOptions o;
    o.mode = Rounding(m);
    o.seed = 1;
    fuzz::refused([&] { round_array(x.data(), y.data(), x.size(), f, o); });
    if (fits_float(f)) fuzz::refused([&] { round_array(xf.data(), yf.data(), xf.size(), f, o); });
  }
}

}  // namespace

MANTIS_FUZZ_TARGET(format) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::refused([&] { use(format_from_toml(text, "fuzz.toml")); });
  if (size <= 64 && text.find('/') == std::string::npos) {
    fuzz::refused([&] { use(format_lookup(text)); });
    fuzz::refused([&] { (void)rounding_from_string(text); });
  }
  return 0;
}
