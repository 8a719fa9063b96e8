// sample — deterministic random test data (the sweeps' and benchmarks' inputs) and the median of
// a sample (of errors, of timings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mantis {

// Deterministic test data from Philox words of (seed, stream): uniform in [0,1) or N(0,1),
// rounded to binary32 (the uniform values are exact multiples of 2^-24).
enum class Distribution { uniform01, normal };
void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream);

// The median (the mean of the two middle values for an even count); NaN for an empty sample.
double median(std::vector<double> v);

}  // namespace mantis
