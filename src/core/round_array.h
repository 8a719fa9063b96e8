// round_array — round whole arrays to a Format (CPU; vectorised, OpenMP above a threshold).
//
// Array-in/array-out, in place allowed (in == out). Each element is rounded exactly once from
// its input container (a double rounded to bf16 is rounded directly, never via float).
// Element i of a call uses the random word (seed, stream, index0 + i) (philox.h), so stochastic
// results are identical for any thread count, chunking or device. Random-word indices are 64-bit and
// wrap by definition: index0 + i is taken mod 2^64 (a range that passes 2^64 − 1 goes on at 0), on
// the CPU and the GPU alike; every index0 is valid. The same holds for every index formed from one
// (GEMM steps, scheme elements, quantisers): unsigned 64-bit arithmetic, mod 2^64.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/format.h"
#include "core/round.h"
#include "core/threads.h"

namespace mantis {

struct RoundOptions {
  Rounding mode = Rounding::rne;
  int sr_bits = 32;        // random bits used by sr, 1..32
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t index0 = 0;     // global index of element 0 (for rounding a slice of a larger tensor)
  bool sr_packed = false;  // several roundings per random word (philox.h sr_word): sr_bits ≤ 16
};

// A (format, mode, sr_bits, seed) validated once, with its targets precomputed: what a caller
// that rounds many arrays the same way (the policy layer: once per site and pass) holds, so the
// per-call path does no validation and cannot throw.
struct RoundPlan {
  Rounding mode = Rounding::rne;
  int sr_bits = 32;
  uint64_t seed = 0;
  int sr_pack = 0;           // log2 of the roundings per random word (philox.h sr_word)
  bool fits_float = false;   // the format fits binary32: float output allowed, `tf` set
  Target<float> tf{};        // the float-container target (when fits_float)
  Target<double> td{};       // the double-container target (every validated format)
  // An integer grid (μ = emin = emax with subnormals: spacing 1 throughout; no specials,
  // saturating, +0 only — format.cpp's int<B>, int<B>tc, uint<B>): rne takes a shortcut
  // (round_array.cpp int_chunk) where int_max, the largest magnitude, allows it.
  bool int_grid = false;
  double int_max = 0;
};

// Throws InputError (the messages of validate(f), validate_sr_bits and validate_sr_packed) unless
// f, sr_bits and sr_packed are valid.
RoundPlan plan_round(const Format& f, Rounding mode, int sr_bits = 32, uint64_t seed = 0, bool sr_packed = false);

// Element i uses the random word sr_word(p.seed, stream, index0 + i, p.sr_pack) (philox.h; unpacked:
// random_word). Float output requires
// p.fits_float (the caller checks it when it makes the plan; require_fits_float says why not).
void round_array(const RoundPlan& p, const float* in, float* out, size_t n, uint64_t stream,
                 uint64_t index0 = 0) noexcept;
void round_array(const RoundPlan& p, const double* in, double* out, size_t n, uint64_t stream,
                 uint64_t index0 = 0) noexcept;
void round_array(const RoundPlan& p, const double* in, float* out, size_t n, uint64_t stream,
                 uint64_t index0 = 0) noexcept;
void round_array(const RoundPlan& p, const float* in, double* out, size_t n, uint64_t stream,
                 uint64_t index0 = 0) noexcept;

// Throws InputError if the format does not fit the output container (fits_float) or options are
// invalid: require_fits_float, then plan_round, then the plan's round_array. float → float rounds
// in the float container, everything else in the double one.
void round_array(const float* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const double* in, double* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const double* in, float* out, size_t n, const Format& f, const RoundOptions& o);
void round_array(const float* in, double* out, size_t n, const Format& f, const RoundOptions& o);

// Scalar convenience (double container), same semantics as element `index` of round_array.
double round_scalar(double x, const Format& f, const RoundOptions& o, uint64_t index = 0);

// Below this many elements round_array stays on one thread. Measured (bf16 rne, float, 2 cores):
// 2 threads vs 1 is 0.48× at 8K, 0.95× at 32K, 1.06× at 64K, 1.3× at 256K+ (memory-bound).
constexpr size_t kParallelThreshold = 1 << 16;

inline constexpr int kSrBitsMin = 1, kSrBitsMax = 32;  // random bits sr may use: a 32-bit word's
void validate_sr_bits(int sr_bits);
// Packed random bits (philox.h sr_word): InputError unless sr_bits ≤ 16 and some rounding that uses
// them (`stochastic`: an sr or sre mode) is asked for.
void validate_sr_packed(bool sr_packed, int sr_bits, bool stochastic);
// InputError unless f fits a binary32 container (fits_float), naming the format.
void require_fits_float(const Format& f);

}  // namespace mantis
