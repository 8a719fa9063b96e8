// crmath — the array kernels of crmath.h: an AVX-512 one (8 binary64 lanes, the tables in
// registers through vpermt2pd), chosen at run time, and the portable loop over the scalar
// definitions. The AVX-512 kernel performs the scalar code's operations in its order (mul, add,
// fma, the same constants), so its values are the scalar's bit for bit; lanes flagged near a
// rounding boundary are finished by the scalar function (the exception lookup).
#include "core/crmath.h"

#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MANTIS_X86 1
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: the _mm512_undefined_* idiom
#endif

namespace mantis {

// The portable loops: the scalar definitions, element by element.
void cr_expf_array_portable(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = cr_expf(x[i]);
}

void cr_erff_array_portable(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = cr_erff(x[i]);
}

void cr_tanhf_array_portable(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = cr_tanhf(x[i]);
}

#if !defined(MANTIS_X86)

void cr_expf_array(const float* x, float* y, size_t n) { cr_expf_array_portable(x, y, n); }
void cr_erff_array(const float* x, float* y, size_t n) { cr_erff_array_portable(x, y, n); }
void cr_tanhf_array(const float* x, float* y, size_t n) { cr_tanhf_array_portable(x, y, n); }

#else

namespace {

#define AVX [[MANTIS_AVX512_TARGET, gnu::always_inline]] inline

using namespace crmath;

// crmath::round_checked on 8 lanes (y ≥ 0): RN(y) and the lanes near a boundary.
AVX __m256 round_checked8(__m512d y, __mmask8& hard) {
  const __m256 f = _mm512_cvtpd_ps(y);  // RN (MXCSR's default mode)
  const __m512d fd = _mm512_cvtps_pd(f);
  const __m256i b = _mm256_castps_si256(f), one = _mm256_set1_epi32(1);
  const __mmask8 up = _mm512_cmp_pd_mask(y, fd, _CMP_GE_OQ);
  const __m256i gb = _mm256_mask_add_epi32(_mm256_sub_epi32(b, one), up, b, one);
  const __m512d g = _mm512_cvtps_pd(_mm256_castsi256_ps(gb));
  const __m512d inf = _mm512_set1_pd(INFINITY), top = _mm512_set1_pd(0x1p128);
  const __m512d fm = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(fd, inf, _CMP_EQ_OQ), fd, top);
  const __m512d gm = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(g, inf, _CMP_EQ_OQ), g, top);
  const __m512d m = _mm512_mul_pd(_mm512_add_pd(fm, gm), _mm512_set1_pd(0.5));
  const __m512d d = _mm512_abs_pd(_mm512_sub_pd(y, m));
  hard = _mm512_cmp_pd_mask(d, _mm512_mul_pd(y, _mm512_set1_pd(kHardWidth)), _CMP_LE_OQ);
  return f;
}

// RN(y) (y ≥ 0) and a superset of round_checked's hard lanes, cheaper: where y ≥ 2^−126 (RN(y) a
// binary32 normal, or inf) the low 29 significand bits of y are its offset in the binary32
// quantum, 2^28 the midpoint, and 2^−45·y < 2^8 binary64 ulps; below, round_checked8. A lane
// flagged needlessly only costs its exception lookup.
AVX __m256 round_flagged8(__m512d y, __mmask8& hard) {
  const __m512i low = _mm512_and_si512(_mm512_castpd_si512(y), _mm512_set1_epi64(0x1fffffff));
  const __m512i off = _mm512_abs_epi64(_mm512_sub_epi64(low, _mm512_set1_epi64(0x10000000)));
  hard = _mm512_cmple_epi64_mask(off, _mm512_set1_epi64(256));
  const __mmask8 tiny = _mm512_cmp_pd_mask(y, _mm512_set1_pd(0x1p-126), _CMP_LT_OQ);
  if (tiny) {
    __mmask8 h;
    round_checked8(y, h);
    hard = (hard & ~tiny) | (h & tiny);
  }
  return _mm512_cvtpd_ps(y);
}

struct ExpTables {
  __m512d t0, t1, c[kExpDegree + 1];
};

AVX ExpTables exp_tables() {
  ExpTables t;
  t.t0 = _mm512_loadu_pd(kExpT);
  t.t1 = _mm512_loadu_pd(kExpT + 8);
  for (int n = 0; n <= kExpDegree; ++n) t.c[n] = _mm512_set1_pd(kExpPoly[n]);
  return t;
}

