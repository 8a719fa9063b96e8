// round_array — round whole arrays to a Format (CPU; vectorised, OpenMP above a threshold).
//
// Array-in/array-out, in place allowed (in == out). Each element is rounded exactly once from
// its input container (a double rounded to bf16 is rounded directly, never via float).
// Element i of a call uses the random word (seed, stream, index0 + i) (philox.h), so stochastic
// results are identical for any thread count, chunking or device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/format.h"
#include "core/threads.h"

namespace mantis {

struct RoundOptions {
  Rounding mode = Rounding::rne;
  int sr_bits = 32;        // random bits used by sr, 1..32
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t index0 = 0;     // global index of element 0 (for rounding a slice of a larger tensor)
};

// Throws InputError if the format does not fit the output container (fits_float) or options are
// invalid. float → float rounds in the float container, everything else in the double one.
void round_array(const float* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const double* in, double* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const double* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const float* in, double* out, size_t n, const Format& f, const RoundOptions& o);

// Scalar convenience (double container), same semantics as element `index` of round_array.
double round_scalar(double x, const Format& f, const RoundOptions& o, uint64_t index = 0);

// Below this many elements round_array stays on one thread. Measured (bf16 rne, float, 2 cores):
// 2 threads vs 1 is 0.48× at 8K, 0.95× at 32K, 1.06× at 64K, 1.3× at 256K+ (memory-bound).
constexpr size_t kParallelThreshold = 1 << 16;

void validate_sr_bits(int sr_bits);

}  // namespace mantis
