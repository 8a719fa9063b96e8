#include "testutil.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <limits>

#include "core/philox.h"

namespace mantis::test {

double scale() {
  const char* s = std::getenv("MANTIS_TEST_SCALE");
  return s ? std::atof(s) : 1.0;
}
size_t scaled(size_t n) { return std::max<size_t>(1000, size_t(double(n) * scale())); }

bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y;
}

std::string hex(double x) { return fmt::format("{:a}", x); }

}  // namespace mantis::test
