// oracle — the MPFR reference path: every fast path is tested against it bit for bit.
//
// Rounding uses precision μ+1, mpfr_set_emin(emin − μ + 1) and mpfr_subnormalize for gradual
// underflow, on an exponent range extended above emax so that overflow is resolved afterwards by
// the format's policy (format.h). rne, rz, ru, rd are MPFR's own modes; rna, ro, sr and sre are
// derived exactly from the two neighbours RZ(x) and RA(x) and exact comparisons. MPFR's global
// exponent range is saved and restored around every call. About 100–300 ns per value.
#pragma once

#include <cstddef>
#include <cstdint>

#include <vector>

#include "core/format.h"
#include "core/gemm.h"
#include "core/scheme.h"

namespace mantis {

double oracle_round(double x, const Format& f, Rounding m, uint32_t rnd = 0, int sr_bits = 32);

// The random word of rounding `index` of (seed, stream) when per_word (1, 2 or 4) roundings share
// one (philox.h sr_word, restated): slot s = index mod per_word is the s-th field of 32/per_word
// bits of word ⌊index / per_word⌋, counted from the top, moved to the top.
uint32_t oracle_sr_word(uint64_t seed, uint64_t stream, uint64_t index, int per_word);

// Reference GEMM (small shapes): same semantics and random-word indexing as gemm.h; C0 the addend.
void oracle_gemm(const float* A, const float* B, double* C, size_t M, size_t N, size_t K,
                 const GemmSpec& s, const double* C0 = nullptr);

// Reference of matrix_unit.h's mu_dot, restated from its written definition in MPFR: c + Σ a[k]·b[k·ldb]
// (a, b exact in the unit's input format; c a value of its output format) through the unit.
double oracle_matrix_unit_dot(const MatrixUnit& u, const double* a, const double* b, size_t ldb, size_t K, double c);

// RN(e^x), RN(erf(x)) and RN(tanh(x)) in binary32 (IEEE: gradual underflow, overflow to inf, NaN → quiet NaN):
// MPFR at precision 24 in binary32's exponent range (mpfr_check_range, mpfr_subnormalize). The
// reference of crmath.h's cr_expf / cr_erff / cr_tanhf. Extra: the value at 64 bits (for error measurements).
float oracle_expf(float x);
float oracle_erff(float x);
float oracle_tanhf(float x);
double oracle_exp64(float x);  // e^x rounded to 64 bits (binary64 range: overflow/underflow at its limits)
double oracle_erf64(float x);
double oracle_tanh64(float x);

// Reference of quantize_scheme (scheme.h), from its written definition with MPFR: amax exact, the
// floor rule's exponent exact, quotients to 300 bits rounded to odd and then rounded by the oracle
// (the scale format, the element format with the mode and random word), binary32 operations of
// the reciprocal order at precision 24 in binary32's range, q·S exact, then rounded to nearest in
// binary32 (to_float) or binary64. x: the input values (binary32 ones when to_float).
std::vector<double> oracle_quantize(const Scheme& s, const std::vector<double>& x, int64_t rows, int64_t cols,
                                    bool to_float, Rounding mode, int sr_bits, uint64_t seed, uint64_t stream,
                                    uint64_t index0);

// Whether MPFR was built thread-safe (then the oracle may run on several threads at once).
bool oracle_thread_safe();
// Frees the calling thread's MPFR caches (constants such as log 2 that exp / erf / tanh compute
// once per thread): a worker thread that used the oracle calls it before it ends, or they leak.
void oracle_thread_done();

}  // namespace mantis
