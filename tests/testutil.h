// testutil — shared helpers for the tests: bit-exact comparison, stratified inputs, boundaries.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/format.h"

namespace mantis::test {

// A raw little-endian array file (tests/reference/*.py writes them) as T values.
template <class T>
std::vector<T> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + " (run tests/reference/torch_reference.py)");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// Scale factor for sample counts (MANTIS_TEST_SCALE, default 1; the sanitizer job uses less).
double scale();
size_t scaled(size_t n);

// Bit-identical, treating every NaN as equal to every NaN (NaN results are canonical anyway).
bool same(double a, double b);
std::string hex(double x);

// n values covering the whole exponent range of `f` and beyond (and some raw random bit
// patterns of the container), reproducible from `seed`. Float values are exact binary32.
std::vector<double> stratified_doubles(const Format& f, size_t n, uint64_t seed);
std::vector<float> stratified_floats(const Format& f, size_t n, uint64_t seed);

// Every boundary of f: ±0, ±inf, NaN, largest finite and its neighbours, the overflow threshold,
// the normal/subnormal boundary, the smallest subnormal and half of it, exact midpoints across
// the range — each also one container ulp above and below. Filtered to those exact in T.
std::vector<double> boundary_doubles(const Format& f);
std::vector<float> boundary_floats(const Format& f);

// Formats used by the differential tests: the named ones plus custom variants (fnuz,
// saturating, no subnormals, tiny and wide exponent ranges).
std::vector<Format> test_formats();

}  // namespace mantis::test