// crmath::exp_eval on 8 lanes. z's bit pattern is 1.5·2^52 + k, so its low 4 bits are k mod 16
// (the table index), and s·2^⌊k/16⌋ is scalef(s, kd/16) (exact: no rounding, normal results).
AVX __m512d exp_eval8(const ExpTables& tb, __m512d x) {
  const __m512d split = _mm512_set1_pd(kRoundSplit);
  const __m512d z = _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(kExpInvLn2_16)), split);
  const __m512d kd = _mm512_sub_pd(z, split);
  __m512d r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(kExpLn2_16Hi), x);  // fma(−kd, hi, x)
  r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(kExpLn2_16Lo), r);
  __m512d p = tb.c[kExpDegree];
  for (int n = kExpDegree - 1; n >= 0; --n) p = _mm512_fmadd_pd(p, r, tb.c[n]);
  const __m512d s = _mm512_mul_pd(_mm512_permutex2var_pd(tb.t0, _mm512_castpd_si512(z), tb.t1), p);
  return _mm512_scalef_pd(s, _mm512_mul_pd(kd, _mm512_set1_pd(0.0625)));
}

struct ErfTables {
  __m512d lo[kErfDegree + 1], hi[kErfDegree + 1], c_lo, c_hi;  // c: the pieces' centres (2j+1)/8
};

AVX ErfTables erf_tables() {
  ErfTables t;
  for (int n = 0; n <= kErfDegree; ++n) t.lo[n] = _mm512_loadu_pd(kErfPoly[n]), t.hi[n] = _mm512_loadu_pd(kErfPoly[n] + 8);
  alignas(64) double c[16];
  for (int j = 0; j < 16; ++j) c[j] = double(2 * j + 1) * 0.125;
  t.c_lo = _mm512_load_pd(c), t.c_hi = _mm512_load_pd(c + 8);
  return t;
}

// crmath::erf_eval on 8 lanes (0 ≤ a < 4).
AVX __m512d erf_eval8(const ErfTables& tb, __m512d a) {
  const __m512i j = _mm512_cvttpd_epi64(_mm512_mul_pd(a, _mm512_set1_pd(4.0)));
  const __mmask8 j0 = _mm512_cmpeq_epi64_mask(j, _mm512_setzero_si512());
  const __m512d c = _mm512_permutex2var_pd(tb.c_lo, j, tb.c_hi);
  const __m512d t = _mm512_mask_blend_pd(j0, _mm512_sub_pd(a, c), _mm512_mul_pd(a, a));
  __m512d p = _mm512_permutex2var_pd(tb.lo[kErfDegree], j, tb.hi[kErfDegree]);
  for (int n = kErfDegree - 1; n >= 0; --n) p = _mm512_fmadd_pd(p, t, _mm512_permutex2var_pd(tb.lo[n], j, tb.hi[n]));
  return _mm512_mask_blend_pd(j0, p, _mm512_mul_pd(a, p));
}

AVX __m512d lo_half(__m512 x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
AVX __m512d hi_half(__m512 x) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))); }
AVX __m512 join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

// The lanes of v flagged `hard` by the scalar function (its exception lookup); y may alias the
// input, so the inputs come from v.
AVX void finish(__m512 v, unsigned hard, float* y, float (*f)(float)) {
  if (!hard) return;
  alignas(64) float in[16];
  _mm512_store_ps(in, v);
  for (; hard; hard &= hard - 1) {
    const unsigned k = unsigned(__builtin_ctz(hard));
    y[k] = f(in[k]);
  }
}

[[MANTIS_AVX512_TARGET]] void expf_avx512(const float* x, float* y, size_t n) {
  const ExpTables tb = exp_tables();
  const __m512 lo = _mm512_set1_ps(-110.0f), hi = _mm512_set1_ps(90.0f);
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(kQuietNaN)));
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    const __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512 vc = _mm512_max_ps(_mm512_min_ps(v, hi), lo);  // the scalar clamp (NaN lanes: replaced)
    __mmask8 h0, h1;
    const __m256 f0 = round_flagged8(exp_eval8(tb, lo_half(vc)), h0);
    const __m256 f1 = round_flagged8(exp_eval8(tb, hi_half(vc)), h1);
    const __m512 f = _mm512_mask_blend_ps(isnan, join(f0, f1), nan);
    _mm512_mask_storeu_ps(y + i, live, f);
    finish(v, (unsigned(h0) | unsigned(h1) << 8) & ~unsigned(isnan) & live, y + i, cr_expf);
  }
}

