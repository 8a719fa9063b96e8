// sample — deterministic random test data (the sweeps' and benchmarks' inputs) and the median of
// a sample (of errors, of timings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/format.h"

namespace mantis {

// Deterministic test data from Philox words of (seed, stream): uniform in [0,1) or N(0,1),
// rounded to binary32 (the uniform values are exact multiples of 2^-24).
enum class Distribution { uniform01, normal };
void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);

// Rounding test values for format f, reproducible from seed: n values covering its whole
// exponent range and beyond (1 in 8 a raw random bit pattern of the container); float values are
// exact binary32.
std::vector<double> stratified_doubles(const Format& f, size_t n, uint64_t seed);
std::vector<float> stratified_floats(const Format& f, size_t n, uint64_t seed);
// Every boundary of f: ±0, ±inf, NaN, largest finite and its neighbours, the overflow threshold,
// the normal/subnormal boundary, the smallest subnormal and half of it, exact midpoints across
// the range — each also one container ulp above and below. Filtered to those exact in T.
std::vector<double> boundary_doubles(const Format& f);
std::vector<float> boundary_floats(const Format& f);
// The named formats plus custom variants (fnuz, saturating, no subnormals, unsigned, zero-less,
// tiny and wide exponent ranges): the differential tests' and the GPU contracts' formats.
std::vector<Format> test_formats();

// The median (the mean of the two middle values for an even count); NaN for an empty sample.
double median(std::vector<double> v);

}  // namespace mantis