// erf and tanh on 16 lanes (crmath::odd_to_one): `eval` (an 8-lane evaluation on 0 ≤ a < limit)
// on |x|, 1 from `limit` on, the sign put back; lanes near a rounding boundary go to `scalar`.
template <class Eval8>
AVX void odd_to_one16(const float* x, float* y, size_t n, float limit, const Eval8& eval, float (*scalar)(float)) {
  const __m512 lim = _mm512_set1_ps(limit);
  const __m512 below = _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(to_bits(limit) - 1)));  // the largest float < limit
  const __m512i sign_bit = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(kQuietNaN)));
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    const __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), sign_bit);
    const __m512 a = _mm512_abs_ps(v);
    const __mmask16 big = _mm512_cmp_ps_mask(a, lim, _CMP_GE_OQ);
    const __m512 ac = _mm512_min_ps(a, below);  // the evaluation's domain (big lanes: replaced)
    __mmask8 h0, h1;
    const __m256 f0 = round_flagged8(eval(lo_half(ac)), h0);
    const __m256 f1 = round_flagged8(eval(hi_half(ac)), h1);
    __m512 f = _mm512_mask_blend_ps(big, join(f0, f1), _mm512_set1_ps(1.0f));
    f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
    f = _mm512_mask_blend_ps(isnan, f, nan);
    _mm512_mask_storeu_ps(y + i, live, f);
    finish(v, (unsigned(h0) | unsigned(h1) << 8) & ~unsigned(isnan | big) & live, y + i, scalar);
  }
}

struct ErfEval8 {
  ErfTables tb;
  AVX __m512d operator()(__m512d a) const { return erf_eval8(tb, a); }
};

[[MANTIS_AVX512_TARGET]] void erff_avx512(const float* x, float* y, size_t n) {
  odd_to_one16(x, y, n, 4.0f, ErfEval8{erf_tables()}, cr_erff);
}

// crmath::tanh_eval on 8 lanes (0 ≤ a < 9.5): both branches, blended.
AVX __m512d tanh_eval8(const ExpTables& tb, const __m512d* tc, __m512d a) {
  const __m512d u = _mm512_mul_pd(a, a);
  __m512d p = tc[kTanhDegree];
  for (int n = kTanhDegree - 1; n >= 0; --n) p = _mm512_fmadd_pd(p, u, tc[n]);
  const __m512d small = _mm512_mul_pd(a, p);
  const __m512d e = exp_eval8(tb, _mm512_add_pd(a, a));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d big = _mm512_div_pd(_mm512_sub_pd(e, one), _mm512_add_pd(e, one));
  return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, _mm512_set1_pd(0.25), _CMP_LT_OQ), big, small);
}

struct TanhEval8 {
  ExpTables tb;
  __m512d tc[kTanhDegree + 1];
  AVX __m512d operator()(__m512d a) const { return tanh_eval8(tb, tc, a); }
};

[[MANTIS_AVX512_TARGET]] void tanhf_avx512(const float* x, float* y, size_t n) {
  TanhEval8 eval{exp_tables(), {}};
  for (int k = 0; k <= kTanhDegree; ++k) eval.tc[k] = _mm512_set1_pd(kTanhPoly[k]);
  odd_to_one16(x, y, n, 9.5f, eval, cr_tanhf);
}

}  // namespace

void cr_tanhf_array(const float* x, float* y, size_t n) {
  if (cpu_has_avx512()) tanhf_avx512(x, y, n);
  else cr_tanhf_array_portable(x, y, n);
}

void cr_expf_array(const float* x, float* y, size_t n) {
  if (cpu_has_avx512()) expf_avx512(x, y, n);
  else cr_expf_array_portable(x, y, n);
}

void cr_erff_array(const float* x, float* y, size_t n) {
  if (cpu_has_avx512()) erff_avx512(x, y, n);
  else cr_erff_array_portable(x, y, n);
}

#endif

}  // namespace mantis
